"""Every invariant: a set of pins that violates it (exactly that line) and one that passes."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest

from halo.pins.invariants import Pins, Policy, check
from halo.pins.lockfile import Artifact, Lock, Package
from halo.pins.source_pins import SourcePin, Submodule

SHA = "a" * 64
COMMIT = "b" * 40


def pkg(
    name: str,
    version: str,
    sha: str = SHA,
    artifacts: bool = True,
    deps: tuple[str, ...] = (),
    file: str | None = None,
    marker: str | None = None,
) -> Package:
    file = file or f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    arts = (Artifact(file, sha, 10),)
    return Package(
        name=name,
        version=version,
        artifacts=arts if artifacts else (),
        dependencies=deps,
        marker=marker,
    )


def lock(name: str, *packages: Package, allow: tuple[str, ...] = ()) -> Lock:
    # Every package is a requirement of its own: the closure rule holds by construction.
    return Lock(
        set=name,
        python="3.11",
        platform="x86_64-manylinux_2_36",
        inputs_sha256=SHA,
        packages=packages,
        extra={
            "allow-prerelease": list(allow),
            "requirements": [p.name for p in packages],
            "excluded": [],
        },
    )


def source(name: str, dist: str, sets: tuple[str, ...], **kw: object) -> SourcePin:
    base = dict(
        name=name,
        distribution=dist,
        version="1.0",
        repository="https://example.invalid/x",
        commit=COMMIT,
        content_sha256=SHA,
        sets=sets,
    )
    return SourcePin(**{**base, **kw})  # type: ignore[arg-type]


def good() -> Pins:
    gpu = (pkg("torch", "2.11.0"), pkg("nvidia-nccl-cu13", "2.28.9"))
    return Pins(
        locks={
            "blackwell": lock(
                "blackwell",
                *gpu,
                pkg("numpy", "1.26.4"),
                pkg("flash-attn-4", "4.0.0b36"),
                pkg("nvidia-cutlass-dsl-libs-cu13", "4.8.1"),
                allow=("flash-attn-4",),
            ),
            "hopper": lock("hopper", *gpu, pkg("numpy", "1.26.4")),
            "vllm": lock("vllm", *gpu, pkg("numpy", "2.3.5")),
            "sglang": lock(
                "sglang", *gpu, pkg("flash-attn-4", "4.0.0b19"), allow=("flash-attn-4",)
            ),
            "cpu": lock("cpu", pkg("torch", "2.13.0+cpu"), pkg("numpy", "1.26.4")),
        },
        sources=(
            source("deep-ep", "deep_ep", ("blackwell", "hopper")),
            source("flash-attn-3", "flash_attn_3", ("hopper",)),
            source(
                "flash-attn",
                "flash_attn",
                ("blackwell", "hopper"),
                submodules=(Submodule("csrc/cutlass", "https://example.invalid/c", COMMIT, SHA),),
            ),
        ),
    )


def add(set_name: str, *packages: Package, allow: tuple[str, ...] = ()) -> Callable[[Pins], Pins]:
    def mutate(pins: Pins) -> Pins:
        old = pins.locks[set_name]
        keep = tuple(p for p in old.packages if p.name not in {n.name for n in packages})
        extra = {
            **old.extra,
            "allow-prerelease": [*old.extra["allow-prerelease"], *allow],  # type: ignore[misc]
            "requirements": [p.name for p in keep + packages],
        }
        new = dataclasses.replace(old, packages=keep + packages, extra=extra)
        return dataclasses.replace(pins, locks={**pins.locks, set_name: new})

    return mutate


def also(set_name: str, *packages: Package) -> Callable[[Pins], Pins]:
    """Append entries to a set's lock, beside those of the same name (a lock may hold two)."""

    def mutate(pins: Pins) -> Pins:
        old = pins.locks[set_name]
        roots = list(dict.fromkeys([*old.extra["requirements"], *(p.name for p in packages)]))  # type: ignore[misc]
        extra = {**old.extra, "requirements": roots}
        new = dataclasses.replace(old, packages=old.packages + packages, extra=extra)
        return dataclasses.replace(pins, locks={**pins.locks, set_name: new})

    return mutate


def drop(set_name: str, name: str) -> Callable[[Pins], Pins]:
    def mutate(pins: Pins) -> Pins:
        old = pins.locks[set_name]
        kept = tuple(p for p in old.packages if p.name != name)
        extra = {**old.extra, "requirements": [p.name for p in kept]}
        new = dataclasses.replace(old, packages=kept, extra=extra)
        return dataclasses.replace(pins, locks={**pins.locks, set_name: new})

    return mutate


