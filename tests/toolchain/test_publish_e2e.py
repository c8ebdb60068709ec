"""Ship what was tested, end to end, with the real halo:cpu and a real registry.

build → stage by digest → promote refuses it, untested → a test step pulls that digest and
runs the cpu tier in it (a signed attestation, attached to the staged digest; the same inputs
again run nothing) → promote that digest → both tags serve it; the same inputs staged again are
"already published"; a forged label under the immutable tag is refused; a tampered attestation
or one signed by an unknown key is refused. Then `make train` trains in the image, through the
same docker flags as the tiers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from attest_support import TestKey, tamper
from publish_support import Namespace, namespace, push_by_digest, small_image
from support import COPY_IGNORE, REPO, docker_or_skip, halo

from halo.images.catalog import load_catalog
from halo.images.docker import Docker
from halo.images.publish import INPUT_LABEL, local_image_for_inputs
from halo.registry.client import Registry
from halo.registry.refs import parse_ref, repo_under
from halo.registry.transfer import copy_image
from halo.testing.attest import checkout_tests_hash, envelope, read
from halo.testing.attest_store import attach, referrers
from halo.testing.tiers import read_junit

pytestmark = pytest.mark.docker
CPU = load_catalog(REPO).image("cpu")


@pytest.fixture(scope="module")
def docker() -> Docker:
    docker = docker_or_skip()
    built = halo("image", "build", "cpu", cwd=REPO)
    assert built.returncode == 0, built.stderr[-2000:]
    return docker


@pytest.fixture
def ns() -> Iterator[Namespace]:
    yield from namespace()


def _tag_digest(registry: str, tag: str) -> str | None:
    repo = repo_under(registry, "halo")
    manifest = Registry(repo.host).get_manifest(repo, tag)
    return manifest.digest if manifest else None


def _config_digest(registry: str, tag: str) -> str:
    repo = repo_under(registry, "halo")
    manifest = Registry(repo.host).get_manifest(repo, tag)
    assert manifest is not None
    return str(manifest.json["config"]["digest"])


def _stage(ns: Namespace, staging: str, tmp_path: Path) -> str:
    out = tmp_path / "github-output"
    out.unlink(missing_ok=True)
    proc = halo(
        "image", "stage", "cpu", "--registry", staging, cwd=REPO, env={"GITHUB_OUTPUT": str(out)}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    key, _, ref = out.read_text().strip().partition("=")
    assert key == "ref" and f"staged {ref}" in proc.stdout
    return ns.remember(ref)


TINY_TIER = """import pytest


@pytest.mark.cpu
def test_tiny():
    assert sum([1, 1]) == 2
