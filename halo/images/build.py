"""`halo image build`: evaluate the image into a plan, then realise exactly that plan.

Two phases, as in Nix: evaluation (halo.images.evaluate.plan: a pure function of the checkout
and the platform, every node's inputs hashed once) and realisation (halo.images.realise.walk:
the nodes in dependency order, fetch, make base, derivations, build or assemble). An image
tagged with the input hash whose own input-hash label says the same is not rebuilt: the build
is a no-op that only makes sure the moving tag points at it. This module is the glue: it calls
one phase, then the other, and never mixes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from halo.images.catalog import Catalog, Image
from halo.images.docker import Docker
from halo.images.graph import AMD64, Inputs, Platform
from halo.images.realise.walk import Built, Verified
from halo.pins.names import lock_path
from halo.report import human_bytes, table

if TYPE_CHECKING:
    from halo.store.store import Store

__all__ = [
    "Built",
    "Verified",
    "build_image",
    "rehash_for_push",
    "report",
    "require_current",
    "up_to_date",
    "verify_image",
]


def build_image(
    repo: Path,
    catalog: Catalog,
    image: Image,
    store: Store,
    force: bool = False,
    platform: Platform = AMD64,
) -> Built:
    from halo.images.evaluate.plan import evaluate
    from halo.images.realise.walk import realise

    plan = evaluate(repo, catalog, image, platform)
    return realise(repo, plan, store, Docker.discover(), force=force)


def verify_image(
    repo: Path,
    catalog: Catalog,
    image: Image,
    store: Store,
    platform: Platform = AMD64,
    expect: str | None = None,
) -> Verified:
    from halo.images.evaluate.plan import evaluate
    from halo.images.realise.walk import verify

    plan = evaluate(repo, catalog, image, platform)
    return verify(repo, plan, store, Docker.discover(), expect)


def _node(image: Image, inputs: Inputs):  # type: ignore[no-untyped-def]
    """An image node with just what a lookup needs: the image, its hash, amd64."""
    from halo.images.graph import ImageNode

    return ImageNode(
        id=f"image:{image.name}@{AMD64}", image=image, platform=AMD64, inputs=inputs.parts,
        hash=inputs.hash, method="dockerfile", base="", builder=None, lock="",
        derivations=(), build_args={}, labels={}, deps=(),
    )  # fmt: skip


def up_to_date(docker: Docker, image: Image, inputs: Inputs) -> str | None:
    from halo.images.realise.build import up_to_date as found

    return found(docker, _node(image, inputs))


def require_current(docker: Docker, image: Image, inputs: Inputs) -> str:
    from halo.images.realise.build import require_current as current

    return current(docker, _node(image, inputs))


def rehash_for_push(repo: Path, image: Image, platform: Platform = AMD64) -> None:
    """Before anything leaves the machine: every stored artifact of the image's lock hashed
    again (a stamp spares the hash for a build, not for a push)."""
    from halo.images.graph import set_for
    from halo.paths import store_root
    from halo.pins.lockfile import load_lock
    from halo.store.store import Store

    store = Store(store_root())
    lock = load_lock(lock_path(repo / "pins", set_for(image.pins, platform)))
    for art in lock.artifacts:
        store.verify(art.sha256, art.file, fix=f"halo fetch {lock.set}", rehash=True)


def report(built: list[Built], docker: Docker) -> str:
    rows = []
    for b in built:
        size = str((docker.find(b.image_id) or {}).get("Size", "?"))
        rows.append(
            (
                b.moving_ref,
                b.immutable_ref.split(":", 1)[1],
                "built" if b.rebuilt else "up to date",
                b.image_id[:19],
                human_bytes(int(size)) if size.isdigit() else size,
                f"{b.seconds:.2f}s",
            )
        )
    return table(("image", "immutable tag", "result", "image ID", "size", "time"), rows)
