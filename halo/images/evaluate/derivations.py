"""Source builds as derivations: a wheel addressed by the hash of everything that made it.

The derivation hash covers the pin's distribution, version and content hashes (its tree,
each submodule, the subfolder built), the toolchain (its locked wheels by sha256; the
interpreter ABI, C library and compilers of a native host, or the builder base's recipe hash,
never an image ID made here: the hash comes from the checkout alone, the same on any host and
before and after `halo image base`), the build environment (the image's CUDA architectures
and the pin's feature flags), the source patches applied, and the recipe (the code that runs
the build). Parallelism (MAX_JOBS, NVCC_THREADS) only changes how fast: it comes from the
building host, is never an input, and a pin that names it is refused.

On a platform other than amd64 the toolchain is the platform's (the cuda-builder lock for it,
the builder base made for it) and the platform is named in the inputs; amd64's inputs are
what they were before there were platforms. Realising is halo.images.realise.derivation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from halo.builder.kind import builder_kind
from halo.builder.toolchain import Toolchain, docker_toolchain, native_toolchain
from halo.errors import HaloError
from halo.hashing import sha256_file, sha256_json
from halo.images.catalog_types import Catalog, Image
from halo.images.graph import AMD64, DerivationNode, Platform, set_for
from halo.patching.source import fingerprint, source_patches
from halo.pins.source_pins import SourcePin

BUILDER_SET = "cuda-builder"  # the pin set whose wheels compile the CUDA images' source pins
PARALLELISM = ("MAX_JOBS", "NVCC_THREADS")
# The CUDA_HOME layout every kind of build compiles with (halo.stack.cuda_home).
CUDA_HOME_CODE = "halo/stack/cuda_home.py"
# What the docker builder runs (halo.builder.docker.DOCKERFILE; a test keeps them equal).
BUILDER_DOCKERFILE = Path("images/builder/Dockerfile")


def recipe(kind: str, repo: Path) -> dict[str, object]:
    """What runs a build of this kind, as data: an input of every derivation built so."""
    if kind == "native":
        from halo.builder.native import recipe as native_recipe

        how: object = native_recipe()
    else:
        how = {"dockerfile": sha256_file(repo / BUILDER_DOCKERFILE)}
    return {"kind": kind, "how": how, "cuda_home": sha256_file(repo / CUDA_HOME_CODE)}


@dataclass(frozen=True)
class Derivation:
    pin: SourcePin
    toolchain: Toolchain
    env: tuple[tuple[str, str], ...]
    patches: tuple[tuple[str, str], ...]  # (patch name, fingerprint) of patches/sources/ applied
    platform: Platform = AMD64

    @property
    def name(self) -> str:
        return self.pin.name

    def inputs(self, repo: Path) -> dict[str, object]:
        pin = self.pin
        out: dict[str, object] = {
            "name": pin.name,
            "distribution": pin.distribution,
            "version": pin.version,
            "content": [
                {"path": "", "subdirectory": "", "sha256": pin.content_sha256},
                *(
                    {"path": m.path, "subdirectory": m.subdirectory, "sha256": m.content_sha256}
                    for m in pin.submodules
                ),
            ],
            "subdirectory": pin.subdirectory,
            "toolchain": self.toolchain.identity(),
            "env": dict(self.env),
            "patches": dict(self.patches),
            "recipe": recipe(self.toolchain.kind, repo),
        }
        if self.platform != AMD64:
            out["platform"] = str(self.platform)
        return out


def derivation_hash(drv: Derivation, repo: Path) -> str:
    return sha256_json(drv.inputs(repo))


def derivation_node(drv: Derivation, repo: Path, deps: tuple[str, ...] = ()) -> DerivationNode:
    """The derivation as a node of the plan: its inputs hashed once, here."""
    inputs = drv.inputs(repo)
    return DerivationNode(
        id=f"derivation:{drv.name}@{drv.platform}",
        pin=drv.pin,
        toolchain=drv.toolchain,
        env=drv.env,
        patches=drv.patches,
        inputs=inputs,
        hash=sha256_json(inputs),
        platform=drv.platform,
        deps=deps,
    )


def arch_env(arches: Sequence[str]) -> dict[str, str]:
    """The CUDA architectures as each build system reads them.

    ``TORCH_CUDA_ARCH_LIST`` (torch.utils.cpp_extension; DeepEP) takes ``9.0a;10.0``;
    FlashAttention's ``FLASH_ATTN_CUDA_ARCHS`` takes ``90;100`` (FA2 compiles each listed
    SM, 80;90;100;120 when unset; FA3 fixes its own sm_90a).
    """
    if not arches:
        raise HaloError("a CUDA derivation needs at least one architecture (images.yaml cuda_arch)")
    digits = [a.replace(".", "").rstrip("af") for a in arches]
    return {"TORCH_CUDA_ARCH_LIST": ";".join(arches), "FLASH_ATTN_CUDA_ARCHS": ";".join(digits)}


def derivation_env(pin: SourcePin, image: Image) -> tuple[tuple[str, str], ...]:
    """The pin's knobs plus the architectures: the image's, unless the pin names its own."""
    named = sorted(set(pin.env) & set(PARALLELISM))
    if named:
        raise HaloError(
            f"pins/sources.toml: source.{pin.name}.env.{named[0]}: parallelism is set from the "
            "building host (never an input of the derivation); remove it"
        )
    own = pin.cuda_arch.get(image.pins)
    arches = own.split(";") if own else list(image.cuda_arch)
    return tuple(sorted({**pin.env, **arch_env(arches)}.items()))


def derivation_for(
    pin: SourcePin, image: Image, toolchain: Toolchain, patches: Path, platform: Platform = AMD64
) -> Derivation:
    """The derivation of one source pin for one image: what the build and the plan both hash."""
    chosen = source_patches(patches, pin.distribution)
    return Derivation(
        pin=pin,
        toolchain=toolchain,
        env=derivation_env(pin, image),
        patches=tuple(sorted(fingerprint(chosen).items())),
        platform=platform,
    )


def toolchain_for(
    repo: Path, catalog: Catalog, image: Image, platform: Platform = AMD64
) -> Toolchain:
    """The image's toolchain, from configuration and the checkout only (halo.builder.kind).

    docker: the platform's cuda-builder lock on the platform's builder base, which enters by
    its recipe hash; no engine is asked, no host interpreter looked for. native: the host's
    interpreter for the lock's Python (find_python) and compilers; only for the host's own
    platform (amd64), since a native build runs on this host.
    """
    from halo.images.evaluate.bases import base_ref, recipe_hash
    from halo.images.evaluate.inputs import base_identity
    from halo.pins.lockfile import load_lock, lock_path

    lock = load_lock(lock_path(repo / "pins", set_for(BUILDER_SET, platform)))
    if builder_kind() == "docker":
        builder = catalog.bases[image.builder or image.base]
        identity = base_identity(recipe_hash(builder, repo, platform))
        return docker_toolchain(lock, builder.python, base_ref(builder, repo, platform), identity)
    if platform != AMD64:
        raise HaloError(
            f"HALO_BUILDER=native: builds on this host's platform only; {platform} derivations "
            "compile in the builder image (HALO_BUILDER=docker)"
        )
    from halo.stack.interpreter import find_python

    python, _ = find_python(lock.python)
    return native_toolchain(lock, python)


def image_derivations(
    repo: Path, catalog: Catalog, image: Image, platform: Platform = AMD64
) -> list[Derivation]:
    from halo.pins.source_pins import load_source_pins

    if not image.sources:
        return []
    pins = {p.name: p for p in load_source_pins(repo / "pins")}
    missing = [n for n in image.sources if n not in pins]
    if missing:
        raise HaloError(f"{repo / 'pins' / 'sources.toml'}: no source pin '{missing[0]}'")
    toolchain = toolchain_for(repo, catalog, image, platform)
    return [
        derivation_for(pins[n], image, toolchain, repo / "patches", platform) for n in image.sources
    ]
