"""`halo image build`: evaluate the image into a plan, then realise exactly that plan.

One pass: plan (halo.images.buildplan: the input hash, computed once, the lock, parsed once) →
fetch → realise derivations → stage the context → run the plan's build command → record. An
image tagged with the input hash whose own input-hash label says the same is not rebuilt: the
build is a no-op that only makes sure the moving tag points at it. A build's result is
normalised (halo.images.reproducible), so the same inputs give the same image ID on any
machine; `halo image verify` rebuilds from scratch and compares.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halo import __version__
from halo.errors import HaloError, os_error
from halo.images.base import BaseState, make_base, source_date_epoch
from halo.images.buildplan import (
    INPUT_LABEL,
    BuildPlan,
    base_states,
    evaluate,
    make_plan,
    wanted_bases,
)
from halo.images.catalog import Catalog, Image
from halo.images.docker import Docker, run_build
from halo.images.inputs import Inputs
from halo.paths import cache_home
from halo.pins.names import lock_path
from halo.report import human_bytes, say, table

if TYPE_CHECKING:
    from halo.images.derivations import Derivation
    from halo.pins.lockfile import Lock
    from halo.store.store import Store

# The fetch and build phases import what they need when they run: a no-op build (the common
# case, budgeted well under a second) pays only for computing the input hash and one lookup.


@dataclass(frozen=True)
class Built:
    image: Image
    inputs: Inputs
    image_id: str
    rebuilt: bool
    seconds: float


def up_to_date(docker: Docker, image: Image, inputs: Inputs) -> str | None:
    """The ID of the image built from exactly ``inputs``, if there is one here.

    The hash was just recomputed from the files; the image must be tagged with it and carry
    it in full (a short tag alone could be moved by hand, or collide).
    """
    found = docker.id_and_label(image.immutable_ref(inputs.hash), INPUT_LABEL)
    if found is None or found[1] != inputs.hash:
        return None
    return found[0]


def require_current(docker: Docker, image: Image, inputs: Inputs) -> str:
    """The ID of the image the checkout builds now; refuses a stale or missing one.

    What a push publishes is decided by the input hash recomputed from the files, never by a
    label read back from an image.
    """
    image_id = up_to_date(docker, image, inputs)
    if image_id is None:
        raise HaloError(
            f"{image.immutable_ref(inputs.hash)}: not built from this checkout's inputs; "
            f"run `halo image build {image.name}`"
        )
    return image_id


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
    from halo.atomic import exclusive

    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive(path))
        except OSError as exc:
            raise os_error(exc, path, "write the build context") from None
        yield


def load_checked_lock(repo: Path, image: Image) -> Lock:
    """The image's lock, parsed once per build, before anything is fetched."""
    from halo.pins.lockfile import load_lock

    lock = load_lock(lock_path(repo / "pins", image.pins))
    if time.time() < source_date_epoch():
        raise HaloError(
            f"SOURCE_DATE_EPOCH={source_date_epoch()} is in the future of this machine's clock; "
            "reproducible layers need it in the past"
        )
    return lock


def make_bases(
    repo: Path, catalog: Catalog, image: Image, docker: Docker, states: dict[str, BaseState]
) -> dict[str, BaseState]:
    """The fetch phase of the OS layer, before the plan. A base enters the input hash by its
    recipe hash (halo.images.inputs.base_identity), so making it changes no hash; the plan's
    stages then name the image IDs made here."""
    made = dict(states)
    for base in wanted_bases(catalog, image):
        if not made[base.name].image_id:
            made[base.name] = make_base(base, repo, docker, cache_home() / "work")
    return made


def fetch(lock: Lock, store: Store) -> None:
    """The lock's artifacts into the store: the only step of a build that uses the index."""
    from halo.sources import index_urls, substitute_dirs
    from halo.store.fetch import fetch_lock, summary
    from halo.store.index import IndexClient

    print(summary(lock.set, fetch_lock(lock, store, IndexClient(index_urls()), substitute_dirs())))


