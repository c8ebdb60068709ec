"""`halo clean`: drop caches and test scratch; never a checkpoint.

Removed: the checkout's tool caches (`__pycache__`, `.pytest_cache`, `.ruff_cache`, `build/`,
`dist/`, `*.egg-info`) and, under $HALO_SCRATCH, what tiers and tests leave (`reports/`,
`tmp/`, `home/`, `export/`). Kept, always: anything at or under a folder named `checkpoints`
(a trainer's, wherever its config put it), the seeded Hugging Face cache (`hf/`), `runs/`,
and the nox environments (`.nox/`: slow to rebuild; delete it by hand if you mean to).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

REPO_CACHES = (".pytest_cache", ".ruff_cache", "build", "dist")
SCRATCH_CACHES = ("reports", "tmp", "home", "export")
PROTECTED = "checkpoints"
_SKIP_WALK = {".git", ".nox", ".venv", "runs", "node_modules"}


@dataclass(frozen=True)
class Removal:
    path: Path
    kept: tuple[Path, ...]  # checkpoint folders found inside and left in place


def _checkpoints_in(path: Path) -> list[Path]:
    if path.name == PROTECTED:
        return [path]
    if not path.is_dir() or path.is_symlink():
        return []
    return sorted(p for p in path.rglob(PROTECTED) if p.is_dir())


def _remove(path: Path) -> Removal:
    """Remove ``path``, except any checkpoints folder inside it (and the folders above those)."""
    keep = _checkpoints_in(path)
    if not keep:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        return Removal(path, ())
    for child in sorted(path.iterdir()):
        if any(child == k or child in k.parents for k in keep):
            if child.name != PROTECTED:
                _remove(child)
            continue
        _remove(child)
    return Removal(path, tuple(keep))


def targets(repo: Path, scratch: Path) -> list[Path]:
    found = [repo / name for name in REPO_CACHES if (repo / name).exists()]
    stack = [repo]
    while stack:
        folder = stack.pop()
        for child in folder.iterdir():
            if not child.is_dir() or child.is_symlink() or child.name in _SKIP_WALK:
                continue
            if child.name == "__pycache__" or child.name.endswith(".egg-info"):
                found.append(child)
            elif child not in found:
                stack.append(child)
    found += [scratch / name for name in SCRATCH_CACHES if (scratch / name).exists()]
    return sorted(found)


def clean(repo: Path, scratch: Path, dry_run: bool = False) -> list[Removal]:
    paths = targets(repo, scratch)
    if dry_run:
        return [Removal(p, tuple(_checkpoints_in(p))) for p in paths]
    return [_remove(p) for p in paths]
