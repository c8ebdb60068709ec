"""Find and load patch modules: one ``*.py`` per patch, each defining ``PATCH``."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from halo.errors import HaloError
from halo.patching.model import Patch

ENV_VAR = "HALO_PATCHES"


def patches_dir(explicit: Path | None = None) -> Path:
    """``--patches DIR``, else $HALO_PATCHES, else <repo>/patches."""
    if explicit is not None:
        found = explicit
    elif env := os.environ.get(ENV_VAR):
        found = Path(env)
    else:
        from halo.paths import Layout, find_repo

        found = Layout(find_repo()).patches
    if not found.is_dir():
        raise HaloError(f"{found}: patches directory does not exist (expected one *.py per patch)")
    return found


def _load_one(path: Path) -> Patch:
    # A unique module name per file: two patch folders may hold modules of the same name.
    spec = importlib.util.spec_from_file_location(f"halo_patch_{path.stem}_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise HaloError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a broken patch module is bad input, reported as one line
        raise HaloError(f"{path}: failed to load: {type(exc).__name__}: {exc}") from exc
    patch = getattr(module, "PATCH", None)
    if not isinstance(patch, Patch):
        raise HaloError(
            f"{path}: PATCH: expected a halo.patching.Patch, found {type(patch).__name__}"
        )
    try:
        SpecifierSet(patch.versions)
    except InvalidSpecifier as exc:
        raise HaloError(
            f"{path}: PATCH.versions: expected a version specifier, got {patch.versions!r}"
        ) from exc
    if not patch.edits:
        raise HaloError(f"{path}: PATCH.edits: expected at least one edit")
    if not (module.__doc__ or "").strip():
        raise HaloError(
            f"{path}: module docstring: expected the defect, its symptom and the upstream fix"
        )
    return Patch(**{**patch.__dict__, "source": path.name})


def load_patches(directory: Path) -> list[Patch]:
    """Every patch in ``directory``, ordered by file name (the order they are applied in)."""
    patches = [_load_one(p) for p in sorted(directory.glob("*.py")) if not p.name.startswith("_")]
    seen: dict[str, str] = {}
    for patch in patches:
        if patch.name in seen:
            raise HaloError(
                f"{directory / patch.source}: PATCH.name: {patch.name!r} is also used by {seen[patch.name]}"
            )
        seen[patch.name] = patch.source
    return patches
