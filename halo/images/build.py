"""`halo image build`: fetch phase (base, artifacts, derivations), then an offline BuildKit build.

The input hash is computed from the files every time; an image tagged with it whose own
input-hash label says the same is not rebuilt: the build is a no-op that only makes sure the
moving tag points at it. A build's result is normalised (halo.images.reproducible), so the
same inputs give the same image ID on any machine; `halo image verify` rebuilds from scratch
and compares.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halo import __version__
from halo.errors import HaloError, os_error
from halo.images.base import base_ref, base_state, make_base, recipe_hash, source_date_epoch
from halo.images.catalog import Catalog, Image
from halo.images.docker import Docker
from halo.images.inputs import Inputs, image_inputs
from halo.paths import cache_home
from halo.pins.names import lock_path
from halo.report import human_bytes, say, table

if TYPE_CHECKING:
    from halo.pins.lockfile import Lock
    from halo.store.store import Store

# The fetch and build phases import what they need when they run: a no-op build (the common
# case, budgeted well under a second) pays only for computing the input hash and one lookup.

LABEL_PREFIX = "org.opencontainers.image"
INPUT_LABEL = "io.halo.input-hash"


@dataclass(frozen=True)
class Built:
    image: Image
    inputs: Inputs
    image_id: str
    rebuilt: bool
    seconds: float


def build_args(catalog: Catalog, image: Image, repo: Path) -> dict[str, str]:
    """The Dockerfile's build arguments; the plan prints the same."""
    base = catalog.bases[image.base]
    return {
        "BASE": base_ref(base, repo),
        "PYTHON": base.python,
        "SOURCE_DATE_EPOCH": str(source_date_epoch()),
        **dict(image.args),
    }


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
            "SOURCE_DATE_EPOCH": str(source_date_epoch()),
            **dict(image.args),
        },
    )
    if not image.sources:
        return inputs
    # The kernels layer is what its derivations made: their hashes (toolchain included).
    from halo.images.derivations import derivation_hash, image_derivations

    drvs = image_derivations(repo, catalog, image, docker)
    return Inputs({**inputs.parts, "derivations": {d.name: derivation_hash(d, repo) for d in drvs}})


def labels(image: Image, inputs: Inputs) -> dict[str, str]:
    """The OCI labels baked into the image config: only what the inputs determine.

    Labels are part of the image ID. Where the source came from (revision, repository URL: per
    commit, per clone) is an annotation on the manifest at push time (halo.images.provenance).
    """
    return {
        f"{LABEL_PREFIX}.title": image.moving_ref,
        f"{LABEL_PREFIX}.version": __version__,
        INPUT_LABEL: inputs.hash,
    }


def up_to_date(docker: Docker, image: Image, inputs: Inputs) -> str | None:
    """The ID of the image built from exactly ``inputs``, if there is one here.

    The hash was just recomputed from the files; the image must be tagged with it and carry
    it in full (a short tag alone could be moved by hand, or collide).
    """
    found = docker.id_and_label(image.immutable_ref(inputs.hash), INPUT_LABEL)
    if found is None or found[1] != inputs.hash:
        return None
    return found[0]


def current_image(repo: Path, catalog: Catalog, image: Image, docker: Docker) -> tuple[Inputs, str]:
    """(inputs, image ID) of the image the checkout builds now; refuses a stale or missing one.

    What a push publishes is decided by the input hash recomputed from the files, never by a
    label read back from an image.
    """
    inputs = resolve_inputs(repo, catalog, image, docker)
    image_id = up_to_date(docker, image, inputs)
    if image_id is None:
        raise HaloError(
            f"{image.immutable_ref(inputs.hash)}: not built from this checkout's inputs; "
            f"run `halo image build {image.name}`"
        )
    return inputs, image_id


