"""`halo stack verify SET --image NAME`: the stack check inside a built image, against halo:cpu.

Real images in a real engine (skipped with the reason without one): the checkout's halo:cpu
passes; one `pip uninstall` layer on top of it fails with the rows that name what is gone; a
checkout whose lock differs from the one the image was built from fails the lock row.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from attest_support import TestKey
from support import COPY_IGNORE, REPO, docker_or_skip, halo

from halo.images.docker import Docker
from halo.stack.in_image import ROWS_MARK, parse
from halo.stack.verify import FAIL, OK
from halo.testing.attest import read

# One worker runs this module: broken_ref (an image built on halo:cpu) is made once.
pytestmark = pytest.mark.xdist_group("stack-in-image")

BROKEN = "halo-test-broken:cpu"


@pytest.fixture(scope="module")
def docker() -> Docker:
    return docker_or_skip()


@pytest.fixture(scope="module")
def cpu_ref(docker: Docker) -> str:
    """The checkout's halo:cpu (a no-op when CI's build-cpu ran first): its immutable ref."""
    proc = halo("image", "build", "cpu", cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(li for li in proc.stdout.splitlines() if li.startswith("halo:cpu "))
    return f"halo:{row.split()[1]}"


@pytest.fixture(scope="module")
def broken_ref(docker: Docker, cpu_ref: str) -> Iterator[str]:
    """halo:cpu plus one layer that uninstalls a locked distribution."""
    dockerfile = f"FROM {cpu_ref}\nRUN pip uninstall -y safetensors\n"
    proc = subprocess.run(
        [docker.exe, "build", "--network", "none", "-t", BROKEN, "-"],
        input=dockerfile,
        capture_output=True,
        text=True,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    yield BROKEN
    docker.remove(BROKEN)


def _rows(stdout: str) -> dict[str, str]:
    """check -> result from the printed table."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] in (OK, FAIL, "skip"):
            out[parts[0]] = parts[1]
    return out


def _recorded(store: Path):  # type: ignore[no-untyped-def]
    """The one test attestation a run recorded under ``store`` (by the image's config digest)."""
    (folder,) = (store / "attestations").iterdir()
    (path,) = folder.iterdir()
    att = read(path.read_bytes())
    assert att.statement is not None and f"sha256:{folder.name}" in att.statement.digests()
    return att.statement


@pytest.mark.docker
def test_the_cpu_image_proves_its_stack_inside_itself(cpu_ref: str, tmp_path: Path) -> None:
    env = {**TestKey.make(tmp_path / "keys").env(), "HALO_STORE": str(tmp_path / "store")}
    proc = halo("stack", "verify", "cpu", "--image", cpu_ref, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    rows = _rows(proc.stdout)
    for check in ("lock", "pip-check", "versions", "patches", "imports", "torch", "nccl", "elf"):
        assert rows.get(check) == OK, (check, proc.stdout)
    assert f"cpu in {cpu_ref}" in proc.stdout
    # Recorded as the image's test result of tier "stack" (the server images' promote gate).
    assert "tier stack: PASSED recorded for sha256:" in proc.stderr
    st = _recorded(tmp_path / "store")
    assert (st.inputs.tier, st.outcome.result, st.inputs.placement) == ("stack", "PASSED", ("cpu",))
    assert "stack::pip-check" in st.outcome.passed and not st.outcome.failed


@pytest.mark.docker
def test_an_uninstalled_distribution_fails_with_rows_that_name_it(
    broken_ref: str, tmp_path: Path
) -> None:
    env = {"HALO_ATTEST_KEY": "", "HALO_STORE": str(tmp_path / "store")}
    proc = halo("stack", "verify", "cpu", "--image", broken_ref, cwd=REPO, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert "tier stack: FAILED recorded" in proc.stderr and "UNSIGNED" in proc.stderr
    st = _recorded(tmp_path / "store")
    assert {"stack::versions", "stack::imports"} <= set(st.outcome.failed)
    rows = _rows(proc.stdout)
    assert rows["versions"] == FAIL and rows["imports"] == FAIL and rows["lock"] == OK
    assert "halo: stack: cpu: versions: safetensors: locked " in proc.stderr
    assert ", not installed" in proc.stderr
    assert "halo: stack: cpu: imports: import safetensors: ModuleNotFoundError" in proc.stderr


@pytest.mark.docker
def test_a_lock_the_image_was_not_built_from_fails_the_lock_row(
    cpu_ref: str, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=COPY_IGNORE, symlinks=True)
    lock = repo / "pins" / "pylock.cpu.toml"
    lock.write_text(lock.read_text() + "# edited after the build\n")
    proc = halo("stack", "verify", "cpu", "--image", cpu_ref, cwd=repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert _rows(proc.stdout)["lock"] == FAIL
    assert "halo: stack: cpu: lock: pylock.cpu.toml: sha256 " in proc.stderr
    assert "the image was built from" in proc.stderr


def test_more_than_one_set_with_image_is_one_error_line() -> None:
    proc = halo("stack", "verify", "cpu", "vllm", "--image", "cpu", cwd=REPO)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "checks exactly one SET" in lines[0]


def test_rows_round_trip_and_a_silent_container_has_none() -> None:
    line = ROWS_MARK + '[{"check": "lock", "result": "ok", "detail": "d", "failures": []}]'
    rows = parse(f"noise\n{line}\n")
    assert rows is not None and rows[0].check == "lock" and rows[0].failures == ()
    assert parse("halo: error: something\n") is None
