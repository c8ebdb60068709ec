"""Walk a plan in dependency order: fetch, make bases, realise derivations, build the image.

An image whose input hash is already built here (tagged with it, and carrying it in full in
its label) is not rebuilt: the walk stops at its first step, a lookup, and only makes sure the
moving tag points at it (a no-op build takes well under a second). Otherwise each node is
realised once, after what it needs: a base only if it is not made here, a derivation only if
its wheel is not in the store. Nothing here evaluates: every hash comes from the plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halo.errors import HaloError
from halo.images.docker import Docker
from halo.images.graph import (
    DerivationNode,
    FetchDebs,
    FetchWheels,
    ImageNode,
    Inputs,
    MakeBase,
    Plan,
)
from halo.images.realise.build import up_to_date
from halo.report import say

if TYPE_CHECKING:
    from halo.images.catalog_types import Image
    from halo.images.graph import Platform
    from halo.pins.lockfile import Lock
    from halo.store.store import Store


@dataclass(frozen=True)
class Built:
    image: Image
    platform: Platform
    inputs: Inputs
    image_id: str
    rebuilt: bool
    seconds: float
    moving_ref: str
    immutable_ref: str


def _built(node: ImageNode, image_id: str, rebuilt: bool, start: float) -> Built:
    return Built(
        node.image,
        node.platform,
        Inputs(node.inputs),
        image_id,
        rebuilt,
        time.monotonic() - start,
        node.moving_ref,
        node.immutable_ref,
    )


def realise(repo: Path, plan: Plan, store: Store, docker: Docker, force: bool = False) -> Built:
    """The plan's image on this machine: found, or made from its nodes in order."""
    start = time.monotonic()
    target = plan.target
    existing = None if force else up_to_date(docker, target)
    if existing:
        if docker.image_id(target.moving_ref) != existing:
            docker.tag(target.immutable_ref, target.moving_ref)
        return _built(target, existing, False, start)
    docker.ping()  # not on the no-op path: the lookup above would have failed already
    from halo.images.realise.build import planned_lock

    wheels = plan.node(target.lock)
    assert isinstance(wheels, FetchWheels)
    lock = planned_lock(repo, wheels)  # a broken lock fails before anything is fetched
    make_bases(repo, plan, docker)
    fetch(lock, store)
    kernel_wheels = realise_derivations(repo, plan, store, docker)
    if target.method == "assemble":
        from halo.images.realise.assemble import assemble

        image_id = assemble(repo, plan, lock, store, docker, kernel_wheels)
    else:
        image_id = build_dockerfile(repo, target, lock, store, docker, kernel_wheels, force)
    return _built(target, image_id, True, start)


def make_bases(repo: Path, plan: Plan, docker: Docker) -> None:
    """Every base node not made here yet: its .debs fetched, then made offline."""
    from halo.images.realise.base import make_base
    from halo.paths import cache_home

    for node in plan.nodes:
        if isinstance(node, MakeBase):
            fetch_node = plan.node(node.deps[0])
            assert isinstance(fetch_node, FetchDebs)
            make_base(node, fetch_node, repo, docker, cache_home() / "work")


def fetch(lock: Lock, store: Store) -> None:
    """The lock's artifacts into the store: the only step of a build that uses the index."""
    from halo.sources import index_urls, substitute_dirs
    from halo.store.fetch import fetch_lock, summary
    from halo.store.index import IndexClient

    print(summary(lock.set, fetch_lock(lock, store, IndexClient(index_urls()), substitute_dirs())))


def realise_derivations(
    repo: Path, plan: Plan, store: Store, docker: Docker
) -> list[tuple[Path, str]]:
    """The plan's source derivations: (wheel, sha256) for the kernels layer."""
    drvs = [n for n in plan.nodes if isinstance(n, DerivationNode)]
    if not drvs:
        return []
    from halo.cache.config import configured_cache
    from halo.images.realise.derivation import realise as realise_one
    from halo.images.realise.derivation import realiser

    r = realiser(repo, store, docker, configured_cache())
    return [(x.wheel, x.sha256) for x in (realise_one(d, r) for d in drvs)]


def build_dockerfile(
    repo: Path,
    node: ImageNode,
    lock: Lock,
    store: Store,
    docker: Docker,
    kernel_wheels: list[tuple[Path, str]],
    force: bool,
) -> str:
    """BuildKit runs the Dockerfile; the result is normalised and tagged."""
    from halo.images.realise.build import (
        dockerfile_recipe,
        load_normalized,
        normalize_image,
        run_dockerfile,
    )

    recipe = dockerfile_recipe(repo, node, docker.builder, no_cache=force)
    raw_id = run_dockerfile(repo, node, recipe, lock, store, kernel_wheels)
    norm = normalize_image(docker, raw_id, repo / node.image.dockerfile, node.build_args["BASE"])
    load_normalized(docker, norm, [node.immutable_ref, node.moving_ref])
    say(f"build {node.moving_ref}: {norm.image_id[:19]} (build times set to SOURCE_DATE_EPOCH)")
    return norm.image_id


@dataclass(frozen=True)
class Verified:
    image: Image
    expected: str
    rebuilt: str
    layers: list[int] | None  # indexes of layers that differ; None: the expected is not here

    @property
    def same(self) -> bool:
        return self.expected == self.rebuilt


def verify(
    repo: Path, plan: Plan, store: Store, docker: Docker, expect: str | None = None
) -> Verified:
    """Rebuild from scratch (no layer cache) and compare image IDs with the image built here,
    or with ``expect``, an ID built elsewhere (its layers are compared where it is here too).

    Nothing is tagged: the rebuild's raw image is dropped once its normalised ID is known.
    """
    from halo.images.realise.build import (
        dockerfile_recipe,
        normalize_image,
        planned_lock,
        require_current,
        run_dockerfile,
    )

    docker.ping()
    target = plan.target
    expected = expect or require_current(docker, target)
    if target.method != "dockerfile":
        raise HaloError(
            f"halo image verify {target.image.name}: {plan.platform} images are assembled; "
            "`halo image build --force` assembles again and compares"
        )
    wheels = plan.node(target.lock)
    assert isinstance(wheels, FetchWheels)
    lock = planned_lock(repo, wheels)
    fetch(lock, store)
    kernel_wheels = realise_derivations(repo, plan, store, docker)
    recipe = dockerfile_recipe(repo, target, docker.builder, no_cache=True)
    raw_id = run_dockerfile(repo, target, recipe, lock, store, kernel_wheels)
    norm = normalize_image(
        docker, raw_id, repo / target.image.dockerfile, target.build_args["BASE"]
    )
    if raw_id != expected:
        docker.remove(raw_id)
    found = docker.find(expected)
    if found is None:
        return Verified(target.image, expected, norm.image_id, None)
    ours = list(found["RootFS"]["Layers"])
    n = max(len(ours), len(norm.layers))
    differ = [i for i in range(n) if ours[i : i + 1] != norm.layers[i : i + 1]]
    return Verified(target.image, expected, norm.image_id, differ)
