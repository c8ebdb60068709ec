"""The build context's bytes and modes do not depend on who staged it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from halo.images.context import ContextSync


def _modes(root: Path) -> dict[str, int]:
    return {
        p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in sorted(root.rglob("*"))
    }


def _stage(root: Path, umask: int) -> dict[str, int]:
    old = os.umask(umask)
    try:
        sync = ContextSync(root)
        sync.write("patches/sources/fix.py", b"x = 1\n")
        sync.write("tools/halo-normalize", b"#!/bin/sh\n", mode=0o755)
        sync.folder("kernels")
        sync.finish()
    finally:
        os.umask(old)
    return {"": stat.S_IMODE(root.stat().st_mode), **_modes(root)}


def test_a_context_staged_under_any_umask_has_the_same_modes(tmp_path: Path) -> None:
    loose, tight = _stage(tmp_path / "a", 0o002), _stage(tmp_path / "b", 0o077)
    assert loose == tight
    assert tight["patches/sources"] == tight["kernels"] == tight[""] == 0o755
    assert tight["patches/sources/fix.py"] == 0o644 and tight["tools/halo-normalize"] == 0o755


def _tree(root: Path, files: dict[str, str], links: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for rel, target in links.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(target)
    return root


def _listing(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = f"-> {p.readlink()}"
        elif p.is_file():
            out[rel] = p.read_text()
    return out


def test_mirroring_one_staged_tree_after_another_gives_exactly_the_second(tmp_path: Path) -> None:
    """The derivations' shared context: each build's staged tree mirrored into one folder.
    Unchanged files keep their inode (BuildKit sends nothing for them); a changed source file
    gets a new mtime even where the staged copy kept its archive's; paths that turned from a
    file into a folder or back, and links, come out as the second tree has them."""
    first = _tree(
        tmp_path / "one",
        {"wheels/w.whl": "wheel", "src/a.py": "a", "src/gone/x.py": "x", "src/f": "file"},
        {"src/link": "a.py"},
    )
    second = _tree(
        tmp_path / "two",
        {"src/a.py": "A", "src/gone": "now a file", "src/f/inside.py": "i"},
        {"src/link": "f/inside.py"},
    )
    os.link(first / "wheels" / "w.whl", second / "wheels.whl")  # the store's one inode
    (second / "wheels").mkdir()
    (second / "wheels.whl").rename(second / "wheels" / "w.whl")
    old = 1_600_000_000
    os.utime(second / "src" / "a.py", (old, old))  # an archive's clock, as in the first
    os.utime(first / "src" / "a.py", (old, old))

    ctx = tmp_path / "ctx"
    ContextSync(ctx).mirror(first, fresh=("src",))
    assert _listing(ctx) == _listing(first)
    wheel_inode = (ctx / "wheels" / "w.whl").stat().st_ino
    sync = ContextSync(ctx)
    sync.mirror(second, fresh=("src",))
    assert _listing(ctx) == _listing(second)
    assert (ctx / "wheels" / "w.whl").stat().st_ino == wheel_inode
    assert "wheels/w.whl" not in sync.changed and "src/a.py" in sync.changed
    assert (ctx / "src" / "a.py").stat().st_mtime > old
