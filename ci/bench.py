"""Benchmarks with budgets, run by `nox -s bench`: each row is a median of repeated runs.

  no-op build     `halo image build cpu` when halo:cpu is up to date                          < 0.5 s
                  `nox -s build-cpu` the same, through nox                                    < 2 s
  rebuild         a change to one file under halo/, rebuilt, over a cold `--force` build     <= 0.10
  pins check      `halo pins check` over every set                                           < 1 s
  lock check      `halo pins lock --check` over every set, warm uv cache                     < 60 s
  trainer         tokens/s of `halo launch sft` / TRL SFTTrainer, ~30M Llama, CPU   >= 1.0x (goal 1.3x)
  gpu             tokens/s and MFU of the trainer's SFT step / a plain PyTorch loop,
                  ~1B Llama, bf16, one GPU, two sequence lengths (halo/train/measure/gpubench.py) >= 0.95x
                  and a Qwen3-30B-A3B-shaped MoE (layers to fit): tokens/s per GPU and MFU of
                  active parameters, one GPU; EP (all-to-all, DeepEP) and TP rows on 2+ GPUs
                  (no GPU: one "skipped: no GPU" row, never a pass it did not measure)

`--lock-cache-warm`: uv's cache is warm already, so the lock check has no uncounted first run.
Exit 1 when a budget is missed. `--only NAME` (or just NAME: `nox -s bench -- gpu`) runs one
row, `--skip NAME` all but it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Row:
    name: str
    measured: str
    budget: str
    ok: bool


def _installed_env() -> dict[str, str]:
    """The environment as a user's halo runs: with bytecode. pip compiles it at install time
    and a checkout writes it on the first run; CI's environment sets PYTHONDONTWRITEBYTECODE,
    with which every run compiled halo, pydantic and yaml from source (measured: `halo pins
    check` 0.68 -> 0.77 s here for halo's own modules alone; 0.95 s of its 1 s in CI)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(argv: list[str], runs: int = 3, cwd: Path = REPO, warm_up: bool = False) -> float:
    """Median wall seconds of ``runs`` runs; ``warm_up``: after one uncounted run (bytecode
    written, caches filled)."""
    env = _installed_env()
    if warm_up:
        subprocess.run(argv, cwd=cwd, capture_output=True, check=False, env=env)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env=env)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            sys.exit(
                f"bench: {' '.join(argv)} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
            )
    return statistics.median(times)


def halo_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "halo", *args]


def noop_build() -> list[Row]:
    direct = wall(halo_cmd("image", "build", "cpu"), runs=5, warm_up=True)
    via_nox = wall(["nox", "-s", "build-cpu"], warm_up=True)
    return [
        Row("no-op build (halo image build cpu)", f"{direct:.2f} s", "< 0.5 s", direct < 0.5),
        Row("no-op build (nox -s build-cpu)", f"{via_nox:.2f} s", "< 2 s", via_nox < 2),
    ]