def rehash_for_push(repo: Path, image: Image) -> None:
    """Before anything leaves the machine: every stored artifact of the image's lock hashed
    again (a stamp spares the hash for a build, not for a push)."""
    from halo.paths import store_root
    from halo.pins.lockfile import load_lock
    from halo.store.store import Store

    store = Store(store_root())
    lock = load_lock(lock_path(repo / "pins", image.pins))
    for art in lock.artifacts:
        store.verify(art.sha256, art.file, fix=f"halo fetch {lock.set}", rehash=True)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """One build of an image at a time per context (two would overwrite each other's files)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = path.open("a")
    except OSError as exc:
        raise os_error(exc, path, "write the build context") from None
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield


def fetch_phase(
    repo: Path, catalog: Catalog, image: Image, store: Store, docker: Docker
) -> tuple[Lock, list[tuple[Path, str]]]:
    """Everything that may use the network: the base, the lock's artifacts, the derivations."""
    from halo.images.derivations import BUILDER_VAR
    from halo.pins.lockfile import load_lock
    from halo.sources import index_urls, substitute_dirs
    from halo.store.fetch import fetch_lock, summary
    from halo.store.index import IndexClient

    work = cache_home() / "work"
    make_base(catalog.bases[image.base], repo, docker, work)
    if image.builder and os.environ.get(BUILDER_VAR) == "docker":
        # Derivations compile natively (network-less namespaces) unless Docker is asked for.
        make_base(catalog.bases[image.builder], repo, docker, work)
    lock = load_lock(lock_path(repo / "pins", image.pins))
    print(summary(lock.set, fetch_lock(lock, store, IndexClient(index_urls()), substitute_dirs())))
    return lock, build_derivations(repo, catalog, image, store, docker)


def raw_build(
    repo: Path,
    catalog: Catalog,
    image: Image,
    store: Store,
    docker: Docker,
    inputs: Inputs,
    lock: Lock,
    kernel_wheels: list[tuple[Path, str]],
    no_cache: bool,
) -> str:
    """Stage the context and run the offline build; returns BuildKit's (untagged) image ID."""
    from halo.images.context import stage_context

    immutable = image.immutable_ref(inputs.hash)
    build_inputs = {
        "image": image.name,
        "image_ref": immutable,
        "input_hash": inputs.hash,
        "inputs": inputs.parts,
        "base_ref": base_ref(catalog.bases[image.base], repo),
        "halo_version": __version__,
    }
    ctx = cache_home() / "contexts" / image.name
    with _exclusive(ctx.with_name(f".{image.name}.lock")):
        say(
            f"build {image.moving_ref}: staging context (verifying {len(lock.artifacts)} artifacts)"
        )
        changed = stage_context(
            ctx,
            repo,
            lock,
            store,
            kernel_wheels,
            build_inputs,
            image_dir=(repo / image.dockerfile).parent,
            fix=f"halo fetch {lock.set}",
        )
        say(f"build {image.moving_ref}: context {ctx} ({len(changed)} paths changed)")
        say(f"build {image.moving_ref}: docker build --network none ({image.dockerfile})")
        return docker.build(
            context=ctx,
            dockerfile=repo / image.dockerfile,
            tags=[],
            build_args=build_args(catalog, image, repo),
            labels=labels(image, inputs),
            network="none",
            no_cache=no_cache,  # from scratch: otherwise it would only replay the cache
        )


@dataclass(frozen=True)
class Normalized:
    raw_id: str  # what BuildKit made
    config: bytes  # the same image with build times replaced by SOURCE_DATE_EPOCH
    image_id: str  # sha256 of config
    layers: list[str]  # diff IDs


def normalize_image(docker: Docker, raw_id: str, dockerfile: Path, base: str) -> Normalized:
    from halo.images.reproducible import layer_history, normalized_config

    info = docker.inspect_json(raw_id)
    layers = list(info["RootFS"]["Layers"])
    history = layer_history(dockerfile.read_text(), len(layers), f"base {base}")
    config, image_id = normalized_config(info, source_date_epoch(), history)
    return Normalized(raw_id, config, image_id, layers)


