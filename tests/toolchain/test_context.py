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
