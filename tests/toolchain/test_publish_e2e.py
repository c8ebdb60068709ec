"""Ship what was tested, end to end, with the real halo:cpu and a real registry.

build → stage by digest → a test step pulls that digest and runs the cpu tier in it →
promote that digest → both tags serve it; the same inputs staged again are "already
published"; a forged label under the immutable tag is refused. Then `make train`
trains in the image, through the same docker flags as the tiers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from publish_support import Namespace, namespace, push_by_digest, small_image
from support import REPO, docker_or_skip, halo

from halo.images.catalog import load_catalog
from halo.images.docker import Docker
from halo.images.publish import INPUT_LABEL, local_image_for_inputs
from halo.paths import scratch_root
from halo.registry.client import Registry
from halo.registry.refs import parse_ref, repo_under
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


# halo:cpu staged, the cpu tier in the staged digest, promoted, pushed, verified anonymously.
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

    # The test job: pull that digest and run the cpu tier inside it (its configuration tests
    # here: the whole tier runs on the staged digest in CI's test-cpu job and in `nox -s ci`).
    tier = halo("test", "cpu", "--image", staged, "--", "-k", "test_config", cwd=REPO)
    try:
        assert tier.returncode == 0, tier.stdout[-3000:] + tier.stderr[-2000:]
        assert staged in tier.stdout, "the tier ran in the staged digest"
        counts = read_junit(scratch_root() / "reports" / "cpu.xml")
        assert counts and counts.passed > 0 and counts.failures == counts.errors == 0
        assert docker.image_id(staged) == local_id
    finally:
        docker.remove(staged)

    first = halo("image", "promote", "cpu", "--from", staged, "--registry", release, cwd=REPO)
    assert first.returncode == 0, first.stderr[-2000:]
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
    pushed = halo("image", "push", "cpu", "--registry", pushed_to, "--verify-public", cwd=REPO)
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    assert _tag_digest(pushed_to, "cpu") == _tag_digest(pushed_to, immutable) is not None
    assert _config_digest(pushed_to, "cpu") == _config_digest(release, "cpu") == local_id
    assert pushed.stdout.count("pulls anonymously") == 2

    # The same inputs staged again (a rebuild from scratch gives the same image ID: the
    # second engine's `halo image verify` in test_build_docker proves it, with the run's one
    # cold build): promote finds the release already published and moves nothing.
    assert local_image_for_inputs(REPO, CPU)[0] == local_ref
    again = _stage(ns, staging, tmp_path)
    second = halo("image", "promote", "cpu", "--from", again, "--registry", release, cwd=REPO)
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
        "image", "promote", "cpu", "--from", staged, "--registry", squat_registry, cwd=REPO
    )
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("halo: error: ")]
    assert len(errors) == 1 and errors[0].endswith("an immutable tag is never moved"), (
        refused.stderr
    )
    assert _tag_digest(squat_registry, immutable) == manifest.digest
    assert _tag_digest(squat_registry, "cpu") is None


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
