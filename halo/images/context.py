"""Stage a build context: exactly the bytes the Dockerfile may use, nothing from the network.

tools/     halo-normalize, the last command of every RUN step (reproducible layers)
wheels/    the lock's artifacts, hard-linked from the store after verifying their sha256,
           plus requirements.txt (name==version --hash=...) and _pip.whl to install them
install/   the install step that installs them (halo.stack.stage; `halo stack verify` runs
           the same one)
kernels/   wheels of source derivations (may be empty) and their requirements.txt
halo/      halo's own wheel, build-inputs.json and the image's SBOM (halo.images.sbom)
patches/   the patch modules, applied strictly in the image
image/     the files next to the image's Dockerfile (a server's entrypoint script)

The context has one fixed path per image and is updated in place: a file whose bytes did not
change is not rewritten and keeps its inode and mtime. BuildKit syncs a context incrementally,
keyed by its path, and decides what to send by size and mtime, so a warm rebuild sends only
what changed (halo's wheel) instead of every wheel again. For the same reason a rewritten file
must get a new mtime: pinning context mtimes to SOURCE_DATE_EPOCH made a changed wheel of the
same size look unchanged, and BuildKit reused the old layer. No context mtime reaches the
image (no COPY; every RUN step normalises what it writes).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from halo.hashing import sha256_file, tree_files
from halo.images.sbom import SBOM_FILE, image_sbom
from halo.images.wheel import build_wheel
from halo.pins.lockfile import Lock
from halo.store.store import Store

NORMALIZE_SCRIPT = Path(__file__).with_name("normalize.sh")
DIR_MODE = 0o755
SMALL = 1 << 20  # files compared byte by byte; bigger ones are store links, compared by inode


class ContextSync:
    """Bring a folder to an exact set of files, touching only the ones that differ."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.wanted: set[Path] = set()
        self.changed: list[str] = []
        root.mkdir(parents=True, exist_ok=True)

    def _dest(self, rel: str) -> Path:
        dest = self.root / rel
        self.wanted.add(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        return dest

    def link(self, rel: str, store: Store, sha256: str) -> None:
        """A store entry at ``rel``: a hard link (the same inode) when the filesystem allows it."""
        dest, src = self._dest(rel), store.path(sha256)
        try:
            if src.samefile(dest):
                return
        except FileNotFoundError:
            pass
        _remove(dest)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copyfile(src, dest)  # another filesystem: a copy, made again each build
        self.changed.append(rel)

    def adopt(self, rel: str, src: Path) -> None:
        """The file ``src`` (staged elsewhere on this filesystem) at ``rel``, unless it is there."""
        dest = self._dest(rel)
        try:
            if src.samefile(dest):
                return
            st = dest.stat()
            if st.st_size == src.stat().st_size <= SMALL and dest.read_bytes() == src.read_bytes():
                return
        except OSError:
            pass
        _remove(dest)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)
        self.changed.append(rel)

    def write(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        dest = self._dest(rel)
        try:
            if not dest.is_symlink() and dest.is_file() and dest.read_bytes() == data:
                return
        except OSError:
            pass
        fd, name = tempfile.mkstemp(prefix=".stage.", dir=dest.parent)
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            tmp.chmod(mode)
            _remove(dest)
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)
        self.changed.append(rel)

    def folder(self, rel: str) -> None:
        dest = self._dest(rel)
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            dest.unlink()  # a file or link of that name, from another tree
        dest.mkdir(exist_ok=True)

    def symlink(self, rel: str, target: Path) -> None:
        dest = self._dest(rel)
        if dest.is_symlink() and dest.readlink() == target:
            return
        _remove(dest)
        dest.symlink_to(target)
        self.changed.append(rel)

    def mirror(self, staged: Path, fresh: Sequence[str] = ()) -> None:
        """Everything under ``staged`` (a tree made on this filesystem), then ``finish``.

        A changed file under one of the ``fresh`` folders gets this moment's mtime: BuildKit
        takes a file of the same size and mtime for unchanged, and two source trees may hold one
        path of one size from one archive's clock, with other bytes (a patched file)."""
        touched = tuple(f"{f}/" for f in fresh)
        for dirpath, dirnames, filenames in os.walk(staged):
            here = Path(dirpath)
            base = here.relative_to(staged)
            for name in [*dirnames, *filenames]:
                src, rel = here / name, str(base / name)
                if src.is_symlink():
                    self.symlink(rel, src.readlink())
                elif src.is_dir():
                    self.folder(rel)  # top-down: a folder is made before what is in it
                else:
                    before = len(self.changed)
                    self.adopt(rel, src)
                    if len(self.changed) > before and rel.startswith(touched):
                        os.utime(self.root / rel)
            dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
        self.finish()

    def finish(self) -> None:
        """Remove whatever is not wanted, and give every folder one mode.

        A folder's mode comes from the umask of whoever made it, and reaches an image through
        `cp -R` and BuildKit's cache keys: a build host with umask 077 made another image."""
        keep_dirs = {p for w in self.wanted for p in w.parents if self.root in (p, *p.parents)}
        for dirpath, dirnames, filenames in os.walk(self.root, topdown=False):
            here = Path(dirpath)
            if stat.S_IMODE(here.stat().st_mode) != DIR_MODE:
                here.chmod(DIR_MODE)
            for name in filenames:
                if here / name not in self.wanted:
                    (here / name).unlink()
                    self.changed.append(str((here / name).relative_to(self.root)))
            for name in dirnames:
                sub = here / name
                if sub not in keep_dirs and sub not in self.wanted:
                    _remove(sub)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def stage_context(
    ctx: Path,
    repo: Path,
    lock: Lock,
    store: Store,
    kernel_wheels: Sequence[tuple[Path, str]],
    build_inputs: dict[str, object],
    image_dir: Path | None = None,
    fix: str = "halo fetch",
) -> list[str]:
    """Bring ``ctx`` up to date; returns the paths that changed. Nothing is touched until every
    artifact has verified."""
    from halo.stack.stage import stage

    for wheel, sha in kernel_wheels:
        store.verify(sha, wheel.name, fix=fix)
    # The lock's wheels and the install step, staged exactly as `halo stack verify` stages them
    # (it verifies every artifact first), next to the context, then brought in file by file.
    staging = ctx.with_name(f".{ctx.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    sync = ContextSync(ctx)
    try:
        stage(staging, lock, store, repo / "patches")
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            sync.adopt(path.relative_to(staging).as_posix(), path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    sync.write("tools/halo-normalize", NORMALIZE_SCRIPT.read_bytes(), mode=0o755)

    sync.folder("kernels")
    kernel_lines = []
    for wheel, sha in kernel_wheels:
        sync.link(f"kernels/{wheel.name}", store, sha)
        kernel_lines.append(
            f"{wheel.name.split('-')[0]} @ file:///tmp/halo-kernels/{wheel.name} --hash=sha256:{sha}"
        )
    sync.write("kernels/requirements.txt", "".join(f"{x}\n" for x in kernel_lines).encode())

    with tempfile.TemporaryDirectory(prefix="halo-wheel-") as tmp:
        wheel = build_wheel(repo, Path(tmp))
        sync.write(f"halo/{wheel.name}", wheel.read_bytes())
        wheels = [(w.name, sha) for w, sha in kernel_wheels] + [(wheel.name, sha256_file(wheel))]
    ref, input_hash = str(build_inputs["image_ref"]), str(build_inputs["input_hash"])
    sync.write(f"halo/{SBOM_FILE}", image_sbom(lock, ref, input_hash, wheels).encode())
    sync.write(
        "halo/build-inputs.json",
        (json.dumps(build_inputs, indent=2, sort_keys=True) + "\n").encode(),
    )
    for path in tree_files(repo / "patches"):
        sync.write(f"patches/{path.relative_to(repo / 'patches').as_posix()}", path.read_bytes())
    # The Dockerfile itself is passed with -f; what sits next to it is what it may COPY.
    sync.folder("image")
    if image_dir is not None:
        for path in sorted(image_dir.iterdir()):
            if path.is_file() and path.name != "Dockerfile":
                sync.write(
                    f"image/{path.name}", path.read_bytes(), mode=path.stat().st_mode & 0o777
                )
    sync.finish()
    return sync.changed
