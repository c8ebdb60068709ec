"""Publishing by digest against a real OCI registry (Debian's docker-registry, started by .ci/run).

Small images made for each test (a few bytes each) stand in for halo's; the end-to-end test
with the real halo:cpu is test_publish_e2e.py. Each staged digest carries a passing cpu-tier
attestation signed by a throwaway trusted key (what promote requires; test_attest_promote.py
tests that gate), so these tests are about publishing itself.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from attest_support import TestKey, sign_passing
from publish_support import Namespace, namespace, push_by_digest, small_image
from support import REPO, docker_or_skip, halo

from halo.errors import HaloError
from halo.images.catalog import load_catalog
from halo.images.docker import Docker
from halo.images.publish import INPUT_LABEL, promote, verify_public
from halo.registry.auth import docker_credentials
from halo.registry.client import Registry
from halo.registry.refs import parse_ref, repo_under
from halo.testing.attest_store import fallback_tag

pytestmark = pytest.mark.docker

CPU = load_catalog(REPO).image("cpu")
FILES = {"etc/halo/build.json": b'{"image": "cpu"}\n', "opt/halo/app.py": b"print('hi')\n"}


@pytest.fixture
def ns() -> Iterator[Namespace]:
    yield from namespace()


@pytest.fixture(scope="module")
def ci_key(tmp_path_factory: pytest.TempPathFactory) -> TestKey:
    return TestKey.make(tmp_path_factory.mktemp("keys"))


@pytest.fixture(autouse=True)
def trusted(ci_key: TestKey, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> TestKey:
    """Promote trusts the throwaway key; results recorded here stay in this test's store."""
    for name, value in {**ci_key.env(), "HALO_STORE": str(tmp_path / "store")}.items():
        monkeypatch.setenv(name, value)
    return ci_key


@pytest.fixture(scope="module")
def docker() -> Docker:
    return docker_or_skip()


@pytest.fixture
def images(docker: Docker) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for ref in made:
        docker.remove(ref)


def _make(
    docker: Docker, made: list[str], files: dict[str, bytes], mtime: int, input_hash: str
) -> str:
    ref = f"ship-test/small-{uuid.uuid4().hex[:8]}:one"
    small_image(
        docker.exe,
        ref,
        files,
        mtime,
        {INPUT_LABEL: input_hash, "org.opencontainers.image.revision": str(mtime)},
    )
    made.append(ref)
    return ref


def _stage(
    ns: Namespace, docker: Docker, ref: str, registry: str | None = None, attest: bool = True
) -> str:
    """Push a local image by digest, as `halo image stage` does, with its passing cpu tier
    attached (as the test job's `halo test cpu --image REPO@sha256:…` does); REPO@sha256:…."""
    registry = registry or ns.registry("staging")
    manifest = push_by_digest(docker.exe, ref, str(docker.image_id(ref)), registry, CPU.publish)
    staged = ns.remember(repo_under(registry, CPU.publish).ref(manifest.digest))
    if attest:
        sign_passing(staged, TestKey.from_env())
    return staged


def _tags(registry: str) -> list[str]:
    repo = repo_under(registry, CPU.publish)
    with Registry(repo.host).request("GET", f"{repo.base_url}/tags/list", []) as resp:
        return sorted(json.load(resp).get("tags") or [])


def _served(registry: str, tag: str) -> str | None:
    repo = repo_under(registry, CPU.publish)
    manifest = Registry(repo.host).get_manifest(repo, tag)
    return manifest.digest if manifest else None