def realise_derivations(
    repo: Path, store: Store, docker: Docker, drvs: tuple[Derivation, ...]
) -> list[tuple[Path, str]]:
    """The plan's source derivations: (wheel, sha256) for the kernels layer."""
    if not drvs:
        return []
    from halo.cache.config import configured_cache
    from halo.images.derivations import realise, realiser

    r = realiser(repo, store, docker, configured_cache())
    return [(x.wheel, x.sha256) for x in (realise(d, r) for d in drvs)]


def realise_plan(repo: Path, plan: BuildPlan, store: Store, docker: Docker) -> str:
    """Fetch, realise the derivations, stage the context and run exactly the plan's build
    command; returns BuildKit's (untagged) image ID."""
    from halo.images.context import stage_context

    image, lock = plan.evaluation.image, plan.lock_data
    fetch(lock, store)
    kernel_wheels = realise_derivations(repo, store, docker, plan.evaluation.derivations)
    build_inputs = {
        "image": plan.image,
        "image_ref": plan.immutable_ref,
        "input_hash": plan.input_hash,
        "inputs": plan.inputs,
        "base_ref": plan.runtime.ref,
        "halo_version": __version__,
    }
    ctx, iid = Path(plan.context), Path(plan.iidfile)
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
        iid.unlink(missing_ok=True)
        cmd = plan.command
        run_build(cmd.argv, cmd.env, cmd.cwd, Path(image.dockerfile).name)
        try:
            return iid.read_text().strip()
        except OSError as exc:
            raise os_error(exc, iid, "read the built image's ID") from None


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
    states = base_states(repo, catalog, image, docker)
    lock = None
    if any(not states[b.name].image_id for b in wanted_bases(catalog, image)):
        docker.ping()
        lock = load_checked_lock(repo, image)  # a broken lock fails before anything is fetched
        states = make_bases(repo, catalog, image, docker, states)
    # A missing lock fails here (its bytes are an input); a broken one before anything is
    # fetched. An image built from these same bytes (and this same halo) parsed them already.
    ev = evaluate(repo, catalog, image, docker, states)
    existing = None if force else up_to_date(docker, image, ev.inputs)
    if existing:
        if docker.image_id(image.moving_ref) != existing:
            docker.tag(image.immutable_ref(ev.inputs.hash), image.moving_ref)
        return Built(image, ev.inputs, existing, rebuilt=False, seconds=time.monotonic() - start)
    docker.ping()  # not on the no-op path: the lookups above would have failed already
    lock = lock or load_checked_lock(repo, image)
    plan = make_plan(repo, catalog, ev, lock, store, docker.builder, no_cache=force)
    raw_id = realise_plan(repo, plan, store, docker)
    norm = normalize_image(docker, raw_id, repo / image.dockerfile, plan.runtime.ref)
    load_normalized(docker, norm, [plan.immutable_ref, plan.moving_ref])
    say(f"build {image.moving_ref}: {norm.image_id[:19]} (build times set to SOURCE_DATE_EPOCH)")
    return Built(image, ev.inputs, norm.image_id, rebuilt=True, seconds=time.monotonic() - start)


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
    ev = evaluate(repo, catalog, image, docker)
    expected = require_current(docker, image, ev.inputs)
    lock = load_checked_lock(repo, image)
    plan = make_plan(repo, catalog, ev, lock, store, docker.builder, no_cache=True)
    raw_id = realise_plan(repo, plan, store, docker)
    norm = normalize_image(docker, raw_id, repo / image.dockerfile, plan.runtime.ref)
    if raw_id != expected:
        docker.remove(raw_id)
    ours = docker.layers(expected)
    n = max(len(ours), len(norm.layers))
    differ = [i for i in range(n) if ours[i : i + 1] != norm.layers[i : i + 1]]
    return Verified(image, expected, norm.image_id, differ)


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
