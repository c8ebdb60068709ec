"""Source trees of the source pins (pins/sources.toml), kept in the store and verified on use.

A source pin names a commit and the content hash of its tree (`halo pins source-hash`); each
git submodule the build needs is pinned the same way. The tree is assembled once under
``<store>/sources/<key>`` and hashed again every time a build uses it: a tree that changed
is fetched again, never used.

Where an archive comes from (the fetch phase; the only one that may use the network):

1. a substitute folder: ``$HALO_SOURCE_SUBSTITUTES`` (os.pathsep separated) holding
   ``<commit>.tar.gz`` (or ``.tgz``, ``.tar``, ``.tar.xz``, ``.tar.bz2``, ``.zip``), e.g. a
   ``git archive`` of a local mirror. Like a wheel substitute it is trusted only through the
   pinned content hash: one that does not match is refused and the next source is tried.
2. the repository's archive of the commit (``<repository>/archive/<commit>.tar.gz``).

Only the part of an archive that the pin's hash covers is kept: a submodule pinned over a
subfolder (cutlass's ``include/``) contributes that subfolder and nothing unverified.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from halo.atomic import staged_dir
from halo.errors import HaloError
from halo.hashing import sha256_json, sha256_tree
from halo.pins.source_hash import unpack_archive
from halo.pins.source_pins import SourcePin
from halo.report import Progress, say
from halo.store.store import Store

SUBSTITUTES_VAR = "HALO_SOURCE_SUBSTITUTES"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.xz", ".tar.bz2", ".zip")

# url -> (length, chunks): the network edge (halo.store.index.IndexClient.download).
Download = Callable[[str], tuple[int | None, Iterable[bytes]]]


def substitute_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    env = os.environ if env is None else env
    found = [Path(d) for d in env.get(SUBSTITUTES_VAR, "").split(os.pathsep) if d]
    return [d for d in found if d.is_dir()]


def tree_key(pin: SourcePin) -> str:
    return sha256_json([pin.content_sha256, *(m.content_sha256 for m in pin.submodules)])


def tree_path(store: Store, pin: SourcePin) -> Path:
    return store.root / "sources" / tree_key(pin)


def tree_problem(pin: SourcePin, tree: Path) -> str | None:
    """Why ``tree`` is not what ``pin`` says, or None. Hashes every file: run on every use.

    The pin's hash covers the repository's files outside its submodules; each submodule's
    covers its own folder (or the subfolder the build uses).
    """
    subs = tuple(m.path.strip("/") + "/" for m in pin.submodules)
    got = sha256_tree(tree, exclude=subs)
    if got != pin.content_sha256:
        return f"{pin.name}: content hash {got}, pin says {pin.content_sha256}"
    for m in pin.submodules:
        folder = tree / m.path / m.subdirectory if m.subdirectory else tree / m.path
        got = sha256_tree(folder) if folder.is_dir() else "missing"
        if got != m.content_sha256:
            return f"{pin.name}/{m.path}: content hash {got}, pin says {m.content_sha256}"
    return None


def stored_tree(pin: SourcePin, store: Store) -> Path | None:
    """The pin's tree in the store if it is there and hashes right now, else None."""
    tree = tree_path(store, pin)
    if not tree.is_dir():
        return None
    problem = tree_problem(pin, tree)
    if problem is not None:
        say(f"source {problem}: the stored tree changed; it is fetched again")
        return None
    return tree


def source_tree(
    pin: SourcePin,
    store: Store,
    workdir: Path,
    substitutes: Sequence[Path] = (),
    download: Download | None = None,
) -> Path:
    """The pinned source with its submodules, verified by content hash (fetch phase if absent)."""
    if (tree := stored_tree(pin, store)) is not None:
        return tree
    if download is None:
        from halo.store.index import IndexClient

        download = IndexClient.download
    parts = [(pin.repository, pin.commit, pin.content_sha256, "", "", pin.name)]
    parts += [
        (m.repository, m.commit, m.content_sha256, m.subdirectory, m.path, f"{pin.name}/{m.path}")
        for m in pin.submodules
    ]
    with staged_dir(tree_path(store, pin)) as staged:
        for repository, commit, want, subdirectory, dest, label in parts:
            target = staged / dest if dest else staged
            if dest:
                shutil.rmtree(target, ignore_errors=True)
            _place_verified(
                repository,
                commit,
                want,
                subdirectory,
                target,
                label,
                workdir,
                substitutes,
                download,
            )
        problem = tree_problem(pin, staged)
        if problem is not None:  # e.g. a submodule path that the main archive also fills
            raise HaloError(f"source {problem}: the assembled tree is not the pinned one")
    return tree_path(store, pin)


def _place_verified(
    repository: str,
    commit: str,
    want: str,
    subdirectory: str,
    dest: Path,
    label: str,
    workdir: Path,
    substitutes: Sequence[Path],
    download: Download,
) -> None:
    """Put the verified tree of one archive (its ``subdirectory``, if any) at ``dest``."""
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="src-") as tmp:
        for n, archive in enumerate(_substitutes(commit, substitutes)):
            tree = _verified(archive, Path(tmp) / f"s{n}", subdirectory, want)
            if isinstance(tree, Path):
                say(
                    f"source {label}@{commit[:12]}: from substitute {archive.name} (content hash ok)"
                )
                _copy(tree, dest, subdirectory)
                return
            say(f"  refused substitute {archive}: {tree}")
        archive = Path(tmp) / "download.tar.gz"
        url = f"{repository.rstrip('/')}/archive/{commit}.tar.gz"
        length, chunks = download(url)
        progress = Progress(f"{label}@{commit[:12]}", length)
        with archive.open("wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
                progress.advance(len(chunk))
        progress.finish()
        tree = _verified(archive, Path(tmp) / "d", subdirectory, want)
        if not isinstance(tree, Path):
            raise HaloError(f"{label}: source of {commit}: {tree}; not kept")
        _copy(tree, dest, subdirectory)


def _substitutes(commit: str, folders: Sequence[Path]) -> list[Path]:
    return [
        folder / f"{commit}{suffix}"
        for folder in folders
        for suffix in ARCHIVE_SUFFIXES
        if (folder / f"{commit}{suffix}").is_file()
    ]


def _verified(archive: Path, out: Path, subdirectory: str, want: str) -> Path | str:
    """The unpacked tree whose hash is ``want``, or why not (one line)."""
    out.mkdir()
    try:
        root = unpack_archive(archive, out)
    except HaloError as exc:
        return exc.message
    tree = root / subdirectory if subdirectory else root
    if not tree.is_dir():
        return f"no folder '{subdirectory}' in it"
    got = sha256_tree(tree)
    return tree if got == want else f"content hash {got}, pin says {want}"


def _copy(tree: Path, dest: Path, subdirectory: str) -> None:
    target = dest / subdirectory if subdirectory else dest
    shutil.copytree(tree, target, symlinks=True, dirs_exist_ok=True)
