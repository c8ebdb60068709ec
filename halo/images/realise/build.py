"""Realise an image node by its Dockerfile: stage the context, run BuildKit, normalise, load.

How this host runs the node's build (the context folder, the ID file, the exact command for
its engine's builder) is the ``Recipe``: the node says what to build, the recipe how here.
The build's result is normalised (halo.images.reproducible), so the same inputs give the
same image ID on any machine; `halo image verify` rebuilds from scratch and compares.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halo import __version__
from halo.errors import HaloError, os_error
from halo.hashing import sha256_file
from halo.images.docker import Builder, Docker, build_argv, run_build
from halo.images.graph import INPUT_LABEL, FetchWheels, ImageNode, source_date_epoch
from halo.paths import cache_home, per_engine
from halo.report import say

if TYPE_CHECKING:
    from halo.images.catalog_types import Image
    from halo.pins.lockfile import Lock
    from halo.store.store import Store


@dataclass(frozen=True)
class Command:
    """One process the build runs, exactly: argv, run in cwd with env added to the caller's."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]

    def shell(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in sorted(self.env.items())), *self.argv])


@dataclass(frozen=True)
class Recipe:
    """How this host realises an image node: where its context is, and what it runs."""

    context: Path
    iidfile: Path  # outside the context: writing into the context would change it
    command: Command


def context_dir(name: str) -> Path:
    """A build context: one fixed path per engine (and platform), updated in place
    (halo.images.context)."""
    return per_engine(cache_home() / "contexts") / name


def image_context(image: Image) -> Path:
    """The context of every image on ``image``'s base: BuildKit keeps a synced context by its
    path and sends only what changed, and images on one base share most of their wheels (the
    four on debian12-gpu, torch and CUDA's 3 GB), so those go over once, not once per image.
    Two builds on one base take turns (exclusive_context)."""
    return context_dir(f"base-{image.base}")


def dockerfile_recipe(repo: Path, node: ImageNode, builder: Builder, no_cache: bool) -> Recipe:
    image = node.image
    ctx = image_context(image)
    iid = ctx.with_name(f".{image.name}.iid")
    argv = build_argv(
        builder,
        ctx,
        Path(image.dockerfile),  # relative: the command runs in the repository
        [],  # untagged: the normalised image is what gets the tags (halo.images.reproducible)
        node.build_args,
        node.labels,
        "none",
        iid,
        no_cache=no_cache,  # from scratch: otherwise it would only replay the cache
    )
    return Recipe(ctx, iid, Command(tuple(argv), str(repo), {"DOCKER_BUILDKIT": "1"}))


def up_to_date(docker: Docker, node: ImageNode) -> str | None:
    """The ID of the image built from exactly the node's inputs, if there is one here.

    The hash was just computed from the files; the image must be tagged with it and carry it
    in full (a short tag alone could be moved by hand, or collide), for the node's platform.
    """
    found = docker.id_and_label(node.immutable_ref, INPUT_LABEL)
    if found is None or found[1] != node.hash:
        return None
    return found[0]


def require_current(docker: Docker, node: ImageNode) -> str:
    """The ID of the image the checkout builds now; refuses a stale or missing one.

    What a push publishes is decided by the input hash computed from the files, never by a
    label read back from an image.
    """
    image_id = up_to_date(docker, node)
    if image_id is None:
        flag = "" if node.platform.suffix == "" else f" --platform {node.platform}"
        raise HaloError(
            f"{node.immutable_ref}: not built from this checkout's inputs; "
            f"run `halo image build {node.image.name}{flag}`"
        )
    return image_id


def planned_lock(repo: Path, node: FetchWheels) -> Lock:
    """The lock the plan hashed, parsed once per build, before anything is fetched."""
    from halo.pins.lockfile import load_lock

    path = repo / node.lock
    try:
        same = sha256_file(path) == node.lock_sha256
    except OSError:
        same = False
    if not same:
        raise HaloError(f"{path}: changed since it was planned; plan and build again")
    lock = load_lock(path)
    if time.time() < source_date_epoch():
        raise HaloError(
            f"SOURCE_DATE_EPOCH={source_date_epoch()} is in the future of this machine's clock; "
            "reproducible layers need it in the past"
        )
    return lock


@contextlib.contextmanager
def exclusive_context(ctx: Path) -> Iterator[None]:
    """One build at a time per context folder (two would overwrite each other's files), held by
    the lock file ``.NAME.lock`` beside it."""
    from halo.atomic import exclusive

    path = ctx.with_name(f".{ctx.name}.lock")
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive(path))
        except OSError as exc:
            raise os_error(exc, path, "write the build context") from None
        yield


def build_inputs(node: ImageNode, base_ref: str) -> dict[str, object]:
    """What `halo image stamp` records in the image (/etc/halo/build.json)."""
    return {
        "image": node.image.name,
        "image_ref": node.immutable_ref,
        "input_hash": node.hash,
        "inputs": node.inputs,
        "base_ref": base_ref,
        "halo_version": __version__,
    }


def run_dockerfile(
    repo: Path,
    node: ImageNode,
    recipe: Recipe,
    lock: Lock,
    store: Store,
    kernel_wheels: Sequence[tuple[Path, str]],
) -> str:
    """Stage the context and run exactly the recipe's build command; returns BuildKit's
    (untagged) image ID."""
    from halo.images.context import stage_context

    image = node.image
    ctx, iid = recipe.context, recipe.iidfile
    with exclusive_context(ctx):
        say(
            f"build {image.moving_ref}: staging context (verifying {len(lock.artifacts)} artifacts)"
        )
        changed = stage_context(
            ctx,
            repo,
            lock,
            store,
            kernel_wheels,
            build_inputs(node, node.build_args["BASE"]),
            image_dir=(repo / image.dockerfile).parent,
            fix=f"halo fetch {lock.set}",
        )
        say(f"build {image.moving_ref}: context {ctx} ({len(changed)} paths changed)")
        say(f"build {image.moving_ref}: docker build --network none ({image.dockerfile})")
        iid.unlink(missing_ok=True)
        cmd = recipe.command
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
