"""A base's recipe and its hash: the catalog entry, its OS lock and the code that makes it.

A made base is addressed by its recipe: its tag carries the recipe hash, its config carries it
in full (BASE_LABEL), and the recipe hash, never an image ID made here, is what every image
and derivation on it hashes. So a plan is the same before and after `halo image base`, and on
a host with no engine. The platform is part of the recipe (linux/arm64's OS lock pins arm64
.debs); amd64's recipe is written as it was before there was a second platform.
"""

from __future__ import annotations

from pathlib import Path

from halo.errors import HaloError
from halo.hashing import sha256_file, sha256_json
from halo.images.catalog_types import Base
from halo.images.graph import AMD64, MOUNT_POINTS, Platform, base_lock_name
from halo.pins.deblock import DebInputs, deb_lock_path

# How a base is made from its lock (mmdebstrap, the archive around its root): a change to it
# is a new base. Read as bytes; evaluation imports nothing from realisation.
MAKE_CODE = Path(__file__).resolve().parents[1] / "realise" / "base.py"


def deb_inputs(base: Base, platform: Platform = AMD64) -> DebInputs:
    """What the base's OS lock is resolved for on ``platform``."""
    return DebInputs(
        base_lock_name(base.name, platform),
        base.suite,
        base.variant,
        tuple(sorted(base.packages)),
        platform.deb_arch,
    )


def os_lock_file(base: Base, repo: Path, platform: Platform = AMD64) -> Path:
    name = base_lock_name(base.name, platform)
    path = deb_lock_path(repo / "pins", name)
    if not path.is_file():
        raise HaloError(f"{path}: OS lock not found; run `halo pins lock --os {name}`")
    return path


def recipe_definition(base: Base, repo: Path, platform: Platform = AMD64) -> dict[str, object]:
    definition: dict[str, object] = dict(base.definition)
    definition["mount_points"] = list(MOUNT_POINTS)
    definition["os_lock_sha256"] = sha256_file(os_lock_file(base, repo, platform))
    definition["make_sha256"] = sha256_file(MAKE_CODE)
    if platform != AMD64:
        definition["platform"] = str(platform)
    return definition


def recipe_hash(base: Base, repo: Path, platform: Platform = AMD64) -> str:
    return sha256_json(recipe_definition(base, repo, platform))


def base_ref(base: Base, repo: Path, platform: Platform = AMD64) -> str:
    """The base's tag: its name (and platform) and its recipe hash."""
    name = base_lock_name(base.name, platform)
    return f"halo-base/{name}:{recipe_hash(base, repo, platform)[:12]}"
