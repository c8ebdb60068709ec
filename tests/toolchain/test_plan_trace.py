"""The build, followed: evaluation runs first and touches no engine, store or network; then
realisation, which never enters evaluation again.

A tracer (sys.setprofile) records each time control enters a halo module none of whose
frames is on the stack: the modules a call passes through, and how often control comes back
into one it had left. Run as a script it prints those numbers for any `halo` command:

    .venv/bin/python tests/toolchain/test_plan_trace.py image build cpu
"""

from __future__ import annotations

import gc
import json
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EVALUATION = ("halo.images.evaluate",)
REALISATION = ("halo.images.realise",)
# What evaluating must never run: the engine, the network, a process, the store's fetch.
WORLD = (
    "halo.images.docker",
    "halo.images.realise",
    "halo.store.fetch",
    "halo.store.index",
    "halo.registry",
    "halo.cache",
    "subprocess",
    "socket",
    "http.client",
    "urllib.request",
)


@dataclass(frozen=True)
class Trace:
    entries: list[str]  # modules in the order control entered them (not already active)

    def modules(self, prefix: str = "halo.") -> Counter[str]:
        return Counter(m for m in self.entries if m.startswith(prefix))

    def returns(self, prefix: str = "halo.") -> int:
        """Entries into a module that had been entered before, and left."""
        seen: set[str] = set()
        count = 0
        for m in (m for m in self.entries if m.startswith(prefix)):
            count += m in seen
            seen.add(m)
        return count


def trace(fn: Callable[[], object], start: str | None = None) -> tuple[object, Trace]:
    """Run ``fn`` under the tracer; with ``start`` (a function name), from its first call on."""
    active: Counter[str] = Counter()
    stack: list[str] = []
    entries: list[str] = []
    on = [start is None]

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":
            if not on[0] and frame.f_code.co_name == start:
                on[0] = True
            mod = frame.f_globals.get("__name__", "") or ""
            if on[0] and active[mod] == 0:
                entries.append(mod)
            stack.append(mod)
            active[mod] += 1
        elif event == "return" and stack:
            active[stack.pop()] -= 1

    # Objects an earlier test left behind (an HTTP response, its socket) are finalised when the
    # collector runs, and their close() would be traced as this call's (seen once in CI:
    # "evaluating vllm for linux/arm64 ran ['socket']"): collect first, none while tracing.
    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
        gc.enable()
    return result, Trace(entries)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


CASES = [
    (image, platform)
    for image in ("cpu", "blackwell", "hopper", "vllm", "sglang", "blackwell-stack")
    for platform in ("linux/amd64", "linux/arm64")
    if not (image == "blackwell-stack" and platform == "linux/arm64")
]


@pytest.mark.parametrize(("image", "platform"), CASES)
def test_evaluation_runs_nothing_of_the_world(
    image: str, platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluating a plan enters no engine, process, socket, fetch or realisation code."""
    from halo.images.catalog import load_catalog
    from halo.images.evaluate.plan import evaluate
    from halo.images.graph import parse_platform

    monkeypatch.delenv("HALO_BUILDER", raising=False)
    catalog = load_catalog(REPO)
    target = parse_platform(platform)
    plan, seen = trace(lambda: evaluate(REPO, catalog, catalog.image(image), target))
    touched = sorted({m for m in seen.entries if _under(m, WORLD)})
    assert touched == [], f"evaluating {image} for {platform} ran {touched}"
    assert plan.target.platform == target  # type: ignore[attr-defined]


def test_a_no_op_build_reads_plan_then_realise() -> None:
    """`halo image build`, followed in this process: every evaluation module is entered before
    the first realisation module, and none after it (realisation never calls back)."""
    from support import docker_or_skip, halo

    docker_or_skip()
    built = halo("image", "build", "cpu", cwd=REPO)  # a no-op when CI's build-cpu ran first
    assert built.returncode == 0, built.stderr[-2000:]
    from halo.images.build import build_image
    from halo.images.catalog import load_catalog
    from halo.paths import store_root
    from halo.store.store import Store

    catalog = load_catalog(REPO)
    result, seen = trace(
        lambda: build_image(REPO, catalog, catalog.image("cpu"), Store(store_root()))
    )
    assert not result.rebuilt  # type: ignore[attr-defined]
    order = [m for m in seen.entries if _under(m, EVALUATION + REALISATION)]
    first_realise = next(i for i, m in enumerate(order) if _under(m, REALISATION))
    assert all(_under(m, EVALUATION) for m in order[:first_realise]), order
    assert not any(_under(m, EVALUATION) for m in order[first_realise:]), order


def main(argv: list[str]) -> int:
    """Trace `halo ARGV` from its build_image call; print the numbers as JSON."""
    from halo.cli import main as halo_main

    def run() -> object:
        try:
            return halo_main(argv)
        except SystemExit as exc:
            return exc.code

    rc, seen = trace(run, start="build_image")
    halo_modules = seen.modules()
    report = {
        "rc": rc,
        "modules": len(halo_modules),
        "returns": seen.returns(),
        "images_modules": len(seen.modules("halo.images.")),
        "images_returns": seen.returns("halo.images."),
        "entries": halo_modules.most_common(),
    }
    print(json.dumps(report, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main(sys.argv[1:]))
