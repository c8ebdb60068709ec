"""Source builds as derivations, by their old names.

Defining and hashing a derivation is evaluation (halo.images.evaluate.derivations); finding,
pulling or compiling its wheel is realisation (halo.images.realise.derivation), which takes
the derivation as a node of the plan (its inputs hashed once). ``realise`` and
``first_object`` below keep the former signature (a Derivation), for callers outside a build.
"""

from __future__ import annotations

from pathlib import Path

from halo.images.evaluate.derivations import (
    BUILDER_SET,
    CUDA_HOME_CODE,
    PARALLELISM,
    Derivation,
    arch_env,
    derivation_env,
    derivation_for,
    derivation_hash,
    derivation_node,
    image_derivations,
    recipe,
    toolchain_for,
)
from halo.images.realise import derivation as _realised
from halo.images.realise.derivation import (
    GIB,
    Cache,
    FirstObject,
    Realised,
    Realiser,
    build_jobs,
    nvcc_targets,
    parallelism,
    realiser,
)

__all__ = [
    "BUILDER_SET",
    "CUDA_HOME_CODE",
    "GIB",
    "PARALLELISM",
    "Cache",
    "Derivation",
    "FirstObject",
    "Realised",
    "Realiser",
    "arch_env",
    "build_jobs",
    "derivation_env",
    "derivation_for",
    "derivation_hash",
    "first_object",
    "image_derivations",
    "nvcc_targets",
    "parallelism",
    "realise",
    "realiser",
    "recipe",
    "toolchain_for",
]


def realise(drv: Derivation, r: Realiser) -> Realised:
    return _realised.realise(derivation_node(drv, r.repo), r)


def first_object(drv: Derivation, r: Realiser, keep: Path | None = None) -> FirstObject:
    return _realised.first_object(derivation_node(drv, r.repo), r, keep)
