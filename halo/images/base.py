"""Bases, by their old names: the recipe is evaluation, making one is realisation.

The recipe and its hash live in halo.images.evaluate.bases; making a base (fetch its .debs,
mmdebstrap offline, load) in halo.images.realise.base. The functions below keep the former
signatures (a catalog Base and the repository), evaluating the base's node and handing it to
realisation: for callers outside the build, which evaluates once and walks its plan.
"""

from __future__ import annotations

from pathlib import Path

from halo.images.catalog_types import Base
from halo.images.docker import Docker
from halo.images.evaluate.bases import base_ref, deb_inputs, os_lock_file, recipe_hash
from halo.images.graph import (
    AMD64,
    BASE_LABEL,
    DEFAULT_EPOCH,
    MOUNT_POINTS,
    FetchDebs,
    MakeBase,
    Platform,
    source_date_epoch,
)
from halo.images.realise import base as made
from halo.images.realise.base import (
    INSTALLED_FORMAT,
    SOURCES_NOTE,
    BaseState,
    base_archive,
    fetch_debs,
    flat_repository,
    make_rootfs,
    mount_points_tar,
)
from halo.pins.deblock import DebLock

__all__ = [
    "BASE_LABEL",
    "DEFAULT_EPOCH",
    "INSTALLED_FORMAT",
    "MOUNT_POINTS",
    "SOURCES_NOTE",
    "BaseState",
    "base_archive",
    "base_ref",
    "base_state",
    "checked_lock",
    "deb_inputs",
    "fetch_debs",
    "flat_repository",
    "make_base",
    "make_rootfs",
    "mount_points_tar",
    "os_lock_file",
    "recipe_hash",
    "source_date_epoch",
]


def nodes(base: Base, repo: Path, platform: Platform = AMD64) -> tuple[FetchDebs, MakeBase]:
    from halo.images.evaluate.plan import base_nodes

    return base_nodes(repo, base, platform)


def base_state(base: Base, repo: Path, docker: Docker | None) -> BaseState:
    return made.base_state(nodes(base, repo)[1], docker)


def make_base(base: Base, repo: Path, docker: Docker, workdir: Path) -> BaseState:
    fetch, node = nodes(base, repo)
    return made.make_base(node, fetch, repo, docker, workdir)


def checked_lock(base: Base, repo: Path) -> DebLock:
    return made.checked_lock(nodes(base, repo)[0], repo)


def _same_as_lock(base: Base, lock: DebLock, installed: Path) -> None:
    made._same_as_lock(base.name, lock, installed)
