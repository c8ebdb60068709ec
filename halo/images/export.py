"""`halo image export NAME --format sqsh|sif OUT`: a built image for clusters without Docker.

The image's root filesystem (`docker export` of a created, never started container) becomes

- an Enroot/pyxis squashfs (``.sqsh``): the image's environment in ``/etc/environment`` and its
  working directory and command in ``/etc/rc``, as ``enroot import`` writes them;
- an Apptainer SIF (``.sif``): the same squashfs, with ``/.singularity.d/env/`` and a
  ``runscript`` as Apptainer's Docker conversion writes them, as the SIF's system partition.

Same image, same bytes. mksquashfs gets every time and owner fixed (``-all-root -all-time
-mkfs-time``), no xattrs, and sorts directory entries itself. ``siftool new`` writes a random
ID and the current time into the global header and the descriptors; the SIF spec fixes those
fields' offsets, so they are rewritten afterwards: the times to the images' SOURCE_DATE_EPOCH
and the ID to a UUID derived from the partition's bytes (an ID still names the contents).
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import struct
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.images.docker import Docker
from halo.images.graph import DEFAULT_EPOCH

FORMATS = ("sqsh", "sif")
# lz4: the fastest of mksquashfs's compressors (an image of GBs in minutes on two cores); fixed, since
# the compressor and its options are part of the bytes.
SQUASHFS_OPTIONS = ("-all-root", "-noappend", "-no-xattrs", "-mkfs-time", "0", "-all-time", "0")
SQUASHFS_OPTIONS += ("-comp", "lz4", "-no-progress")
# Left by `docker create` in every container's filesystem, not part of the image.
DOCKER_ONLY = (".dockerenv",)

# SIF v1 layout (github.com/apptainer/sif, pkg/sif): a packed little-endian global header, then
# fixed-size descriptors from `descroff`.
SIF_ID = slice(48, 64)  # launch[32] magic[10] version[3] arch[3] id[16]
SIF_TIMES = 64  # ctime, mtime: int64 each
SIF_DESCR = struct.Struct("<qqqqqq")  # dfree dtotal descroff descrlen dataoff datalen, at 80
DESCR_SIZE = 585  # datatype i32, used u8, id/groupid/link u32, fileoff/filelen/storelen i64, ...
DESCR_TIMES = 41  # ... ctime, mtime i64 at these offsets within a descriptor


@dataclass(frozen=True)
class ImageConfig:
    env: list[str]
    entrypoint: list[str]
    cmd: list[str]
    workdir: str

    @classmethod
    def of(cls, info: dict) -> ImageConfig:  # type: ignore[type-arg]
        c = info.get("Config") or {}
        return cls(
            list(c.get("Env") or []),
            list(c.get("Entrypoint") or []),
            list(c.get("Cmd") or []),
            c.get("WorkingDir") or "/",
        )


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise HaloError(f"{what}: {Path(argv[0]).name} exited {proc.returncode}: {tail[0]}")


def rootfs(docker: Docker, ref: str, dest: Path) -> ImageConfig:
    """Unpack ``ref``'s files into ``dest`` (owners and modes kept); returns its config."""
    info = docker.inspect_json(ref)
    created = subprocess.run(
        [docker.exe, "create", ref], capture_output=True, text=True, check=False
    )
    if created.returncode != 0:
        raise HaloError(f"{ref}: docker create failed: {created.stderr.strip()}")
    cid = created.stdout.strip()
    try:
        dest.mkdir(parents=True)
        exporter = subprocess.Popen([docker.exe, "export", cid], stdout=subprocess.PIPE)
        untar = subprocess.run(
            ["tar", "-x", "--numeric-owner", "-p", "-C", str(dest)],
            stdin=exporter.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        if exporter.wait() != 0 or untar.returncode != 0:
            raise HaloError(f"{ref}: docker export | tar -x failed: {untar.stderr.strip()}")
    finally:
        subprocess.run([docker.exe, "rm", "-f", cid], capture_output=True, check=False)
    for name in DOCKER_ONLY:
        (dest / name).unlink(missing_ok=True)
    return ImageConfig.of(info)


def _env_pairs(cfg: ImageConfig) -> list[tuple[str, str]]:
    return [tuple(e.split("=", 1)) for e in cfg.env if "=" in e]  # type: ignore[misc]


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def enroot_conventions(root: Path, cfg: ImageConfig) -> None:
    """/etc/environment (read by enroot at start) and /etc/rc (enroot's entry point)."""
    _write(root / "etc" / "environment", "".join(f"{k}={v}\n" for k, v in _env_pairs(cfg)))
    default = " ".join(shlex.quote(a) for a in [*cfg.entrypoint, *cfg.cmd]) or "/bin/sh"
    rc = (
        f"mkdir -p {shlex.quote(cfg.workdir)} 2> /dev/null\n"
        f"cd {shlex.quote(cfg.workdir)} && unset OLDPWD || exit 1\n"
        'if [ $# -gt 0 ]; then\n    exec "$@"\nelse\n'
        f"    exec {default}\nfi\n"
    )
    _write(root / "etc" / "rc", rc)


def apptainer_conventions(root: Path, cfg: ImageConfig) -> None:
    """/.singularity.d: the image's environment (not overriding the caller's) and runscript."""
    d = root / ".singularity.d"
    env = "#!/bin/sh\n" + "".join(
        f"export {k}=${{{k}:-{shlex.quote(v)}}}\n" for k, v in _env_pairs(cfg)
    )
    _write(d / "env" / "10-docker2singularity.sh", env, 0o755)
    entry = " ".join(shlex.quote(a) for a in cfg.entrypoint)
    cmd = " ".join(shlex.quote(a) for a in cfg.cmd)
    run = (
        "#!/bin/sh\n"
        f"cd {shlex.quote(cfg.workdir)} 2>/dev/null || true\n"
        f'if [ $# -gt 0 ]; then exec {entry} "$@"; else exec {entry} {cmd}; fi\n'
    ).replace("exec  ", "exec ")
    _write(d / "runscript", run, 0o755)
    _write(d / "labels.json", "{}\n")
    (d / "libs").mkdir(exist_ok=True)


def squashfs(root: Path, out: Path) -> None:
    _run(["mksquashfs", str(root), str(out), *SQUASHFS_OPTIONS, "-quiet"], str(out))


def _fix_sif(path: Path, epoch: int, ident: bytes) -> None:
    """Rewrite the header's ID and times and every used descriptor's times (SIF v1)."""
    with path.open("r+b") as f:
        head = f.read(128)
        if head[32:41] != b"SIF_MAGIC" or head[42:44] != b"01":
            raise HaloError(f"{path}: siftool wrote no SIF v1 header")
        _dfree, dtotal, descroff, _dlen, _doff, _dsize = SIF_DESCR.unpack_from(head, 80)
        f.seek(SIF_ID.start)
        f.write(ident)
        f.seek(SIF_TIMES)
        f.write(struct.pack("<qq", epoch, epoch))
        for i in range(dtotal):
            at = descroff + i * DESCR_SIZE
            f.seek(at + 4)
            if f.read(1) != b"\x01":  # unused slot
                continue
            f.seek(at + DESCR_TIMES)
            f.write(struct.pack("<qq", epoch, epoch))


def sif(sqsh: Path, out: Path, epoch: int) -> None:
    if shutil.which("siftool") is None:
        raise HaloError("--format sif: siftool not found on PATH (Debian: apt-get install siftool)")
    _run(["siftool", "new", str(out)], str(out))
    # A squashfs (partfs 1) system partition (parttype 2) for amd64 (partarch 2): what
    # `apptainer build` writes for a container's root filesystem.
    add = ["siftool", "add", "--datatype", "4", "--partfs", "1", "--parttype", "2"]
    _run([*add, "--partarch", "2", str(out), str(sqsh)], str(out))
    digest = hashlib.sha256()
    with sqsh.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    ident = uuid.UUID(bytes=digest.digest()[:16], version=4).bytes
    _fix_sif(out, epoch, ident)


def export(docker: Docker, ref: str, fmt: str, out: Path, epoch: int = DEFAULT_EPOCH) -> Path:
    """Write ``out`` atomically (a temp file beside it, renamed)."""
    if fmt not in FORMATS:
        raise HaloError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if shutil.which("mksquashfs") is None:
        raise HaloError("mksquashfs not found on PATH (Debian: apt-get install squashfs-tools)")
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".halo-export-", dir=out.parent) as tmp:
        root = Path(tmp) / "rootfs"
        cfg = rootfs(docker, ref, root)
        (enroot_conventions if fmt == "sqsh" else apptainer_conventions)(root, cfg)
        part = Path(tmp) / "part.sqsh"
        squashfs(root, part)
        if fmt == "sif":
            sif(part, Path(tmp) / "out.sif", epoch)
            part = Path(tmp) / "out.sif"
        part.chmod(0o644)
        part.replace(out)
    return out