"""


def _tiny_checkout(tmp_path: Path) -> Path:
    """A copy of the checkout whose cpu tier is one small passing test (seconds, not minutes)."""
    tiny = tmp_path / "tiny"
    shutil.copytree(REPO, tiny, ignore=COPY_IGNORE)
    for test in (tiny / "tests" / "cpu").glob("test_*.py"):
        test.unlink()
    (tiny / "tests" / "cpu" / "test_tiny.py").write_text(TINY_TIER)
    return tiny


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("halo: error: ")]
    assert len(errors) == 1 and proc.stderr.strip().endswith(errors[0]), proc.stderr
    return errors[0]


# halo:cpu staged, refused untested, the cpu tier in the staged digest, promoted, pushed,
# verified anonymously; tampered results refused.
@pytest.mark.timeout(3600)
@pytest.mark.xdist_group("stage-halo-cpu")  # see test_no_secret: one compression of the stack
def test_build_once_test_that_digest_publish_that_digest(
    ns: Namespace, docker: Docker, tmp_path: Path
) -> None:
    staging, release = ns.registry("staging"), ns.registry("release")
    ns.track(release, "halo")
    # The image built for this checkout's inputs (others on this machine move halo:cpu too).
    local_ref, local_id = local_image_for_inputs(REPO, CPU)
    input_hash = docker.inspect(local_ref, f'{{{{index .Config.Labels "{INPUT_LABEL}"}}}}')
    immutable = f"cpu-{input_hash[:12]}"

    staged = _stage(ns, staging, tmp_path)
    digest = parse_ref(staged).digest
    assert _tag_digest(staging, "cpu") is None, "staging is by digest, no tag"

    # CI's throwaway key signs the results and promote trusts it. The tier runs from a copy of
    # the checkout whose cpu tier is one small test; promote checks the results against the
    # tests of the checkout it runs in, so it runs there too.
    key = TestKey.make(tmp_path / "keys", "ci")
    env = {**key.env(), "HALO_SCRATCH": str(tmp_path / "scratch")}
    tiny = _tiny_checkout(tmp_path)
    untested = halo(
        "image", "promote", "cpu", "--from", staged, "--registry", release, cwd=tiny, env=env
    )
    assert "not promoted: no valid passing attestation for tier cpu" in _one_error(untested)
    assert _tag_digest(release, "cpu") is None, "nothing published"

    # The test job: pull that digest and run the cpu tier inside it (the whole tier runs on the
    # staged digest in CI's test-cpu job); its result is recorded, signed, and attached there.
    report = tmp_path / "scratch" / "reports" / "cpu.xml"
    tier = halo("test", "cpu", "--image", staged, cwd=tiny, env=env)
    try:
        assert tier.returncode == 0, tier.stdout[-3000:] + tier.stderr[-2000:]
        assert staged in tier.stdout, "the tier ran in the staged digest"
        counts = read_junit(report)
        assert counts and counts.passed == 1 and counts.failures == counts.errors == 0
        assert f"tier cpu: PASSED recorded for {local_id[:19]}, signed by key" in tier.stderr
        assert f"attestation attached to {staged} (new)" in tier.stderr
        assert docker.image_id(staged) == local_id

        # The same digest, tests and arguments: the recorded pass is the result; nothing runs.
        report.unlink()
        cached = halo("test", "cpu", "--image", staged, cwd=tiny, env=env)
        assert cached.returncode == 0, cached.stderr[-2000:]
        assert cached.stdout.startswith("tier cpu: passed at ") and "same inputs" in cached.stdout
        assert f"image {local_id[:19]}" in cached.stdout and not report.exists()
        # --rerun runs it; so does a change to one test file (other inputs).
        rerun = halo("test", "cpu", "--image", staged, "--rerun", cwd=tiny, env=env)
        assert rerun.returncode == 0 and report.is_file(), rerun.stderr[-2000:]
        report.unlink()
        test_file = tiny / "tests" / "cpu" / "test_tiny.py"
        test_file.write_text(TINY_TIER + "\n\ndef test_other():\n    pass\n")
        changed = halo("test", "cpu", "--image", staged, cwd=tiny, env=env)
        assert changed.returncode == 0 and report.is_file(), changed.stderr[-2000:]
        assert "same inputs" not in changed.stdout and "PASSED recorded" in changed.stderr
    finally:
        docker.remove(staged)

    first = halo(
        "image", "promote", "cpu", "--from", staged, "--registry", release, cwd=tiny, env=env
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert "tier cpu: passed at" in first.stderr
    assert "published" in first.stdout and "already" not in first.stdout
    assert _tag_digest(release, "cpu") == digest
    assert _tag_digest(release, immutable) == digest
    public = halo("image", "verify-public", "cpu", "--registry", release, cwd=REPO)
    assert public.returncode == 0 and public.stdout.count("pulls anonymously") == 2, public.stderr

    # From a workstation, `halo image push` is the same: by digest (the same image: its
    # config is the staged one; the manifest's revision annotation is HEAD's), then both
    # tags, then the anonymous check.
    pushed_to = ns.registry("pushed")
    ns.track(pushed_to, "halo")
    pushed = halo(
        "image", "push", "cpu", "--registry", pushed_to, "--verify-public", cwd=tiny, env=env
    )
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    assert _tag_digest(pushed_to, "cpu") == _tag_digest(pushed_to, immutable) is not None
    assert _config_digest(pushed_to, "cpu") == _config_digest(release, "cpu") == local_id
    assert pushed.stdout.count("pulls anonymously") == 2

    # The same inputs staged again (a rebuild from scratch gives the same image ID: the
    # second engine's `halo image verify` in test_build_docker proves it, with the run's one
    # cold build): promote finds the release already published and moves nothing.
    assert local_image_for_inputs(REPO, CPU)[0] == local_ref
    again = _stage(ns, staging, tmp_path)
    second = halo(
        "image", "promote", "cpu", "--from", again, "--registry", release, cwd=tiny, env=env
    )
    assert second.returncode == 0, second.stderr[-2000:]
    assert "already published" in second.stdout
    assert _tag_digest(release, "cpu") == digest and _tag_digest(release, immutable) == digest

    # Someone else's image under the immutable tag, with our input hash as its label.
    squat_registry = ns.registry("squat")
    ns.track(squat_registry, "halo")
    forged = "ship-test/forged:cpu"
    small_image(docker.exe, forged, {"opt/halo/x": b"not halo"}, 0, {INPUT_LABEL: input_hash})
    try:
        repo = repo_under(squat_registry, "halo")
        manifest = push_by_digest(docker.exe, forged, str(docker.image_id(forged)), squat_registry)
        Registry(repo.host).put_manifest(repo, immutable, manifest)
    finally:
        docker.remove(forged)
    refused = halo(
        "image",
        "promote",
        "cpu",
        "--from",
        staged,
        "--registry",
        squat_registry,
        cwd=tiny,
        env=env,
    )
    assert _one_error(refused).endswith("an immutable tag is never moved")
    assert _tag_digest(squat_registry, immutable) == manifest.digest
    assert _tag_digest(squat_registry, "cpu") is None

    # The tier's real attestation, tampered with (it claims the checkout's real tests passed)
    # or signed again by a key nobody trusts, is all the image has in another staging
    # repository (no upload: the registry mounts the blobs) and here (an empty store): refused.
    src = parse_ref(staged)
    registry = Registry(src.repo.host)
    now = checkout_tests_hash(tiny)
    real = next(  # the first run's: for the tests before the change
        e
        for e in referrers(registry, src.repo, str(digest))
        if key.keys.keyid in read(e).keyids and read(e).statement.inputs.tests != now  # type: ignore[union-attr]
    )
    stranger = TestKey.make(tmp_path / "keys", "stranger")
    forged = {
        "its signature does not verify": tamper(
            real,
            lambda p: p["predicate"]["configuration"][2]["digest"].update(sha256=now),
        ),
        "signed by an unknown key": envelope(read(real).statement, stranger.signer),  # type: ignore[arg-type]
    }
    staged_manifest = registry.get_manifest(src.repo, str(digest))
    assert staged_manifest is not None
    for i, (why, data) in enumerate(forged.items()):
        other = repo_under(ns.registry(f"tampered{i}"), "halo")
        copy_image(registry, src.repo, registry, other, staged_manifest, lambda _: None)
        attach(registry, other, staged_manifest, [read(data)])
        moved = halo(
            "image",
            "promote",
            "cpu",
            "--from",
            ns.remember(other.ref(str(digest))),
            "--registry",
            ns.registry(f"rel{i}"),
            cwd=tiny,
            env={**env, "HALO_STORE": str(tmp_path / f"empty-store{i}")},
        )
        assert why in _one_error(moved)
        assert _tag_digest(ns.registry(f"rel{i}"), "cpu") is None


def test_make_train_trains_in_the_image_with_the_shared_flags(
    docker: Docker, tmp_path: Path
) -> None:
    if shutil.which("make") is None:
        pytest.skip("needs GNU make (.ci/run installs it)")
    scratch = tmp_path / "scratch"
    # Outputs under the scratch mount, so the test leaves nothing in the checkout.
    extra = (
        "--training.max_steps=2 --runtime.paths.checkpoints=/scratch/ckpt "
        "--runtime.paths.logs=/scratch/logs --checkpoint.resume=false"
    )
    argv = [
        "make",
        "-s",
        "train",
        "CONFIG=examples/sft/config.yaml",
        "IMAGE=halo:cpu",
        "NPROC=1",
        f"EXTRA={extra}",
    ]
    env = {**os.environ, "HALO_SCRATCH": str(scratch)}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "done: 2 steps" in proc.stdout
    assert list((scratch / "ckpt").glob("*/r*_epoch_0_step_2")), "the checkpoint is on the host"
