"""Patches to a source tree before it is built: the engine of site patches, on a build's copy.

A source pin's build script may reach the network or run `git` (FA3's ``hopper/setup.py``
downloads nvcc and ptxas; DeepEP asks git for its version). Those fixes live in
``patches/sources/`` (one module per patch, the same ``Patch`` model and states), apart from
the site patches, which the images apply to installed packages. A source tree has no
``*.dist-info``: the distribution and version are the pin's, and file paths are relative to
the repository root of the pin (``hopper/setup.py``, not ``setup.py``).

Applied strictly to the derivation's private copy of the verified tree: drift (neither the
defect nor the fix nor an upstream fix found) fails the derivation and writes nothing.
What they do (halo.patching.source.fingerprint) is an input of the derivation hash.
"""

from __future__ import annotations

from pathlib import Path

from halo.errors import HaloError
from halo.hashing import sha256_json
from halo.patching.engine import drift_lines, plan_patch, write_plans
from halo.patching.loader import load_patches
from halo.patching.model import Patch, Result
from halo.patching.site import Installed, normalize

SOURCE_PATCHES = "sources"  # patches/sources/


def source_patches(patches_dir: Path, distribution: str) -> list[Patch]:
    """The patches in ``patches/sources/`` for one distribution, in file-name order."""
    folder = patches_dir / SOURCE_PATCHES
    if not folder.is_dir():
        return []
    wanted = normalize(distribution)
    return [p for p in load_patches(folder) if normalize(p.distribution) == wanted]


def fingerprint(patches: list[Patch]) -> dict[str, str]:
    """{patch name: sha256 of what it does}: what the derivation hash records of its patches.

    What it does is the version range, the edits and the upstream markers: rewording a
    patch's documentation rebuilds nothing, changing a snippet rebuilds what it patches.
    """
    return {
        p.name: sha256_json(
            {
                "distribution": normalize(p.distribution),
                "versions": p.versions,
                "edits": [[e.file, e.defect, e.fix, e.count] for e in p.edits],
                "fixed_upstream": [[m.file, m.pattern] for m in p.fixed_upstream],
            }
        )
        for p in patches
    }


def patch_tree(tree: Path, distribution: str, version: str, patches: list[Patch]) -> list[Result]:
    """Apply ``patches`` to ``tree`` as the given distribution and version, strictly.

    Every patch is first decided on the untouched tree (drift anywhere writes nothing); then
    each is decided again and written in turn, since two patches may edit the same file
    (a plan holds a whole file's new bytes).
    """
    installed = Installed(distribution, version, tree, frozenset())
    if drift := drift_lines([plan_patch(p, tree, installed).result for p in patches]):
        raise HaloError(f"source {distribution} {version}: {drift[0]}")
    results = []
    for patch in patches:
        plan = plan_patch(patch, tree, installed)
        write_plans([plan])
        results.append(plan.result)
    return results
