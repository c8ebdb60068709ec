"""images/images.yaml: the catalog of bases and images, validated into dataclasses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from halo.errors import HaloError
from halo.yamlfields import Fields

DIGEST_REF = re.compile(r"^[\w./:-]+@sha256:[0-9a-f]{64}$")
BASE_RECIPES = ("mmdebstrap", "dockerfile", "registry")
ARG_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Build arguments halo gives every Dockerfile itself (the base's reference and its Python).
OWN_ARGS = ("BASE", "PYTHON")


@dataclass(frozen=True)
class Base:
    name: str
    recipe: str
    python: str
    suite: str = ""
    variant: str = ""
    packages: tuple[str, ...] = ()
    from_ref: str = ""
    dockerfile: str = ""

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
            "from": self.from_ref,
            "dockerfile": self.dockerfile,
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

    def image(self, name: str) -> Image:
        if name not in self.images:
            known = ", ".join(sorted(self.images))
            raise HaloError(f"{self.path}: unknown image '{name}' (known: {known})")
        return self.images[name]


def _base(name: str, raw: object, where: str) -> Base:
    f = Fields(
        raw, where, {"recipe", "python", "suite", "variant", "packages", "from", "dockerfile"}
    )
    recipe = f.str("recipe")
    if recipe not in BASE_RECIPES:
        raise HaloError(
            f"{where}.recipe: expected one of {', '.join(BASE_RECIPES)}, got {recipe!r}"
        )
    base = Base(
        name=name,
        recipe=recipe,
        python=f.str("python"),
        suite=f.str("suite") if recipe == "mmdebstrap" else "",
        variant=f.str("variant", "minbase") if recipe == "mmdebstrap" else "",
        packages=f.strs("packages"),
        from_ref=f.str("from") if recipe != "mmdebstrap" else "",
        dockerfile=f.str("dockerfile") if recipe == "dockerfile" else "",
    )
    if base.from_ref and not DIGEST_REF.match(base.from_ref):
        raise HaloError(
            f"{where}.from: must be pinned by digest (NAME:TAG@sha256:<64 hex>), got {base.from_ref!r}"
        )
    return base


def _image(name: str, raw: object, where: str, bases: dict[str, Base]) -> Image:
    allowed = {
        "repository",
        "tag",
        "dockerfile",
        "pins",
        "base",
        "builder",
        "cuda_arch",
        "sources",
        "tiers",
        "publish",
        "args",
    }
    f = Fields(raw, where, allowed)
    image = Image(
        name=name,
        repository=f.str("repository"),
        tag=str(f.data.get("tag", "")) or f.str("tag"),
        dockerfile=f.str("dockerfile"),
        pins=f.str("pins"),
        base=f.str("base"),
        builder=f.str("builder") if "builder" in f.data else None,
        cuda_arch=f.strs("cuda_arch"),
        sources=f.strs("sources"),
        tiers=f.strs("tiers"),
        publish=f.str("publish"),
        args=_args(f.data.get("args", {}), f"{where}.args"),
    )
    for key in ("base", "builder"):
        ref = getattr(image, key)
        if ref is not None and ref not in bases:
            raise HaloError(
                f"{where}.{key}: unknown base '{ref}' (known: {', '.join(sorted(bases))})"
            )
    return image


def _args(raw: object, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        raise HaloError(f"{where}: expected a mapping of build argument names to strings")
    for name, value in raw.items():
        if not isinstance(name, str) or not ARG_NAME.match(name):
            raise HaloError(f"{where}: expected an upper-case build argument name, got {name!r}")
        if name in OWN_ARGS:
            raise HaloError(f"{where}.{name}: set by halo itself ({', '.join(OWN_ARGS)})")
        if not isinstance(value, str) or not value:
            raise HaloError(f"{where}.{name}: expected a non-empty string, got {value!r}")
    return tuple(sorted(raw.items()))


def parse_catalog(text: str, path: Path) -> Catalog:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise HaloError(f"{path}:{line}: malformed YAML: {problem}") from None
    top = Fields(data, str(path), {"bases", "images"})
    raw_bases = top.data.get("bases") or {}
    raw_images = top.data.get("images")
    if not isinstance(raw_bases, dict):
        raise HaloError(f"{path}: bases: expected a mapping")
    if not isinstance(raw_images, dict) or not raw_images:
        raise HaloError(f"{path}: images: expected a non-empty mapping of image names")
    bases = {n: _base(n, b, f"{path}: bases.{n}") for n, b in raw_bases.items()}
    images = {n: _image(n, i, f"{path}: images.{n}", bases) for n, i in raw_images.items()}
    return Catalog(path=path, bases=bases, images=images)


def load_catalog(repo: Path) -> Catalog:
    path = repo / "images" / "images.yaml"
    if not path.is_file():
        raise HaloError(f"{path}: image catalog not found")
    return parse_catalog(path.read_text(), path)
