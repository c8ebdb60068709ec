"""`halo image export`: Enroot squashfs and Apptainer SIF from a built image, byte for byte.

A tiny imported image proves the formats (twice the same bytes, with files of other ages, modes
and a hard link; the files and the runtimes' conventions inside); halo:cpu proves the real
thing, squashed twice (a sqsh, a SIF): the tiny example trains from its sqsh, mounted in a
chroot in new namespaces, no Docker, and the SIF holds every file the sqsh holds.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO, built_ref, docker_or_skip, halo

from halo.images.docker import Docker

# One worker runs this module: cpu_sqsh (halo:cpu squashed, minutes) is made once, not per worker.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("halo-cpu-export")]

TINY = "halo-test-export:tiny"
FILES = {
    "etc/hello": (b"hello\n", 0o644),
    "usr/bin/tool": (b"#!/bin/sh\necho tool\n", 0o755),
    "workspace/data/a.txt": (b"a\n", 0o600),
}
# A second name for usr/bin/tool (a hard link, as pip's and dpkg's trees have): squashed as one
# inode with two names, in the same order each time.
HARD_LINK = "usr/bin/tool-again"


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {', '.join(missing)} missing (.ci/run installs them)")
        pytest.skip(f"needs {', '.join(missing)} (Debian: squashfs-tools, siftool)")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def docker() -> Docker:
    _need("mksquashfs", "unsquashfs", "siftool")
    return docker_or_skip()


@pytest.fixture(scope="module")
def tiny(docker: Docker) -> Iterator[str]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for age, (name, (data, mode)) in enumerate(FILES.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 1234567 + age * 86400 * 365
            tar.addfile(info, io.BytesIO(data))
        hard = tarfile.TarInfo(HARD_LINK)
        hard.type, hard.linkname, hard.mode = tarfile.LNKTYPE, "usr/bin/tool", 0o755
        tar.addfile(hard)
        link = tarfile.TarInfo("bin")
        link.type, link.linkname = tarfile.SYMTYPE, "usr/bin"
        tar.addfile(link)
    changes = ['ENV FOO="bar baz"', "WORKDIR /workspace", 'CMD ["tool", "--x"]']
    argv = [docker.exe, "import", *(a for c in changes for a in ("--change", c)), "-", TINY]
    subprocess.run(argv, input=buf.getvalue(), check=True, capture_output=True)
    yield TINY
    docker.remove(TINY)


def export(ref: str, fmt: str, out: Path) -> Path:
    proc = halo("image", "export", ref, "--format", fmt, str(out), cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"as {fmt}" in proc.stdout and sha(out) in proc.stdout
    return out


def unsquash(sqsh: Path, dest: Path) -> Path:
    subprocess.run(["unsquashfs", "-no-xattrs", "-d", str(dest), str(sqsh)], check=True,
                   capture_output=True)  # fmt: skip
    return dest


def sif_partition(sif: Path, out: Path) -> Path:
    listing = subprocess.run(["siftool", "list", str(sif)], check=True, capture_output=True,
                             text=True).stdout  # fmt: skip
    assert "FS (Squashfs/*System/amd64)" in listing, listing
    with out.open("wb") as f:
        subprocess.run(["siftool", "dump", "1", str(sif)], check=True, stdout=f)
    return out


def files(root: Path) -> dict[str, tuple[int, bytes | str]]:
    got: dict[str, tuple[int, bytes | str]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            got[rel] = (0, str(p.readlink()))
        elif p.is_file():
            got[rel] = (p.stat().st_mode & 0o7777, p.read_bytes())
    return got


def test_tiny_sqsh_is_deterministic_and_holds_the_files_and_enroot_conventions(
    tiny: str, tmp_path: Path
) -> None:
    a = export(tiny, "sqsh", tmp_path / "a.sqsh")
    time.sleep(1.1)  # a clock in the output would now differ
    b = export(tiny, "sqsh", tmp_path / "b.sqsh")
    assert sha(a) == sha(b)
    root = unsquash(a, tmp_path / "root")
    got = files(root)
    for name, (data, mode) in FILES.items():
        assert got[name] == (mode, data), name
    assert got["bin"] == (0, "usr/bin")
    tool, again = (root / "usr/bin/tool").stat(), (root / HARD_LINK).stat()
    assert (again.st_ino, again.st_nlink) == (tool.st_ino, 2), "one inode, two names"
    env = got["etc/environment"][1]
    assert b"FOO=bar baz\n" in env  # type: ignore[operator]
    rc = got["etc/rc"][1]
    assert b"cd /workspace" in rc and b"exec tool --x" in rc and b'exec "$@"' in rc  # type: ignore[operator]
    assert ".dockerenv" not in got


def test_tiny_sif_is_deterministic_with_apptainer_conventions(tiny: str, tmp_path: Path) -> None:
    a = export(tiny, "sif", tmp_path / "a.sif")
    time.sleep(1.1)
    b = export(tiny, "sif", tmp_path / "b.sif")
    assert sha(a) == sha(b)
    header = subprocess.run(["siftool", "header", str(a)], check=True, capture_output=True,
                            text=True).stdout  # fmt: skip
    assert "Created At:           2026-11-01 00:00:00 +0000 UTC" in header, header
    got = files(unsquash(sif_partition(a, tmp_path / "p.sqsh"), tmp_path / "root"))
    for name, (data, mode) in FILES.items():
        assert got[name] == (mode, data), name
    env = got[".singularity.d/env/10-docker2singularity.sh"]
    assert env[0] == 0o755 and b"export FOO=${FOO:-'bar baz'}\n" in env[1]  # type: ignore[operator]
    run = got[".singularity.d/runscript"][1]
    assert b"exec tool --x" in run and b'exec  "$@"' not in run  # type: ignore[operator]


def test_an_image_that_is_not_here_is_one_line_and_nothing_written(
    docker: Docker, tmp_path: Path
) -> None:
    proc = halo("image", "export", "halo-test-export:absent", "--format", "sqsh",
                str(tmp_path / "x.sqsh"), cwd=REPO)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "halo: error: halo-test-export:absent: no such image here"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def cpu_sqsh(docker: Docker, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """halo:cpu (a no-op build when CI's build-cpu ran first), exported once, by image ID: the
    moving tag may move meanwhile (another checkout's build)."""
    proc = halo("image", "build", "cpu", cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    image_id = docker.image_id(built_ref(proc.stdout))
    assert image_id
    return image_id, export(image_id, "sqsh", tmp_path_factory.mktemp("cpu") / "halo-cpu.sqsh")


def test_halo_cpu_sqsh_holds_the_image_and_trains_in_a_chroot(
    docker: Docker, cpu_sqsh: tuple[str, Path], tmp_path: Path
) -> None:
    """The 5 GB root is mounted read-only (squashfuse, as Apptainer runs a squashfs), not
    unpacked: no GBs written and removed again; the tiny tests above check unsquashfs."""
    image_id, sqsh = cpu_sqsh
    root, out = tmp_path / "root", tmp_path / "out"
    root.mkdir()
    out.mkdir()
    listing = subprocess.run(["unsquashfs", "-cat", str(sqsh), "etc/halo/build.json"],
                             capture_output=True, check=True).stdout  # fmt: skip
    inside = docker.run(["--rm", "--network", "none", image_id, "cat", "/etc/halo/build.json"],
                        True).stdout  # fmt: skip
    assert listing.decode() == inside
    env = subprocess.run(["unsquashfs", "-cat", str(sqsh), "etc/environment"],
                         capture_output=True, check=True).stdout  # fmt: skip
    assert b"PATH=/opt/venv/bin:" in env
    # The example from this checkout, bound in; the image's own halo and torch; no network.
    # Writable only: /workspace (a tmpfs, with the outputs bound from here), /tmp, /dev.
    script = (
        f"squashfuse {sqsh} {root} && mount -t tmpfs tmpfs {root}/workspace && "
        f"mkdir {root}/workspace/repo {root}/workspace/out && "
        f"mount --bind {REPO} {root}/workspace/repo && mount --bind {out} {root}/workspace/out && "
        f"mount -t proc proc {root}/proc && "
        # /dev as the container runtimes give it (torch reads /dev/urandom); a /tmp of its own.
        f"mount --rbind /dev {root}/dev && mount -t tmpfs tmpfs {root}/tmp && "
        f"exec chroot {root} /usr/bin/env -i $(cat {root}/etc/environment) HOME=/tmp "
        "OMP_NUM_THREADS=1 /bin/sh -c 'cd /workspace && halo launch sft "
        "repo/examples/sft/config.yaml -- --training.max_steps=3 "
        "--runtime.paths.checkpoints=/workspace/out/ck --runtime.paths.logs=/workspace/out/logs'"
    )
    proc = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--net", "sh", "-c", script],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "step 3/3" in log and "checkpoint: writing r1_epoch_0_step_3 (final)" in log, log
    assert (out / "ck" / "tiny-sft" / "r1_epoch_0_step_3" / "meta.json").exists()


def _listing(sqsh: Path) -> dict[str, str]:
    """Every file and symlink in a squashfs by path: its mode, owner, size and time (not its
    folders, whose sizes count their entries)."""
    out = subprocess.run(["unsquashfs", "-lln", "-d", "", str(sqsh)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return {li.split(maxsplit=5)[5]: li for li in out.splitlines() if li[:1] in ("-", "l")}


def test_halo_cpu_as_sif_holds_every_file_of_its_sqsh_and_apptainers_conventions(
    docker: Docker, cpu_sqsh: tuple[str, Path], tmp_path: Path
) -> None:
    """The real image (GBs, hard links, docker create's mount points, files of every age) as a
    SIF: its partition holds every file of the image's sqsh, the same mode, owner, size and
    time, plus the image's own build.json and Apptainer's files. That an export is the same
    bytes twice is the tiny image's test above (hard link and ages included), so the 5 GB
    image is squashed twice here, not three times."""
    image_id, sqsh = cpu_sqsh
    a = export(image_id, "sif", tmp_path / "a.sif")
    part = sif_partition(a, tmp_path / "part.sqsh")
    a.unlink()  # GBs: one export on disk at a time
    want, got = _listing(sqsh), _listing(part)
    assert len(want) > 10_000, len(want)
    # Enroot's conventions, written over the image's own /etc/environment, are the sqsh's alone.
    differ = [p for p in want if got.get(p) != want[p] and p not in ("/etc/environment", "/etc/rc")]
    assert not differ, [(want[p], got.get(p)) for p in differ[:10]]
    inside = docker.run(["--rm", "--network", "none", image_id, "cat", "/etc/halo/build.json"],
                        True).stdout  # fmt: skip
    for name, want_bytes in (
        ("etc/halo/build.json", inside.encode()),
        (".singularity.d/runscript", None),
        (".singularity.d/env/10-docker2singularity.sh", None),
    ):
        out = subprocess.run(["unsquashfs", "-cat", str(part), name], capture_output=True)
        assert out.returncode == 0, (name, out.stderr)
        assert want_bytes is None or out.stdout == want_bytes, name