def test_stage_pushes_by_digest_and_promote_tags_that_digest(
    ns: Namespace, docker: Docker, images: list[str]
) -> None:
    input_hash = secrets.token_hex(32)
    local = _make(docker, images, FILES, 1_700_000_000, input_hash)
    staged = _stage(ns, docker, local)
    digest = parse_ref(staged).digest
    ns.track(ns.registry("staging"), "halo")
    # Staging holds no tag of the image; the one tag there is its attestations' index (the OCI
    # referrers tag schema: Debian's registry has no referrers API).
    assert _tags(ns.registry("staging")) == [fallback_tag(str(digest))]

    release = ns.registry("rel")
    ns.track(release, "halo")
    done = promote(CPU, staged, release, lambda _: None)
    assert (done.state, done.moving_updated, done.digest) == ("published", True, digest)
    assert _served(release, "cpu") == digest
    assert _served(release, f"cpu-{input_hash[:12]}") == digest
    # What docker pulls is the image that was built: same config, so same image ID.
    pulled = f"{release}/halo:cpu"
    docker.pull(pulled)
    images.append(pulled)
    assert docker.image_id(pulled) == docker.image_id(local)

    again = promote(CPU, staged, release, lambda _: None)
    assert (again.state, again.moving_updated) == ("already published", False)


def test_a_rebuild_of_the_same_inputs_is_already_published_and_the_moving_tag_follows(
    ns: Namespace, docker: Docker, images: list[str]
) -> None:
    input_hash = secrets.token_hex(32)
    first = _stage(ns, docker, _make(docker, images, FILES, 1_700_000_000, input_hash))
    release = ns.registry("rel")
    ns.track(release, "halo")
    promote(CPU, first, release, lambda _: None)
    # The moving tag went elsewhere meanwhile (another image was published under it).
    other = _stage(ns, docker, _make(docker, images, {"x": b"other"}, 1, secrets.token_hex(32)))
    promote(CPU, other, release, lambda _: None)
    assert _served(release, "cpu") == parse_ref(other).digest

    # Same files, other mtimes and creation time: other diff_ids, other image ID, other digest.
    rebuilt_ref = _make(docker, images, FILES, 1_800_000_000, input_hash)
    rebuilt = _stage(ns, docker, rebuilt_ref)
    assert parse_ref(rebuilt).digest != parse_ref(first).digest
    lines: list[str] = []
    done = promote(CPU, rebuilt, release, lines.append)
    assert done.state == "already published"
    assert done.digest == parse_ref(first).digest, "the immutable tag keeps what it had"
    assert done.moving_updated and _served(release, "cpu") == parse_ref(first).digest
    assert any("comparing the files" in line for line in lines), "diff_ids differed"


