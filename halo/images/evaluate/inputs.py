"""The input hash of an image: everything that can change what the build produces."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from halo import __version__
from halo.errors import HaloError
from halo.hashing import sha256_file, sha256_tree
from halo.images.catalog_types import Image
from halo.images.graph import Inputs

__all__ = ["Inputs", "base_identity", "image_inputs", "source_pins"]


def base_identity(recipe: str) -> str:
    """A base enters a hash by what the checkout says it is: its recipe hash (a made base is
    reproducible from its recipe and OS lock, and counts as made only when it carries that
    hash). Never the image ID made here, which would make the hash differ before and after
    `halo image base`, or on a host with no engine."""
    return f"recipe:{recipe}"


def source_pins(repo: Path, names: tuple[str, ...]) -> dict[str, object]:
    if not names:
        return {}
    from halo.pins.source_pins import load_source_pins

    pins = {p.name: p for p in load_source_pins(repo / "pins")}
    missing = [n for n in names if n not in pins]
    if missing:
        raise HaloError(f"{repo / 'pins' / 'sources.toml'}: no source pin '{missing[0]}'")
    return {n: dataclasses.asdict(pins[n]) for n in names}


def image_inputs(
    repo: Path,
    image: Image,
    lock: Path,
    base_recipe: str,
    builder_recipe: str | None,
    build_args: dict[str, str],
) -> Inputs:
    """The parts of an image's input hash. ``lock`` is the lock the image installs (the
    platform's); amd64's parts are exactly what they were before there were platforms."""
    from halo.images.wheel import backend_inputs

    if not lock.is_file():
        set_name = lock.name.removeprefix("pylock.").removesuffix(".toml")
        raise HaloError(f"{lock}: lock not found; run `halo pins lock {set_name}`")
    parts: dict[str, object] = {
        "image": image.name,
        "base": base_identity(base_recipe),
        "builder": base_identity(builder_recipe) if builder_recipe is not None else None,
        "lock_sha256": sha256_file(lock),
        "sources": source_pins(repo, image.sources),
        "patches_sha256": sha256_tree(repo / "patches"),
        "dockerfile_sha256": sha256_file(repo / image.dockerfile),
        # What the Dockerfile may COPY from its own folder (a server's entrypoint script).
        "image_dir_sha256": sha256_tree((repo / image.dockerfile).parent),
        "halo_sha256": sha256_tree(repo / "halo"),
        # What else halo's wheel is made of: README.md (its METADATA), pyproject.toml (which
        # pins the build backend), files' executable bits.
        **backend_inputs(repo),
        "halo_version": __version__,
        "build_args": dict(sorted(build_args.items())),
    }
    return Inputs(parts)
