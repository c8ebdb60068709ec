"""Where this host keeps what Halo writes: the cache home and the scratch folder.

Standard library only, below halo.paths (which adds the checkout's layout and re-exports
these), so that the trainer's preflight can ask for the scratch volume too.

The scratch folder is $HALO_SCRATCH when that is set: then nothing here looks at a mount (CI
and the tests always set it). Unset, it is found: see `find_scratch`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "halo"


def scratch_root() -> Path:
    """$HALO_SCRATCH when set (nothing is looked at then); else the large local volume that
    `find_scratch` picks, or the default under the cache home (one line on stderr says why)."""
    return scratch_choice().path


def scratch_choice(
    find: Callable[[], ScratchChoice] | None = None, create: bool = True
) -> ScratchChoice:
    """`scratch_root` with the reason for it (`halo paths scratch --why`); ``find`` replaces
    `find_scratch` (tests give it their mount table); ``create=False``: a check that writes
    nothing (preflight) leaves the chosen folder unmade."""
    if env := os.environ.get(SCRATCH_ENV):
        return ScratchChoice(Path(env), f"set by {SCRATCH_ENV}")
    choice = (find or find_scratch)()
    if choice.fallback:
        _say_once(f"halo: scratch: {choice.why}; using {choice.path} (set {SCRATCH_ENV} to choose)")
    elif create and choice.path != default_scratch():
        # A halo-owned folder on that volume: private (other users of the volume have their
        # own), made the first time it is chosen, as the default one is by whoever writes.
        choice.path.mkdir(mode=0o700, exist_ok=True)
    return choice


# ---- Finding the scratch volume ---------------------------------------------------------
#
# The rule (the seed's findmnt one, read from the kernel rather than a tool's output): the
# mount with the most space available to this user, over 20 GB, that is a local disk: no
# memory (tmpfs), image layers (overlay, squashfs), network (nfs) or user-space (fuse)
# file system and no automounter (autofs), and writable. Its name proves nothing (/mnt may
# share the small root device); only statvfs says how large it is.

SCRATCH_ENV = "HALO_SCRATCH"
SCRATCH_MIN_BYTES = 20 * 10**9
MOUNTINFO = Path("/proc/self/mountinfo")
# Matched as parts of the type, as the seed's awk did: devtmpfs, nfs4, fuse.sshfs, fuseblk too.
SKIPPED_TYPES = ("tmpfs", "overlay", "squashfs", "nfs", "fuse", "autofs")
FOLDER_PREFIX = "halo-scratch-"


@dataclass(frozen=True)
class Mount:
    device: str  # "major:minor": the same file system mounted twice has one
    root: str  # the folder of that file system mounted here ("/": all of it; else a bind mount)
    point: Path
    fstype: str
    read_only: bool


@dataclass(frozen=True)
class ScratchChoice:
    path: Path
    why: str  # one line: which mount and why, or why none qualified
    mount: Path | None = None  # the volume chosen; None when set or fallen back
    available: int = 0
    fallback: bool = False  # no volume qualified: the default, and `why` says why


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """/proc/PID/mountinfo: ``ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL…] - TYPE SOURCE
    SUPER_OPTIONS`` per line (proc(5)); lines not of that shape are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 2:
            continue
        options = fields[5].split(",")
        mounts.append(
            Mount(
                device=fields[2],
                root=_unescape(fields[3]),
                point=Path(_unescape(fields[4])),
                fstype=fields[sep + 1],
                read_only="ro" in options,
            )
        )
    return mounts


def skipped_type(fstype: str) -> bool:
    return any(kind in fstype for kind in SKIPPED_TYPES)


