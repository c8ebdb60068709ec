"""The content hash of a source pin: `halo.hashing.sha256_tree` of the unpacked source tree.

It is defined over the tree, not over an archive's bytes, so a GitHub tarball, a zip or a
`git archive` of the same commit all give the same hash (archive compression and
timestamps vary; the files do not). A single top-level folder (`repo-<commit>/`) is
stripped. Submodules are not in such archives: each is pinned and hashed on its own,
optionally over just the subfolder the build uses (e.g. cutlass's `include/`).
"""

from __future__ import annotations

import tarfile
import tempfile
import zipfile
from pathlib import Path

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


def unpack_archive(path: Path, out: Path) -> Path:
    """Unpack a .tar[.gz|.bz2|.xz] or .zip archive into ``out``; returns its source root.

    Members that would land outside ``out`` (absolute paths, ``..``, links out) are refused
    by tarfile's "data" filter and by zipfile's own name sanitising.
    """
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                zf.extractall(out)
        elif tarfile.is_tarfile(path):
            with tarfile.open(path) as tf:
                tf.extractall(out, filter="data")
        else:
            raise HaloError(f"{path}: not a folder, tar or zip archive")
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
