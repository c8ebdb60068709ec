"""The input hash of an image: everything that can change what the build produces."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from halo import __version__
from halo.errors import HaloError
from halo.hashing import sha256_file, sha256_json, sha256_tree
from halo.images.base import BaseState
from halo.images.catalog import Image
from halo.images.wheel import backend_inputs
from halo.pins.names import lock_path


def base_identity(state: BaseState, recipe: str) -> str:
    """A base enters a hash by what the checkout says it is: its recipe hash (a made base is
    reproducible from its recipe and OS lock, and counts as made only when it carries that
    hash: halo.images.base). Never the image ID made here, which would make the hash differ
    before and after `halo image base`, or on a host with no engine."""
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


@dataclass(frozen=True)
class Inputs:
    """What went into an image, by content. ``hash`` is the image's address."""

    parts: dict[str, object]

    @property
    def hash(self) -> str:
        return sha256_json(self.parts)


def image_inputs(
    repo: Path,
    image: Image,
    base: BaseState,
    base_recipe: str,
    builder: BaseState | None,
    builder_recipe: str | None,
    build_args: dict[str, str],
) -> Inputs:
    lock = lock_path(repo / "pins", image.pins)
    if not lock.is_file():
        raise HaloError(f"{lock}: lock not found; run `halo pins lock {image.pins}`")
    parts: dict[str, object] = {
        "image": image.name,
        "base": base_identity(base, base_recipe),
        "builder": base_identity(builder, builder_recipe or "") if builder else None,
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