def _holder(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount ``path`` lies on: the last-mounted one with the longest matching mount point."""
    best: Mount | None = None
    for m in mounts:
        on = path == m.point or m.point in path.parents
        if on and (best is None or len(m.point.parts) >= len(best.point.parts)):
            best = m
    return best


def default_scratch() -> Path:
    """Where scratch was before it was looked for: under the cache home."""
    return cache_home() / "scratch"


def scratch_folder(mount: Path, user: str) -> Path:
    return mount / f"{FOLDER_PREFIX}{user}"


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no name (a container's --user)
        return str(os.getuid())


def folder_state(path: Path) -> str:
    """``present`` (a writable folder), ``creatable`` (its parent is), ``unusable``, or
    ``no-folder`` (the parent, a mount point, is a file or gone)."""
    if not path.parent.is_dir():
        return "no-folder"
    if path.is_dir():
        return "present" if os.access(path, os.W_OK | os.X_OK) else "unusable"
    if os.path.lexists(path):
        return "unusable"
    return "creatable" if os.access(path.parent, os.W_OK | os.X_OK) else "unusable"


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB"


def find_scratch(
    mountinfo: str | None = None,
    statvfs: Callable[[Path], Any] = os.statvfs,
    default: Path | None = None,
    user: str | None = None,
    state: Callable[[Path], str] = folder_state,
) -> ScratchChoice:
    """Pick the scratch volume (see the rule above); every input can be given, for tests.

    Order among the qualifying mounts: one that already holds this user's halo folder (a
    scratch in use does not move because another volume's free space grew), then the most
    space; on a tie, the mount that holds ``default`` (nothing moves), then a whole file
    system before a bind mount of a folder of it, then the shorter, then the smaller path.
    So of one file system mounted at several places the whole one comes first (/ before
    /var/lib/docker, a bind of a folder of the same disk). A mount is used through
    ``<mount>/halo-scratch-<user>``, except the one holding ``default``: there ``default``
    itself (the same space, and nothing moves). A mount point that is not a folder (a
    container's /etc/hosts) is passed over; one this user cannot write to is named in ``why``.
    """
    default = default or default_scratch()
    user = user or _user()
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text()
        except OSError as exc:
            why = f"cannot read {MOUNTINFO} ({exc.strerror or exc})"
            return ScratchChoice(default, why, fallback=True)
    mounts = parse_mountinfo(mountinfo)
    # Where the default really lies (~/.cache may be a link to another volume).
    holder = _holder(Path(os.path.realpath(default)), mounts)
    skipped: dict[str, int] = {}
    small: list[tuple[int, Mount]] = []
    large: list[tuple[int, Mount]] = []
    # One size per file system: asked twice while others write, / and a bind mount of the
    # same disk would differ by a few blocks, and the tie that keeps / first would be lost.
    sizes: dict[str, int] = {}
    for m in mounts:
        if skipped_type(m.fstype) or m.read_only:
            key = "read-only" if not skipped_type(m.fstype) else m.fstype
            skipped[key] = skipped.get(key, 0) + 1
            continue
        if m.device not in sizes:
            try:
                st = statvfs(m.point)
            except OSError:
                continue
            sizes[m.device] = int(st.f_bavail) * int(st.f_frsize)
        size = sizes[m.device]
        if size > 0:  # proc, sysfs, cgroup… have no space at all
            (large if size > SCRATCH_MIN_BYTES else small).append((size, m))

    def place(m: Mount) -> Path:
        return default if m == holder else scratch_folder(m.point, user)

    def order(item: tuple[int, Mount]) -> tuple[object, ...]:
        size, m = item
        in_use = m != holder and state(place(m)) == "present"
        return (not in_use, -size, m != holder, m.root != "/", len(m.point.parts), str(m.point))

    refused: list[str] = []
    for size, m in sorted(large, key=order):
        where = place(m)
        found = "present" if m == holder else state(where)
        if found == "no-folder":
            continue
        if found == "unusable":
            refused.append(f"{where} is not writable for {user}")
            continue
        if m != holder and found == "present" and size != max(s for s, _ in large):
            reason = "chosen before, kept while it has over 20 GB"
        elif refused:
            reason = f"the largest usable volume over 20 GB; {'; '.join(refused)}"
        else:
            reason = "the local volume with the most space over 20 GB"
        why = f"{where} on {m.point} ({m.fstype}, {_gb(size)} available: {reason})"
        return ScratchChoice(where, why, m.point, size)
    if refused:
        why = "no volume over 20 GB is usable: " + "; ".join(refused)
        return ScratchChoice(default, why, fallback=True)
    why = "no local volume has over 20 GB available"
    if small:
        size, m = max(small, key=lambda item: (item[0], str(item[1].point)))
        why += f" (the largest: {m.point}, {_gb(size)})"
    if skipped:
        why += "; skipped " + ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items()))
    return ScratchChoice(default, why, fallback=True)


_said: set[str] = set()


def _say_once(line: str) -> None:
    # Many commands ask for scratch several times: the reason is worth one line per process,
    # not one per call (the only module state here, and it holds only what was printed).
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr)
