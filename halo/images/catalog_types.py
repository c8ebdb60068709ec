"""The image catalog's types: bases, images and the catalog, as frozen dataclasses.

Data only, at the bottom of the catalog's modules: halo.images.catalog_schema validates
images/images.yaml into these, and halo.images.catalog loads (and remembers) the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from halo.errors import HaloError


@dataclass(frozen=True)
class Base:
    name: str
    recipe: str
    python: str
    suite: str = ""
    variant: str = ""
    packages: tuple[str, ...] = ()
    # The image's environment beyond PATH, sorted by name (a GPU base: the NVIDIA container
    # runtime's variables); in the base's config, so every image on it inherits it.
    env: tuple[tuple[str, str], ...] = ()

    @property
    def definition(self) -> dict[str, object]:
        """What the recipe is made of; hashed into every image built on this base."""
        return {
            "name": self.name,
            "recipe": self.recipe,
            "python": self.python,
            "suite": self.suite,
            "variant": self.variant,
            "packages": sorted(self.packages),
            "env": dict(self.env),
        }


@dataclass(frozen=True)
class Image:
    name: str
    repository: str
    tag: str
    dockerfile: str
    pins: str
    base: str
    builder: str | None
    cuda_arch: tuple[str, ...]
    sources: tuple[str, ...]
    tiers: tuple[str, ...]
    publish: str
    # The Dockerfile's own build arguments (a shared Dockerfile told which server it builds),
    # sorted by name; part of the input hash.
    args: tuple[tuple[str, str], ...] = ()
    # A CI stage of images.<stage_of> (base + locked stack, no kernels): not a product.
    stage_of: str | None = None
    # The tiers whose passing, signed test attestation promote requires of a digest (tier
    # markers, or "stack": `halo stack verify SET --image NAME`); None: not said, so refused.
    gate: tuple[str, ...] | None = None
    # Platforms (linux/arm64) the image is not built for, each with the reason, sorted by
    # platform: a plan for one of them is one error line saying why.
    unavailable: tuple[tuple[str, str], ...] = ()

    @property
    def moving_ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    def immutable_ref(self, input_hash: str) -> str:
        return f"{self.repository}:{self.tag}-{input_hash[:12]}"


@dataclass(frozen=True)
class Catalog:
    path: Path
    bases: dict[str, Base]
    images: dict[str, Image]
    # Where `remember` keeps this catalog once a command that read it has succeeded.
    memo: Path | None = field(default=None, compare=False)

    def image(self, name: str) -> Image:
        if name not in self.images:
            known = ", ".join(sorted(self.images))
            raise HaloError(f"{self.path}: unknown image '{name}' (known: {known})")
        return self.images[name]
