"""`halo image build`: fetch phase (base, artifacts, derivations), then an offline BuildKit build.

An image whose input hash is already tagged here is not rebuilt: the build is a no-op that
only makes sure the moving tag points at it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from halo import __version__
from halo.atomic import staged_dir
from halo.images.base import base_state, make_base, recipe_hash
from halo.images.catalog import Catalog, Image
from halo.images.context import stage_context
from halo.images.derivations import BUILDER_VAR
from halo.images.docker import Docker
from halo.images.inputs import Inputs, image_inputs
from halo.paths import cache_home
from halo.pins.lockfile import load_lock, lock_path
from halo.report import human_bytes, say, table
from halo.sources import index_urls, substitute_dirs
from halo.store.fetch import fetch_lock, summary
from halo.store.index import IndexClient
from halo.store.store import Store

LABEL_PREFIX = "org.opencontainers.image"


@dataclass(frozen=True)
class Built:
    image: Image
    inputs: Inputs
    image_id: str
    rebuilt: bool
    seconds: float


def resolve_inputs(repo: Path, catalog: Catalog, image: Image, docker: Docker | None) -> Inputs:
    base = catalog.bases[image.base]
    builder = catalog.bases[image.builder] if image.builder else None
    inputs = image_inputs(
        repo,
        image,
        base_state(base, repo, docker),
        recipe_hash(base, repo),
        base_state(builder, repo, docker) if builder else None,
        recipe_hash(builder, repo) if builder else None,
        build_args={
            "PYTHON": base.python,
            "CUDA_ARCH": ";".join(image.cuda_arch),
            **dict(image.args),
        },
    )
    if not image.sources:
        return inputs
    # The kernels layer is what its derivations made: their hashes (toolchain included).
    from halo.images.derivations import derivation_hash, image_derivations

    drvs = image_derivations(repo, catalog, image, docker)
    return Inputs({**inputs.parts, "derivations": {d.name: derivation_hash(d, repo) for d in drvs}})


def labels(repo: Path, image: Image, inputs: Inputs) -> dict[str, str]:
    """The OCI labels baked into the image config: only what the inputs determine.

    The same inputs must give the same config, so where the source came from (revision,
    repository URL: per commit, per clone, and possibly carrying a token) is not here: it is
    an annotation on the manifest at push time (`halo.images.provenance`).
    """
    del repo  # kept for callers; nothing about the checkout but its inputs reaches the image
    return {
        f"{LABEL_PREFIX}.title": image.moving_ref,
        f"{LABEL_PREFIX}.version": __version__,
        "io.halo.input-hash": inputs.hash,
    }


def build_image(
    repo: Path, catalog: Catalog, image: Image, store: Store, force: bool = False
) -> Built:
    start = time.monotonic()
    docker = Docker.discover()
    load_lock(
        lock_path(repo / "pins", image.pins)
    )  # a missing or broken lock fails before anything else
    docker.ping()
    inputs = resolve_inputs(repo, catalog, image, docker)
    immutable = image.immutable_ref(inputs.hash)
    existing = docker.image_id(immutable)
    if existing and not force:
        if docker.image_id(image.moving_ref) != existing:
            docker.tag(immutable, image.moving_ref)
        return Built(image, inputs, existing, rebuilt=False, seconds=time.monotonic() - start)

    # Fetch phase: the only part that may use the network.
    work = cache_home() / "work"
    base = make_base(catalog.bases[image.base], repo, docker, work)
    if image.builder and os.environ.get(BUILDER_VAR) == "docker":
        # Derivations compile natively (network-less namespaces) unless Docker is asked for.
        make_base(catalog.bases[image.builder], repo, docker, work)
    inputs = resolve_inputs(repo, catalog, image, docker)  # the base may have just been made
    immutable = image.immutable_ref(inputs.hash)
    lock = load_lock(lock_path(repo / "pins", image.pins))
    print(summary(lock.set, fetch_lock(lock, store, IndexClient(index_urls()), substitute_dirs())))
    kernel_wheels = build_derivations(repo, catalog, image, store, docker)

    # Build phase: offline.
    build_inputs = {
        "image": image.name,
        "image_ref": immutable,
        "input_hash": inputs.hash,
        "inputs": inputs.parts,
        "base_ref": base.ref,
        "halo_version": __version__,
    }
    with staged_dir(cache_home() / "contexts" / image.name) as ctx:
        say(
            f"build {image.moving_ref}: staging context (verifying {len(lock.artifacts)} artifacts)"
        )
        stage_context(
            ctx,
            repo,
            lock,
            store,
            kernel_wheels,
            build_inputs,
            image_dir=(repo / image.dockerfile).parent,
        )
        say(f"build {image.moving_ref}: docker build --network none ({image.dockerfile})")
        image_id = docker.build(
            context=ctx,
            dockerfile=repo / image.dockerfile,
            tags=[immutable, image.moving_ref],
            build_args={
                "BASE": base.ref,
                "PYTHON": catalog.bases[image.base].python,
                **dict(image.args),
            },
            labels=labels(repo, image, inputs),
            network="none",
            no_cache=force,  # a forced rebuild starts from scratch, or it would only replay the cache
        )
    return Built(image, inputs, image_id, rebuilt=True, seconds=time.monotonic() - start)


def build_derivations(
    repo: Path, catalog: Catalog, image: Image, store: Store, docker: Docker
) -> list[tuple[Path, str]]:
    if not image.sources:
        return []
    from halo.images.derivations import build_sources

    return build_sources(repo, catalog, image, store, docker)


def report(built: list[Built], docker: Docker) -> str:
    rows = []
    for b in built:
        size = docker.inspect(b.image.moving_ref, "{{.Size}}")
        rows.append(
            (
                b.image.moving_ref,
                b.image.immutable_ref(b.inputs.hash).split(":", 1)[1],
                "built" if b.rebuilt else "up to date",
                human_bytes(int(size)) if size.isdigit() else size,
                f"{b.seconds:.2f}s",
            )
        )
    return table(("image", "immutable tag", "result", "size", "time"), rows)