def set_extra(set_name: str, **extra: object) -> Callable[[Pins], Pins]:
    """Change keys of a lock's header (requirements, excluded) and nothing else."""

    def mutate(pins: Pins) -> Pins:
        old = pins.locks[set_name]
        new = dataclasses.replace(old, extra={**old.extra, **extra})
        return dataclasses.replace(pins, locks={**pins.locks, set_name: new})

    return mutate


def map_sources(fn: Callable[[SourcePin], SourcePin | None]) -> Callable[[Pins], Pins]:
    def mutate(pins: Pins) -> Pins:
        kept = tuple(s for s in (fn(s) for s in pins.sources) if s is not None)
        return dataclasses.replace(pins, sources=kept)

    return mutate


def test_the_good_pins_pass() -> None:
    assert check(good()) == []


CASES = {
    "cu12-library": (
        add("blackwell", pkg("nvidia-cutlass-dsl-libs-cu12", "4.8.1")),
        ["blackwell: nvidia-cutlass-dsl-libs-cu12: cuda13-only"],
    ),
    "cu12-local-version": (
        add("hopper", pkg("torch", "2.11.0+cu128")),
        ["hopper: torch: cuda13-only", "blackwell: torch: one-torch", "hopper: torch: one-torch"],
    ),
    "numpy-2-in-training": (
        add("hopper", pkg("numpy", "2.0.0")),
        ["hopper: numpy: numpy-below-2"],
    ),
    "numpy-2-in-cpu-trainer": (
        add("cpu", pkg("numpy", "2.3.5")),
        ["cpu: numpy: numpy-below-2"],
    ),
    "fa4-in-hopper": (
        add("hopper", pkg("flash-attn-4", "4.0.0b36"), allow=("flash-attn-4",)),
        ["hopper: flash-attn-4: only-in"],
    ),
    "fa4-in-vllm": (
        add("vllm", pkg("flash-attn-4", "4.0.0b36"), allow=("flash-attn-4",)),
        ["vllm: flash-attn-4: only-in"],
    ),
    "fa3-source-built-for-blackwell": (
        map_sources(
            lambda s: (
                dataclasses.replace(s, sets=("blackwell", "hopper"))
                if s.name == "flash-attn-3"
                else s
            )
        ),
        ["blackwell: flash-attn-3: only-in"],
    ),
    "fa4-missing-in-blackwell": (
        drop("blackwell", "flash-attn-4"),
        ["blackwell: flash-attn-4: required-in"],
    ),
    "deepep-missing-in-hopper": (
        map_sources(
            lambda s: dataclasses.replace(s, sets=("blackwell",)) if s.name == "deep-ep" else s
        ),
        ["hopper: deep-ep: required-in"],
    ),
    "fa3-missing-in-hopper": (
        map_sources(lambda s: None if s.name == "flash-attn-3" else s),
        ["hopper: flash-attn-3: required-in"],
    ),
    "two-torches": (
        add("hopper", pkg("torch", "2.10.0")),
        ["blackwell: torch: one-torch", "hopper: torch: one-torch"],
    ),
    "two-nccls": (
        add("blackwell", pkg("nvidia-nccl-cu13", "2.27.7")),
        ["blackwell: nvidia-nccl-cu13: one-nccl", "hopper: nvidia-nccl-cu13: one-nccl"],
    ),
    "sglang-nccl-differs": (
        add("sglang", pkg("nvidia-nccl-cu13", "2.29.1")),
        ["sglang: nvidia-nccl-cu13: nccl-matches-training"],
    ),
    "sglang-nccl-missing": (
        drop("sglang", "nvidia-nccl-cu13"),
        ["sglang: nvidia-nccl-cu13: required-in"],
    ),
    # --- issue 9: what `halo pins check` used to miss ---------------------------------------
    "cupy-cuda12x-added": (
        add("vllm", pkg("cupy-cuda12x", "13.6.0")),
        ["vllm: cupy-cuda12x: cuda13-only"],
    ),
    "cu12-file-name": (
        add(
            "hopper",
            pkg("torch", "2.11.0", file="torch-2.11.0+cu126-cp312-cp312-manylinux_2_28_x86_64.whl"),
        ),
        ["hopper: torch: cuda13-only"],
    ),
    "cu12-declared-dependency": (
        add(
            "blackwell",
            pkg("nvidia-cutlass-dsl", "4.8.1", deps=("nvidia-cutlass-dsl-libs-cu12",)),
            pkg("nvidia-cutlass-dsl-libs-cu12", "4.8.1"),
        ),
        [
            "blackwell: nvidia-cutlass-dsl: cuda13-only",
            "blackwell: nvidia-cutlass-dsl-libs-cu12: cuda13-only",
        ],
    ),
    "cuda-bindings-for-cuda-12": (
        add("sglang", pkg("cuda-bindings", "12.9.4")),
        ["sglang: cuda-bindings: cuda13-only"],
    ),
    "nccl-missing-in-hopper": (
        drop("hopper", "nvidia-nccl-cu13"),
        ["hopper: nvidia-nccl-cu13: required-in"],
    ),
    "nccl-missing-in-vllm": (
        drop("vllm", "nvidia-nccl-cu13"),
        ["vllm: nvidia-nccl-cu13: required-in"],
    ),
    "vllm-nccl-differs": (
        add("vllm", pkg("nvidia-nccl-cu13", "2.27.7")),
        ["vllm: nvidia-nccl-cu13: nccl-matches-training"],
    ),
    "fa2-dropped-from-blackwell": (
        map_sources(
            lambda s: dataclasses.replace(s, sets=("hopper",)) if s.name == "flash-attn" else s
        ),
        ["blackwell: flash-attn: required-in"],
    ),
    "fa2-dropped-everywhere": (
        map_sources(lambda s: None if s.name == "flash-attn" else s),
        ["blackwell: flash-attn: required-in", "hopper: flash-attn: required-in"],
    ),
    "sha256-63-hex": (
        add("hopper", pkg("pyyaml", "6.0.3", sha="a" * 63)),
        ["hopper: pyyaml: hash-pinned"],
    ),
    "sha256-upper-case": (
        add("hopper", pkg("pyyaml", "6.0.3", sha="A" * 64)),
        ["hopper: pyyaml: hash-pinned"],
    ),
    "sha256-trailing-newline": (
        add("hopper", pkg("pyyaml", "6.0.3", sha="a" * 64 + "\n")),
        ["hopper: pyyaml: hash-pinned"],
    ),
    "dependency-not-locked": (
        add("hopper", pkg("requests", "2.32.5", deps=("urllib3",))),
        ["hopper: urllib3: closure"],
    ),
    "package-not-reachable": (
        set_extra("blackwell", requirements=["torch", "nvidia-nccl-cu13", "flash-attn-4"]),
        ["blackwell: numpy: closure", "blackwell: nvidia-cutlass-dsl-libs-cu13: closure"],
    ),
    "requirement-not-locked": (
        set_extra("cpu", requirements=["torch", "numpy", "pyyaml"]),
        ["cpu: pyyaml: closure"],
    ),
    "excluded-but-locked": (
        set_extra("vllm", excluded=["numpy"]),
        ["vllm: numpy: closure"],
    ),
    "no-requirements-recorded": (
        set_extra("hopper", requirements=None),
        ["hopper: -: closure"],
    ),
    "bad-hash": (
        add("vllm", pkg("pyyaml", "6.0.3", sha="abc")),
        ["vllm: pyyaml: hash-pinned"],
    ),
    "no-artifact": (
        add("cpu", pkg("pyyaml", "6.0.3", artifacts=False)),
        ["cpu: pyyaml: hash-pinned"],
    ),
    "unallowed-prerelease": (
        add("vllm", pkg("transformers", "5.0.0rc1")),
        ["vllm: transformers: no-prerelease"],
    ),
    "source-without-commit": (
        map_sources(
            lambda s: dataclasses.replace(s, commit="v1.2.1") if s.name == "deep-ep" else s
        ),
        ["blackwell,hopper: deep-ep: source-pinned"],
    ),
    "source-without-hash": (
        map_sources(
            lambda s: dataclasses.replace(s, content_sha256="") if s.name == "flash-attn-3" else s
        ),
        ["hopper: flash-attn-3: source-pinned"],
    ),
    "submodule-without-hash": (
        map_sources(
            lambda s: (
                dataclasses.replace(
                    s,
                    submodules=(
                        Submodule("csrc/cutlass", "https://example.invalid/c", COMMIT, ""),
                    ),
                )
                if s.name == "flash-attn"
                else s
            )
        ),
        ["blackwell,hopper: flash-attn/csrc/cutlass: source-pinned"],
    ),
    "impostor-deep-ep-from-index": (
        add("blackwell", pkg("deep-ep", "1.0.0")),
        ["blackwell: deep-ep: source-not-from-index"],
    ),
    # --- issue 27: a second entry of one name, and every rule on every entry ------------------
    "second-numpy-entry-at-2": (
        also("hopper", pkg("numpy", "2.1.0")),
        ["hopper: numpy: one-entry", "hopper: numpy: numpy-below-2"],
    ),
    "second-numpy-entry-at-2-for-another-python": (
        also("hopper", pkg("numpy", "2.1.0", marker="python_version >= '3.12'")),
        ["hopper: numpy: numpy-below-2"],
    ),
    "second-torch-entry": (
        also("hopper", pkg("torch", "2.10.0", marker="platform_machine == 'aarch64'")),
        ["blackwell: torch: one-torch", "hopper: torch: one-torch"],
    ),
    "second-nccl-entry-in-sglang": (
        also("sglang", pkg("nvidia-nccl-cu13", "2.29.1")),
        ["sglang: nvidia-nccl-cu13: one-entry", "sglang: nvidia-nccl-cu13: nccl-matches-training"],
    ),
    "second-entry-needs-what-is-not-locked": (
        also("cpu", pkg("numpy", "1.26.4", deps=("six",), marker="platform_machine == 'aarch64'")),
        ["cpu: six: closure"],
    ),
    "second-entry-is-cu12": (
        also(
            "vllm",
            pkg("cupy-cuda13x", "13.6.0"),
            pkg("cupy-cuda13x", "13.6.0", deps=("cupy-cuda12x",), marker="python_version < '3.11'"),
        ),
        ["vllm: cupy-cuda13x: cuda13-only", "vllm: cupy-cuda12x: closure"],
    ),
    "two-impostor-deep-ep-entries": (
        also("blackwell", pkg("deep-ep", "1.0.0"), pkg("deep-ep", "1.0.1")),
        [
            "blackwell: deep-ep: one-entry",
            "blackwell: deep-ep: source-not-from-index",
            "blackwell: deep-ep: source-not-from-index",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_violation_is_reported_as_one_line(case: str) -> None:
    mutate, expected = CASES[case]
    lines = [str(v) for v in check(mutate(good()))]
    # "SET: PACKAGE: RULE (hint)": the prefix identifies the violation, the hint says what to do.
    assert sorted(line.split(" (", 1)[0] for line in lines) == sorted(expected)
    assert all(line.endswith(")") and "\n" not in line for line in lines)


def test_excluded_dependency_is_the_only_exception() -> None:
    """A declared dependency may be missing only when the lock's `excluded` list names it."""
    cutlass = pkg("nvidia-cutlass-dsl", "4.8.1", deps=("nvidia-cutlass-dsl-libs-base",))
    pins = add("blackwell", cutlass)(good())
    assert [str(v).split(" (")[0] for v in check(pins)] == [
        "blackwell: nvidia-cutlass-dsl-libs-base: closure"
    ]
    pins = set_extra("blackwell", excluded=["nvidia-cutlass-dsl-libs-base"])(pins)
    assert check(pins) == []


def test_exemption_is_narrow() -> None:
    """sglang may hold FA4 only because the policy names that pair; vllm may not."""
    strict = Policy(exempt={})
    lines = [str(v) for v in check(good(), strict)]
    assert [line.split(" (")[0] for line in lines] == ["sglang: flash-attn-4: only-in"]


def test_allowed_prerelease_is_per_set() -> None:
    pins = add("hopper", pkg("flash-attn-4", "4.0.0b36"))(good())
    rules = {str(v).split(" (")[0] for v in check(pins)}
    assert "hopper: flash-attn-4: no-prerelease" in rules


def test_check_is_fast_on_large_locks() -> None:
    many = tuple(pkg(f"pkg{i}", "1.0") for i in range(300))
    pins = good()
    pins = dataclasses.replace(
        pins,
        locks={
            n: dataclasses.replace(
                lk,
                packages=lk.packages + many,
                extra={**lk.extra, "requirements": [p.name for p in lk.packages + many]},
            )
            for n, lk in pins.locks.items()
        },
    )
    start = time.perf_counter()
    assert check(pins) == []
    assert time.perf_counter() - start < 0.5


# --- the breakages of issue 9, made to the committed locks through the Lock API -------------


def _committed() -> Pins:
    from support import REPO

    from halo.paths import Layout
    from halo.pins.locking import load_all

    state = load_all(Layout(REPO).pins)
    return Pins(locks=state.locks, sources=state.sources)


def _replace_package(set_name: str, name: str, **changes: object) -> Callable[[Pins], Pins]:
    def mutate(pins: Pins) -> Pins:
        old = pins.locks[set_name]
        packages = tuple(
            dataclasses.replace(p, **changes) if p.name == name else p  # type: ignore[arg-type]
            for p in old.packages
        )
        new = dataclasses.replace(old, packages=packages)
        return dataclasses.replace(pins, locks={**pins.locks, set_name: new})

    return mutate


def _packages(set_name: str, fn: Callable[[tuple[Package, ...]], tuple[Package, ...]]):
    """Change a committed lock's packages only: its requirements stay what was locked."""

    def mutate(pins: Pins) -> Pins:
        old = pins.locks[set_name]
        new = dataclasses.replace(old, packages=fn(old.packages))
        return dataclasses.replace(pins, locks={**pins.locks, set_name: new})

    return mutate


def _torch_file(pins: Pins) -> Pins:
    torch = pins.locks["blackwell"].package("torch")
    assert torch is not None
    (art,) = torch.artifacts
    cu126 = dataclasses.replace(art, file=art.file.replace("2.11.0-", "2.11.0+cu126-"))
    return _replace_package("blackwell", "torch", artifacts=(cu126,))(pins)


def _short_sha(pins: Pins) -> Pins:
    numpy = pins.locks["hopper"].package("numpy")
    assert numpy is not None
    arts = tuple(dataclasses.replace(a, sha256=a.sha256[:-1]) for a in numpy.artifacts)
    return _replace_package("hopper", "numpy", artifacts=arts)(pins)


WHY = {
    "cupy-cuda12x added to vllm": (
        _packages("vllm", lambda ps: (*ps, pkg("cupy-cuda12x", "13.6.0"))),
        {
            "vllm: cupy-cuda12x: cuda13-only",
            "vllm: cupy-cuda12x: closure",
            "vllm-arm64: cupy-cuda12x: platform-entry",  # the twin no longer matches
        },
    ),
    "NCCL removed from hopper": (
        _packages("hopper", lambda ps: tuple(p for p in ps if p.name != "nvidia-nccl-cu13")),
        {
            "hopper: nvidia-nccl-cu13: required-in",
            "hopper: nvidia-nccl-cu13: closure",
            "hopper-arm64: nvidia-nccl-cu13: platform-entry",
        },
    ),
    "vllm's NCCL changed": (
        _replace_package("vllm", "nvidia-nccl-cu13", version="2.27.7"),
        {
            "vllm: nvidia-nccl-cu13: nccl-matches-training",
            "vllm-arm64: nvidia-nccl-cu13: same-on-every-platform",
        },
    ),
    "a torch file named +cu126": (_torch_file, {"blackwell: torch: cuda13-only"}),
    "FA2 dropped from blackwell's sources": (
        map_sources(
            lambda s: dataclasses.replace(s, sets=("hopper",)) if s.name == "flash-attn" else s
        ),
        {"blackwell: flash-attn: required-in", "blackwell-arm64: flash-attn: required-in"},
    ),
    "a 63-hex sha256": (_short_sha, {"hopper: numpy: hash-pinned"}),
    "a second numpy entry at 2.1.0 in blackwell": (
        _packages("blackwell", lambda ps: (*ps, pkg("numpy", "2.1.0"))),
        {
            "blackwell: numpy: one-entry",
            "blackwell: numpy: numpy-below-2",
            "blackwell-arm64: numpy: same-on-every-platform",
        },
    ),
    "a second NCCL entry in hopper, for aarch64": (
        _packages(
            "hopper",
            lambda ps: (
                *ps,
                pkg("nvidia-nccl-cu13", "2.27.7", marker="platform_machine == 'aarch64'"),
            ),
        ),
        {
            "blackwell: nvidia-nccl-cu13: one-nccl",
            "hopper: nvidia-nccl-cu13: one-nccl",
            "hopper: nvidia-nccl-cu13: builder-matches",
            "hopper-arm64: nvidia-nccl-cu13: same-on-every-platform",
        },
    ),
}


def test_the_committed_pins_pass() -> None:
    assert [str(v) for v in check(_committed())] == []


@pytest.mark.parametrize("case", sorted(WHY))
def test_each_breakage_of_the_committed_pins_is_caught(case: str) -> None:
    mutate, expected = WHY[case]
    found = {str(v).split(" (", 1)[0] for v in check(mutate(_committed()))}
    assert found == expected