def load_normalized(docker: Docker, norm: Normalized, tags: list[str]) -> None:
    """Load the normalised config under ``tags`` (layers are reused) and drop the raw image."""
    from halo.images.reproducible import docker_archive

    with tempfile.TemporaryDirectory(prefix="halo-config-") as tmp:
        archive = Path(tmp) / "image.tar"
        docker_archive(
            archive, norm.config, tags, [(d, None) for d in norm.layers], source_date_epoch()
        )
        docker.load(archive)
    got = docker.image_id(tags[0])
    if got != norm.image_id:
        raise HaloError(
            f"{tags[0]}: loaded as {got}, expected {norm.image_id}; the engine changed the config"
        )
    if norm.raw_id != norm.image_id:
        docker.remove(norm.raw_id)


def build_image(
    repo: Path, catalog: Catalog, image: Image, store: Store, force: bool = False
) -> Built:
    start = time.monotonic()
    docker = Docker.discover()
    # A missing lock fails here (its bytes are an input); a broken one before anything is
    # fetched. An image built from these same bytes (and this same halo) parsed them already.
    inputs = resolve_inputs(repo, catalog, image, docker)
    existing = None if force else up_to_date(docker, image, inputs)
    if existing:
        if docker.image_id(image.moving_ref) != existing:
            docker.tag(image.immutable_ref(inputs.hash), image.moving_ref)
        return Built(image, inputs, existing, rebuilt=False, seconds=time.monotonic() - start)
    docker.ping()  # not on the no-op path: the lookups above would have failed already
    from halo.pins.lockfile import load_lock

    load_lock(lock_path(repo / "pins", image.pins))
    if time.time() < source_date_epoch():
        raise HaloError(
            f"SOURCE_DATE_EPOCH={source_date_epoch()} is in the future of this machine's clock; "
            "reproducible layers need it in the past"
        )

    lock, kernel_wheels = fetch_phase(repo, catalog, image, store, docker)
    inputs = resolve_inputs(repo, catalog, image, docker)  # the base may have just been made
    raw_id = raw_build(repo, catalog, image, store, docker, inputs, lock, kernel_wheels, force)
    base = base_ref(catalog.bases[image.base], repo)
    norm = normalize_image(docker, raw_id, repo / image.dockerfile, base)
    load_normalized(docker, norm, [image.immutable_ref(inputs.hash), image.moving_ref])
    say(f"build {image.moving_ref}: {norm.image_id[:19]} (build times set to SOURCE_DATE_EPOCH)")
    return Built(image, inputs, norm.image_id, rebuilt=True, seconds=time.monotonic() - start)


@dataclass(frozen=True)
class Verified:
    image: Image
    expected: str
    rebuilt: str
    layers: list[int]  # indexes of layers that differ

    @property
    def same(self) -> bool:
        return self.expected == self.rebuilt


def verify_image(repo: Path, catalog: Catalog, image: Image, store: Store) -> Verified:
    """Rebuild from scratch (no layer cache) and compare image IDs with the image built here.

    Nothing is tagged: the rebuild's raw image is dropped once its normalised ID is known.
    """
    docker = Docker.discover()
    docker.ping()
    inputs, expected = current_image(repo, catalog, image, docker)
    lock, kernel_wheels = fetch_phase(repo, catalog, image, store, docker)
    raw_id = raw_build(repo, catalog, image, store, docker, inputs, lock, kernel_wheels, True)
    norm = normalize_image(
        docker, raw_id, repo / image.dockerfile, base_ref(catalog.bases[image.base], repo)
    )
    if raw_id != expected:
        docker.remove(raw_id)
    ours = docker.layers(expected)
    n = max(len(ours), len(norm.layers))
    differ = [i for i in range(n) if ours[i : i + 1] != norm.layers[i : i + 1]]
    return Verified(image, expected, norm.image_id, differ)


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
        size = str((docker.find(b.image_id) or {}).get("Size", "?"))
        rows.append(
            (
                b.image.moving_ref,
                b.image.immutable_ref(b.inputs.hash).split(":", 1)[1],
                "built" if b.rebuilt else "up to date",
                b.image_id[:19],
                human_bytes(int(size)) if size.isdigit() else size,
                f"{b.seconds:.2f}s",
            )
        )
    return table(("image", "immutable tag", "result", "image ID", "size", "time"), rows)