def rebuild() -> list[Row]:
    """A cold build (`--force`: no layer cache) and warm rebuilds after a one-file change under
    halo/, in a copy of the checkout whose images are tagged halo-bench:* (halo:cpu stays)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="halo-bench-") as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(
            REPO, copy, ignore=shutil.ignore_patterns(".git", ".nox", "__pycache__", "*.egg-info")
        )
        catalog = copy / "images" / "images.yaml"
        catalog.write_text(
            catalog.read_text().replace("repository: halo\n", "repository: halo-bench\n")
        )
        try:
            cold = wall(halo_cmd("image", "build", "cpu", "--force"), runs=1, cwd=copy)
            warm = []
            for i in range(3):
                with (copy / "halo" / "__init__.py").open("a") as fh:
                    fh.write(f"# bench edit {i}\n")
                warm.append(wall(halo_cmd("image", "build", "cpu"), runs=1, cwd=copy))
        finally:
            from halo.images.docker import Docker

            docker = Docker.discover()
            for ref in docker.refs("halo-bench"):
                docker.remove(ref)
    w = statistics.median(warm)
    ratio = w / cold
    return [
        Row("cold build, halo:cpu --force", f"{cold:.1f} s", "", True),
        Row(
            "warm rebuild / cold build (one file under halo/)",
            f"{w:.1f} s / {cold:.1f} s = {ratio:.3f}",
            "<= 0.10",
            ratio <= 0.10,
        ),
    ]


def pins_check() -> list[Row]:
    t = wall(halo_cmd("pins", "check"), runs=5, warm_up=True)
    return [Row("halo pins check (all sets)", f"{t:.2f} s", "< 1 s", t < 1)]


def lock_check(warm: bool = False) -> list[Row]:
    # uv's cache warm: after an uncounted run, unless the caller's run warmed it (CI's first
    # session checks every set, beside the builds' downloads, not in this quiet tail).
    t = wall(halo_cmd("pins", "lock", "--check"), runs=1, warm_up=not warm)
    return [Row("halo pins lock --check (all sets)", f"{t:.1f} s", "< 60 s", t < 60)]


def trainer() -> list[Row]:
    """halo/train/measure/bench.py: interleaved runs of `halo launch sft` and TRL's SFTTrainer."""
    from halo.train.measure.bench import FLOOR, GOAL, measure

    r = measure()
    detail = (
        f"{r['halo_tokens_per_cpu_s']:.0f} vs {r['trl_tokens_per_cpu_s']:.0f} tok/CPU-s = "
        f"{r['ratio']:.2f}x (wall {r['ratio_wall']:.2f}x)"
    )
    budget = f">= {FLOOR}x (goal {GOAL}x)"
    name = "trainer: halo launch sft / TRL SFTTrainer (CPU)"
    return [Row(name, detail, budget, r["ratio"] >= FLOOR)]


def gpu() -> list[Row]:
    """halo/train/measure/gpubench.py in its own process (it needs the GPU's memory to itself)."""
    import json
    import tempfile

    from halo.train.measure import gpubench

    if reason := gpubench.no_gpu_reason():
        print(f"bench: gpu: skipped: no GPU ({reason})", file=sys.stderr, flush=True)
        return [Row(*gpubench.skipped_row(reason)), Row(*gpubench.skipped_moe_row(reason))]
    with tempfile.TemporaryDirectory(prefix="halo-gpubench-") as tmp:
        out = Path(tmp) / "gpu.json"
        proc = subprocess.run(
            [sys.executable, "-m", "halo.train.measure.gpubench", "--json", str(out)],
            cwd=REPO,
            check=False,
        )
        if not out.is_file():
            sys.exit(f"bench: the GPU benchmark failed (exit {proc.returncode})")
        result = json.loads(out.read_text())
    return [Row(*r) for r in gpubench.rows(result)]


BENCHES: dict[str, Callable[[], list[Row]]] = {
    "noop-build": noop_build,
    "rebuild": rebuild,
    "pins-check": pins_check,
    "lock-check": lock_check,
    "trainer": trainer,
    "gpu": gpu,
}


def _verdict(r: Row) -> str:
    # A row that could not run here says so; it is not a pass.
    return "skipped" if r.measured.startswith("skipped") else "yes" if r.ok else "NO"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(BENCHES), action="append")
    parser.add_argument("--skip", choices=sorted(BENCHES), action="append", default=[])
    parser.add_argument("names", nargs="*", metavar="NAME", help="the same as --only NAME")
    parser.add_argument(
        "--lock-cache-warm",
        action="store_true",
        help="uv's cache is warm (`halo pins lock --check` of every set just ran): no warm-up run",
    )
    args = parser.parse_args()
    benches = {**BENCHES, "lock-check": lambda: lock_check(warm=args.lock_cache_warm)}
    if unknown := sorted(set(args.names) - set(BENCHES)):
        parser.error(f"unknown benchmark {unknown[0]!r} (known: {', '.join(sorted(BENCHES))})")
    args.only = (args.only or []) + args.names or None
    rows: list[Row] = []
    for name in [n for n in args.only or benches if n not in args.skip]:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        rows += benches[name]()
    from halo.report import table

    print(
        table(
            ("benchmark", "measured", "budget", "ok"),
            [(r.name, r.measured, r.budget, _verdict(r)) for r in rows],
        )
    )
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
