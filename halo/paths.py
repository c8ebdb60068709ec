"""Where things live: the repository checkout, the store, caches, scratch space."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError

# The host's own folders live below this module (the trainer imports them; it may not import
# what Layout reaches); re-exported here, where the rest of Halo has always found them.
from halo.scratch import cache_home as cache_home
from halo.scratch import scratch_choice as scratch_choice
from halo.scratch import scratch_root as scratch_root

REPO_MARKERS = ("images/images.yaml", "pins")


def find_repo(start: Path | None = None) -> Path:
    """The checkout that holds images/ and pins/: $HALO_REPO, else the nearest parent of cwd."""
    if env := os.environ.get("HALO_REPO"):
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for cand in (here, *here.parents):
        # lexists: a marker that is there but broken (a symlink loop) still marks the
        # checkout, so the reader of that file names what is wrong with it.
        if all(os.path.lexists(cand / m) for m in REPO_MARKERS):
            return cand
    raise HaloError(
        f"{here}: not inside a Halo checkout (no images/images.yaml above it); set HALO_REPO"
    )


@dataclass(frozen=True)
class Layout:
    """The directories of one checkout. Derived from the repo root; nothing global."""

    repo: Path

    @property
    def pins(self) -> Path:
        return self.repo / "pins"

    @property
    def images(self) -> Path:
        return self.repo / "images"

    @property
    def patches(self) -> Path:
        return self.repo / "patches"

    @property
    def package(self) -> Path:
        return self.repo / "halo"

    def lock(self, set_name: str) -> Path:
        from halo.pins.names import lock_path

        return lock_path(self.pins, set_name)


def store_root() -> Path:
    return Path(os.environ.get("HALO_STORE") or cache_home() / "store")


VENVS_ENV = "HALO_STACK_VENVS"


def venvs_root(explicit: Path | None = None) -> Path:
    """Where `halo stack verify` keeps the stacks' venvs (and the rollout tiers find them)."""
    if explicit is not None:
        return explicit
    if env := os.environ.get(VENVS_ENV):
        return Path(env)
    return scratch_root() / "stacks"


def per_engine(root: Path) -> Path:
    """``root`` for the default Docker engine, ``root/engine-KEY`` for another ($DOCKER_HOST).

    What is kept for one engine (the build contexts BuildKit syncs by path, the lock that
    makes a base once) is not another's: two engines of one run must not share them.
    """
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return root
    import hashlib

    return root / f"engine-{hashlib.sha256(host.encode()).hexdigest()[:12]}"
