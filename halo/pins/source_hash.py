"""The content hash of a source pin: `halo.hashing.sha256_tree` of the unpacked source tree.

It is defined over the tree, not over an archive's bytes, so a GitHub tarball, a zip or a
`git archive` of the same commit all give the same hash (archive compression and
timestamps vary; the files do not). A single top-level folder (`repo-<commit>/`) is
stripped. Submodules are not in such archives: each is pinned and hashed on its own,
optionally over just the subfolder the build uses (e.g. cutlass's `include/`).
"""

from __future__ import annotations

import posixpath
import tarfile
import tempfile
import zipfile
from pathlib import Path

from halo.confine import name_problem
from halo.errors import HaloError
from halo.hashing import sha256_tree


def _root(extracted: Path) -> Path:
    entries = list(extracted.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else extracted


def _tree_hash(root: Path, subdirectory: str, origin: Path) -> str:
    tree = root / subdirectory if subdirectory else root
    if not tree.is_dir():
        raise HaloError(f"{origin}: no folder '{subdirectory}' in it")
    return sha256_tree(tree)


def _member_problem(name: str, link: str | None, kind: str) -> str | None:
    """Why one archive member may not be unpacked, or None (names are checked lexically here;
    tarfile's "data" filter then checks each link against what is really on disk)."""
    if kind == "special":
        return "a device, FIFO or other special file"
    if why := name_problem(name.rstrip("/")):
        return why
    if link is None:
        return None
    if kind == "symlink":
        target = posixpath.join(posixpath.dirname(name.rstrip("/")), link)
    else:  # a hard link names a member of the archive, from its root
        target = link
    if link.startswith("/") or posixpath.normpath(target).split("/")[0] == "..":
        return f"a {kind} to {link!r}, outside the archive"
    return None


def _check_members(path: Path, members: list[tuple[str, str | None, str]]) -> None:
    for name, link, kind in members:
        if why := _member_problem(name, link, kind):
            raise HaloError(f"{path}: member {name!r}: {why}; refused, nothing unpacked")


def _tar_kind(m: tarfile.TarInfo) -> str:
    if m.issym():
        return "symlink"
    if m.islnk():
        return "hard link"
    return "file" if m.isfile() or m.isdir() else "special"


def unpack_archive(path: Path, out: Path) -> Path:
    """Unpack a .tar[.gz|.bz2|.xz] or .zip archive into ``out``; returns its source root.

    An archive comes from elsewhere: one member that would land outside ``out`` (an absolute
    name, ``..``, a link out of the tree, a file written through such a link) or a device file
    refuses the whole archive, in one line, before anything is unpacked. tarfile's "data"
    filter checks the same again against the disk as it extracts.
    """
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                # zipfile would quietly rewrite such names; a pinned archive has none.
                _check_members(path, [(i.filename, None, "file") for i in zf.infolist()])
                zf.extractall(out)
        elif tarfile.is_tarfile(path):
            with tarfile.open(path) as tf:
                members = tf.getmembers()
                _check_members(
                    path,
                    [
                        (m.name, m.linkname if m.issym() or m.islnk() else None, _tar_kind(m))
                        for m in members
                    ],
                )
                tf.extractall(out, members=members, filter="data")
        else:
            raise HaloError(f"{path}: not a folder, tar or zip archive")
    except tarfile.FilterError as exc:
        name = exc.tarinfo.name if exc.tarinfo is not None else "?"
        raise HaloError(f"{path}: member {name!r}: {exc}; refused") from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise HaloError(f"{path}: unreadable archive ({exc})") from None
    return _root(out)


def source_hash(path: Path, subdirectory: str = "") -> str:
    """Hash a source folder, or a .tar[.gz|.bz2|.xz] / .zip archive of one."""
    if path.is_dir():
        return _tree_hash(path, subdirectory, path)
    if not path.is_file():
        raise HaloError(f"{path}: no such file or folder (expected a source tree or its archive)")
    with tempfile.TemporaryDirectory(prefix="halo-source-") as tmp:
        return _tree_hash(unpack_archive(path, Path(tmp)), subdirectory, path)
