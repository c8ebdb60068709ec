"""The image catalog's schema: images/images.yaml validated into halo.images.catalog's types.

Through halo.schema: UTF-8, strict YAML (a duplicate key is an error), and typed models that
report every problem at once by key path. Tags and repositories follow the OCI grammar
(`tag: 0.10` is the number 0.1 to YAML: it must be quoted), tiers are the known test tiers,
and the Dockerfiles an entry names must exist. Imported only when the catalog changed (see
halo.images.catalog.load_catalog).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from halo.images.catalog_types import Base, Catalog, Image
from halo.schema import (
    Name,
    OciRepository,
    OciTag,
    Problems,
    RelativePath,
    Strict,
    load_yaml,
    matches,
)

CudaArch = Annotated[str, matches(r"\d+\.\d+[a-z]?", "a CUDA arch like '9.0a' or '10.0'")]
DebPackage = Annotated[str, matches(r"[a-z0-9][a-z0-9+.-]+", "a Debian package name")]
ArgName = Annotated[str, matches(r"[A-Z][A-Z0-9_]*", "an upper-case build argument name")]
EnvName = Annotated[str, matches(r"[A-Z][A-Z0-9_]*", "an upper-case environment variable name")]
PlatformName = Annotated[
    str, matches(r"linux/(amd64|arm64)", "a platform: linux/amd64 or linux/arm64")
]
# Build arguments halo gives every Dockerfile itself: an entry's `args` may not override them.
OWN_ARGS = ("BASE", "PYTHON", "SOURCE_DATE_EPOCH")


# Not a pytest tier: `halo stack verify SET --image NAME` proves an image inside itself (pip
# check, imports, ELF linkage, the server's parser…) and records that as tier "stack". What a
# server image can prove on a machine with no GPU and no rollout tier run against it.
STACK_GATE = "stack"


def known_tiers() -> tuple[str, ...]:
    """The test tiers' markers (cpu, gpu_core, ...): what an image may list under `tiers`."""
    from halo.testing.tier_table import TIERS

    return tuple(t.marker for t in TIERS.values())


class BaseSpec(Strict):
    # One recipe: Debian by mmdebstrap, offline from the .debs of its OS lock. (Bases pulled
    # from a registry or built FROM one are gone: no registry is reachable where Halo is built,
    # and their apt-get drifted with the archive.)
    recipe: Literal["mmdebstrap"]
    python: Annotated[str, Field(min_length=1)]
    suite: Name
    variant: Name = "minbase"
    packages: list[DebPackage] = Field(default_factory=list)
    env: dict[EnvName, str] = Field(default_factory=dict)


class ImageSpec(Strict):
    repository: OciRepository
    tag: OciTag
    dockerfile: RelativePath
    pins: Name
    base: Name
    builder: Name | None = None
    cuda_arch: list[CudaArch] = Field(default_factory=list)
    sources: list[Name] = Field(default_factory=list)
    tiers: list[str] = Field(default_factory=list)
    publish: OciRepository
    # A CI stage of another image (its base and locked stack, kernels omitted): built and
    # checked by name only, never by --all, never pushed.
    stage_of: Name | None = None
    # The Dockerfile's own build arguments (the shared server Dockerfile: which server, port).
    args: dict[ArgName, Annotated[str, Field(min_length=1)]] = Field(default_factory=dict)
    # What promote requires: a passing, signed attestation of each (its `tiers`, or "stack").
    gate: Annotated[list[str], Field(min_length=1)] | None = None
    # Platforms the image is not built for, with the reason (an aarch64 wheel the index lacks).
    unavailable: dict[PlatformName, Annotated[str, Field(min_length=1)]] = Field(
        default_factory=dict
    )


class CatalogSpec(Strict):
    bases: dict[Name, object] = Field(default_factory=dict)
    images: Annotated[dict[Name, object], Field(min_length=1)]


def _base(name: str, spec: BaseSpec) -> Base:
    return Base(
        name=name,
        recipe=spec.recipe,
        python=spec.python,
        suite=spec.suite,
        variant=spec.variant,
        packages=tuple(spec.packages),
        env=tuple(sorted(spec.env.items())),
    )


def parse(text: str, path: Path, repo: Path | None = None) -> Catalog:
    """The catalog in ``text``; with ``repo``, the Dockerfiles it names must exist there."""
    data = load_yaml(text, str(path))
    found = Problems(str(path))
    top = found.model(CatalogSpec, data)
    if top is None:
        found.check()
    assert top is not None
    bases: dict[str, Base] = {}
    for name, raw in top.bases.items():
        spec = found.model(BaseSpec, raw, f"bases.{name}")
        if spec is not None:
            bases[name] = _base(name, spec)
    tiers = known_tiers()
    images: dict[str, Image] = {}
    refs: dict[str, str] = {}
    for name, raw in top.images.items():
        where = f"images.{name}"
        spec = found.model(ImageSpec, raw, where)
        # References are checked even when the entry has other problems: all of them at once.
        fields = raw if isinstance(raw, dict) else {}
        for key in ("base", "builder"):
            ref = fields.get(key)
            if isinstance(ref, str) and ref not in top.bases:
                known = ", ".join(sorted(top.bases))
                found.add(f"{where}.{key}", f"unknown base '{ref}' (known: {known})")
        listed = fields.get("tiers")
        for i, tier in enumerate(listed if isinstance(listed, list) else []):
            if isinstance(tier, str) and tier not in tiers:
                found.add(
                    f"{where}.tiers[{i}]", f"unknown tier '{tier}' (known: {', '.join(tiers)})"
                )
        if spec is None:
            continue
        for i, gated in enumerate(spec.gate or ()):
            if gated not in (*spec.tiers, STACK_GATE):
                found.add(
                    f"{where}.gate[{i}]",
                    f"'{gated}' is neither among its tiers ({', '.join(spec.tiers) or 'none'}) "
                    f"nor '{STACK_GATE}'",
                )
        for arg in sorted(set(spec.args) & set(OWN_ARGS)):
            found.add(f"{where}.args.{arg}", f"set by halo itself ({', '.join(OWN_ARGS)})")
        ref = f"{spec.repository}:{spec.tag}"
        if ref in refs:
            found.add(f"{where}.tag", f"{ref} is also images.{refs[ref]}'s tag")
        refs[ref] = name
        images[name] = Image(
            name=name,
            repository=spec.repository,
            tag=spec.tag,
            dockerfile=spec.dockerfile,
            pins=spec.pins,
            base=spec.base,
            builder=spec.builder,
            cuda_arch=tuple(spec.cuda_arch),
            sources=tuple(spec.sources),
            tiers=tuple(spec.tiers),
            publish=spec.publish,
            args=tuple(sorted(spec.args.items())),
            stage_of=spec.stage_of,
            gate=tuple(spec.gate) if spec.gate is not None else None,
            unavailable=tuple(sorted(spec.unavailable.items())),
        )
    for n, i in images.items():
        if i.stage_of is not None and (i.stage_of not in images or images[i.stage_of].stage_of):
            found.add(f"images.{n}.stage_of", f"{i.stage_of!r} is not a product image here")
    if repo is not None:
        named = [(f"images.{n}.dockerfile", i.dockerfile) for n, i in images.items()]
        for where, rel in named:
            if not (repo / rel).is_file():
                found.add(where, f"no such file {rel}")
    found.check()
    return Catalog(path=path, bases=bases, images=images)