def test_a_forged_label_under_the_immutable_tag_is_refused(
    ns: Namespace, docker: Docker, images: list[str]
) -> None:
    input_hash = secrets.token_hex(32)
    release = ns.registry("rel")
    path = ns.track(release, "halo")
    # Someone else's image, labelled with our input hash, sits under our immutable tag.
    forged = dict(FILES, **{"opt/halo/app.py": b"import os; os.system('steal')\n"})
    squat = _stage(
        ns, docker, _make(docker, images, forged, 1_700_000_000, input_hash), release, False
    )
    repo = repo_under(release, "halo")
    reg = Registry(repo.host)
    reg.put_manifest(
        repo, f"cpu-{input_hash[:12]}", reg.get_manifest(repo, parse_ref(squat).digest)
    )  # type: ignore[arg-type]

    ours = _stage(ns, docker, _make(docker, images, FILES, 1_700_000_000, input_hash))
    proc = halo("image", "promote", "cpu", "--from", ours, "--registry", release, cwd=REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # Progress goes to stderr too; the error is one line, the last.
    errors = [line for line in proc.stderr.splitlines() if line.startswith("halo: error: ")]
    assert len(errors) == 1 and proc.stderr.strip().endswith(errors[0]), proc.stderr
    assert "other files in layer 0 under the same input-hash label" in errors[0]
    assert errors[0].endswith("an immutable tag is never moved")
    assert _served(release, f"cpu-{input_hash[:12]}") == parse_ref(squat).digest
    assert _served(release, "cpu") is None, "the moving tag was not touched"
    assert ns.digests(path) == {parse_ref(squat).digest}


def test_promote_copies_between_registries_and_verify_public_pulls_anonymously(
    ns: Namespace, docker: Docker, images: list[str], tmp_path: Path
) -> None:
    input_hash = secrets.token_hex(32)
    staged = _stage(ns, docker, _make(docker, images, FILES, 1_700_000_000, input_hash))
    # Another host name for the same registry: no cross-repository mount, a real copy.
    release = ns.registry("public").replace("127.0.0.1", "localhost")
    ns.track(ns.registry("public"), "halo")
    lines: list[str] = []
    done = promote(CPU, staged, release, lines.append)
    assert done.state == "published"
    assert sum("copying" in line for line in lines) == 2  # the config and the layer
    env = {"DOCKER_CONFIG": str(tmp_path)}  # no credentials anywhere
    proc = halo("image", "verify-public", "cpu", "--registry", release, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("pulls anonymously") == 2
    assert parse_ref(staged).digest[:19] in proc.stdout  # type: ignore[index]
    checks = verify_public(CPU, release)
    assert {c.ref.rsplit(":", 1)[1] for c in checks} == {"cpu", f"cpu-{input_hash[:12]}"}

    missing = halo("image", "verify-public", "cpu", "--registry", ns.registry("nothing"), cwd=REPO)
    assert missing.returncode == 2
    assert missing.stderr.strip().endswith("halo:cpu: not found by an anonymous pull")


def test_promote_wants_a_digest_and_a_halo_image(
    ns: Namespace, docker: Docker, images: list[str]
) -> None:
    by_tag = halo(
        "image",
        "promote",
        "cpu",
        "--from",
        f"{ns.registry('staging')}/halo:cpu",
        "--registry",
        ns.registry("rel"),
        cwd=REPO,
    )
    assert by_tag.returncode == 2
    assert "promote takes a reference pinned by digest" in by_tag.stderr
    unlabelled = _stage(ns, docker, _make(docker, images, FILES, 1, "not-a-hash"))
    with pytest.raises(HaloError, match=r"has no io\.halo\.input-hash label"):
        promote(CPU, unlabelled, ns.registry("rel"), lambda _: None)


def test_ecr_public_login_goes_through_the_aws_cli_and_docker_keeps_the_password(
    tmp_path: Path, docker: Docker
) -> None:
    address = os.environ.get("HALO_TEST_REGISTRY") or pytest.skip("needs HALO_TEST_REGISTRY")
    password = secrets.token_urlsafe(24)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # AWS cannot exist here: its CLI is the one thing faked, at the boundary it is called through.
    aws = bin_dir / "aws"
    aws.write_text(
        "#!/bin/sh\n"
        '[ "$*" = "ecr-public get-login-password --region us-east-1" ] || { echo "bad args: $*" >&2; exit 3; }\n'
        f"echo {password}\n"
    )
    aws.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "DOCKER_CONFIG": str(tmp_path / "docker")}
    proc = halo("image", "ecr-public-login", "--registry", f"{address}/alias", cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    assert password not in proc.stdout + proc.stderr
    config = json.loads((tmp_path / "docker" / "config.json").read_text())
    assert base64.b64decode(config["auths"][address]["auth"]).decode() == f"AWS:{password}"
    os.environ["DOCKER_CONFIG"], saved = str(tmp_path / "docker"), os.environ.get("DOCKER_CONFIG")
    try:
        creds = docker_credentials(address)
    finally:
        if saved is None:
            del os.environ["DOCKER_CONFIG"]
        else:
            os.environ["DOCKER_CONFIG"] = saved
    assert creds is not None and (creds.username, creds.secret) == ("AWS", password)

    aws.write_text("#!/bin/sh\necho 'Unable to locate credentials' >&2\nexit 255\n")
    failed = halo("image", "ecr-public-login", "--registry", f"{address}/alias", cwd=REPO, env=env)
    assert failed.returncode == 2
    assert failed.stderr.strip() == (
        "halo: error: aws ecr-public get-login-password --region us-east-1: failed: "
        "Unable to locate credentials"
    )


def test_push_without_a_registry_is_one_line() -> None:
    proc = halo("image", "push", "cpu", cwd=REPO, env={"HALO_REGISTRY": ""})
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "halo: error: halo image: no registry; pass --registry HOST[/ALIAS] or set HALO_REGISTRY"
    )
