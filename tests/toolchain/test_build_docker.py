"""Real BuildKit builds of halo:cpu (needs a Docker engine; skipped with the reason without one)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO, docker_or_skip, halo, linked_store

from halo.images.docker import Docker
from halo.paths import store_root
from halo.pins.lockfile import load_lock
from halo.store.store import Store

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def docker() -> Docker:
    return docker_or_skip()


@pytest.fixture(scope="module")
def cpu_built(docker: Docker) -> str:
    """halo:cpu from the real checkout: a no-op when CI's build-cpu ran first."""
    proc = halo("image", "build", "cpu", cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture
def test_repo(repo_copy: Path, docker: Docker) -> Iterator[Path]:
    """A checkout whose images are tagged halo-test:*, so halo:cpu is never moved by a test."""
    catalog = repo_copy / "images" / "images.yaml"
    catalog.write_text(catalog.read_text().replace("repository: halo\n", "repository: halo-test\n"))
    yield repo_copy
    for ref in docker.refs("halo-test"):
        docker.remove(ref)


def _touch_halo(repo: Path, text: str) -> None:
    init = repo / "halo" / "__init__.py"
    init.write_text(init.read_text() + f"# {text}\n")


def test_second_build_is_a_no_op(cpu_built: str) -> None:
    proc = halo("image", "build", "cpu", cwd=REPO)
    assert proc.returncode == 0
    assert "halo:cpu: up to date (input hash " in proc.stdout
    assert "docker build" not in proc.stderr


def test_changing_halo_rebuilds_only_the_last_layer(
    cpu_built: str, test_repo: Path, docker: Docker
) -> None:
    _touch_halo(test_repo, "layer test A")
    first = halo("image", "build", "cpu", cwd=test_repo)
    assert first.returncode == 0, first.stderr[-2000:]
    before = docker.layers("halo-test:cpu")
    _touch_halo(test_repo, "layer test B")
    second = halo("image", "build", "cpu", cwd=test_repo)
    assert second.returncode == 0, second.stderr[-2000:]
    after = docker.layers("halo-test:cpu")
    print("layers before:", *before, sep="\n  ")
    print("layers after:", *after, sep="\n  ")
    assert len(before) == len(after) >= 3
    assert before[:-1] == after[:-1], "only halo's layer may change"
    assert before[-1] != after[-1]


def test_a_flipped_byte_in_the_store_refuses_the_build_and_tags_nothing(
    cpu_built: str, test_repo: Path, docker: Docker, tmp_path: Path
) -> None:
    lock = load_lock(test_repo / "pins" / "pylock.cpu.toml")
    victim = lock.package("execnet").artifacts[0]  # type: ignore[union-attr]
    real, copy = Store(store_root()), linked_store(tmp_path / "store", lock.artifacts)
    tampered = copy.path(victim.sha256)
    data = bytearray(real.path(victim.sha256).read_bytes())
    data[len(data) // 2] ^= 0x01
    tampered.unlink()
    tampered.write_bytes(bytes(data))

    _touch_halo(test_repo, "tamper test")  # a new input hash: a real build, not a no-op
    images_before = docker.refs("halo-test")
    proc = halo("image", "build", "cpu", cwd=test_repo, env={"HALO_STORE": str(copy.root)})
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"halo: error: {victim.file}: store entry corrupted: expected sha256 {victim.sha256}, got "
    )
    assert docker.refs("halo-test") == images_before == []
    assert real.verify(victim.sha256, victim.file)  # the real store still holds the right bytes


def _sbom_is_the_locks(docker: Docker, input_hash: str) -> None:
    """The image's SBOM validates against the CycloneDX schema; one sha256 per component, the lock's."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    cat = [docker.exe, "run", "--rm", "--network", "none", "halo:cpu"]
    text = subprocess.run(
        [*cat, "cat", "/etc/halo/sbom.cdx.json"], capture_output=True, text=True, check=True
    ).stdout
    doc = json.loads(text)
    assert (
        JsonStrictValidator(SchemaVersion.from_version(doc["specVersion"])).validate_str(text)
        is None
    )
    assert {"name": "halo:input-hash", "value": input_hash} in doc["metadata"]["properties"]
    shas = {c["name"]: [h["content"] for h in c["hashes"]] for c in doc["components"]}
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    assert {n: s for n, s in shas.items() if n != "halo-posttrain"} == {
        p.name: [p.artifacts[0].sha256] for p in lock.packages
    }
    assert len(shas["halo-posttrain"]) == 1


def test_image_carries_build_record_labels_and_sbom(cpu_built: str, docker: Docker) -> None:
    run = subprocess.run(
        [
            docker.exe,
            "run",
            "--rm",
            "--network",
            "none",
            "halo:cpu",
            "python",
            "-c",
            "import json; b=json.load(open('/etc/halo/build.json')); s=json.load(open('/etc/halo/sbom.cdx.json'));"
            "print(b['input_hash'], len(b['patches']), s['bomFormat'], sorted(c['name'] for c in s['components'])[:200])",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    input_hash, n_patches, fmt, names = run.stdout.split(" ", 3)
    assert docker.inspect("halo:cpu", '{{index .Config.Labels "io.halo.input-hash"}}') == input_hash
    assert docker.image_id("halo:cpu") == docker.image_id(f"halo:cpu-{input_hash[:12]}")
    assert int(n_patches) >= 3 and fmt == "CycloneDX"
    assert "'torch'" in names and "'halo-posttrain'" in names
    _sbom_is_the_locks(docker, input_hash)
    find = subprocess.run(
        [
            docker.exe,
            "run",
            "--rm",
            "--network",
            "none",
            "halo:cpu",
            "find",
            "/opt/venv",
            "-name",
            "__pycache__",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert find.stdout.strip() == "", "no bytecode caches are shipped"


def test_an_artifact_missing_from_the_store_fails_the_build_naming_it(
    cpu_built: str, test_repo: Path, docker: Docker, tmp_path: Path
) -> None:
    lock = load_lock(test_repo / "pins" / "pylock.cpu.toml")
    missing = lock.package("iniconfig").artifacts[0]  # type: ignore[union-attr]
    copy = linked_store(tmp_path / "store", [a for a in lock.artifacts if a != missing])
    _touch_halo(test_repo, "missing artifact test")
    # No index and no substitutes: the build has nowhere to get it, and must say which it lacks.
    env = {
        "HALO_STORE": str(copy.root),
        "HALO_INDEX_URL": "http://127.0.0.1:9/simple/",
        "HALO_SUBSTITUTES": "",
        "PIP_FIND_LINKS": "",
        "UV_FIND_LINKS": "",
    }
    proc = halo("image", "build", "cpu", cwd=test_repo, env=env)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("halo: error: iniconfig: index unreachable") or missing.file in last, (
        last
    )
    assert "iniconfig" in last
    assert docker.refs("halo-test") == []


def test_the_build_command_is_offline(tmp_path: Path) -> None:
    from halo.images.docker import Builder, build_argv

    for builder in (Builder("docker", buildx=True), Builder("docker", buildx=False)):
        argv = build_argv(
            builder,
            tmp_path,
            tmp_path / "Dockerfile",
            ["halo:cpu"],
            {},
            {},
            "none",
            tmp_path / "iid",
        )
        assert argv[argv.index("--network") + 1] == "none"


def test_plan_predicts_the_built_input_hash(cpu_built: str, docker: Docker) -> None:
    proc = halo("image", "plan", "cpu", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("input hash: "))
    planned = line.split()[2]
    assert docker.inspect("halo:cpu", '{{index .Config.Labels "io.halo.input-hash"}}') == planned


def test_two_builds_of_one_input_hash_ship_the_same_bytes(
    cpu_built: str, test_repo: Path, docker: Docker
) -> None:
    """Same inputs, same outputs: two builds from scratch, compared file by file."""
    first = halo("image", "build", "cpu", "--force", cwd=test_repo)
    assert first.returncode == 0, first.stderr[-2000:]
    docker.tag("halo-test:cpu", "halo-test:first")
    second = halo("image", "build", "cpu", "--force", cwd=test_repo)
    assert second.returncode == 0, second.stderr[-2000:]
    # --force rebuilds without the layer cache: pip really installs the stack a second time.
    assert "Successfully installed" in second.stderr and "torch-2.11.0" in second.stderr
    diff = halo("image", "diff", "halo-test:first", "halo-test:cpu", cwd=test_repo)
    assert diff.returncode == 0, diff.stdout[-3000:]
    assert diff.stdout.startswith("same content: ")
