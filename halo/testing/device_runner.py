"""The device-check runner, on a lent GPU machine (copied into the bundle; standard library only).

    python3 .device-check/device_runner.py --bundle .device-check --out "$OUT" --budget 470

Installs the bundle's wheels into a target folder (no index, no network), runs the gpu_core
tier natively with a junit file, then the GPU benchmark in what is left of the budget, and
writes under --out (at most 8 files, no subfolders): gpu_core.xml, gpu_core.log, bench.json,
bench.log, table.md (runner.log is the command's own tee). Exit 0 only when both passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SITE = "/tmp/halo-device-site"
# The benchmark's share of the budget; gpu_core gets the rest.
BENCH_S = 170
# One hung test fails on its own (pytest-timeout) instead of the whole run losing its junit.
PER_TEST_S = 180


def install(bundle: Path, site: str = SITE) -> None:
    wheels = sorted(str(p) for p in (bundle / "wheels").glob("*.whl"))
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
            "--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--root-user-action=ignore",
            "--target", site, *wheels]  # fmt: skip
    subprocess.run(argv, check=True)


def run_logged(argv: list[str], log: Path, timeout: float, env: dict[str, str]) -> int:
    """Run with output to ``log``; 124 when it ran past ``timeout``."""
    with log.open("w") as fh:
        try:
            return subprocess.run(
                argv, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, env=env, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            fh.write(f"\n(device-check: stopped after {timeout:.0f} s)\n")
            return 124


def junit_rows(path: Path) -> list[tuple[str, str, str, str]]:
    """(test, outcome, seconds, detail) per test case of a junit file."""
    if not path.is_file():
        return []
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
                detail = (
                    (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                )
                break
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        extra = "; ".join(f"{k}: {v}" for k, v in props.items())
        detail = "; ".join(x for x in (detail, extra) if x)
        rows.append((case.get("name", "?"), outcome, f"{float(case.get('time', 0)):.1f}", detail))
    return rows


def bench_lines(path: Path) -> list[str]:
    if not path.is_file():
        return ["(the benchmark wrote no result)"]
    r = json.loads(path.read_text())
    if "skipped" in r:
        return [f"skipped: {r['skipped']}"]
    lines = [f"{r['gpu']}, attention {r['attention']}, {r['params'] / 1e9:.2f}B parameters, "
             f"{r['tokens_per_step']} tokens/step", "",
             "| seq len x batch | trainer tokens/s | trainer MFU | plain tokens/s | plain MFU | ratio (>= 0.95) |",
             "|---|---|---|---|---|---|"]  # fmt: skip

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    for p in r["points"]:
        t, q = p["trainer"], p["plain"]
        lines.append(
            f"| {p['seq_len']} x {p['batch']} | {t['tokens_per_s']:.0f} | {pct(t['mfu'])} | "
            f"{q['tokens_per_s']:.0f} | {pct(q['mfu'])} | {p['ratio']:.3f} |"
        )
    moe = r.get("moe") or []
    if moe:  # the MoE rows (halo/train/measure/gpubench.py: moe_suite)
        lines += ["", "| MoE, Qwen3-30B-A3B-shaped | GPUs | EP | TP | backend | tokens/s/GPU | MFU |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for m in moe:
            if "run" in m:  # a row that failed or could not run here
                why = f"failed: {m['failed']}" if "failed" in m else f"skipped: {m['skipped']}"
                lines.append(f"| {m['run']} | | | | {why} | | |")
                continue
            lines.append(
                f"| {m['layers']} of 48 layers, seq {m['seq_len']} x {m['batch']} | {m['gpus']} | "
                f"{m['ep']} | {m['tp']} | {m['backend']} | {m['tokens_per_s_per_gpu']:.0f} | "
                f"{pct(m['mfu'])} |"
            )
    return lines


def table(out: Path, versions: str, rc_tests: int, rc_bench: int, seconds: float) -> str:
    rows = junit_rows(out / "gpu_core.xml")
    counts: dict[str, int] = {}
    for _, outcome, _, _ in rows:
        counts[outcome] = counts.get(outcome, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no junit"
    lines = ["# device-check", "", versions, "",
             f"gpu_core: {summary} (pytest exit {rc_tests}); benchmark exit {rc_bench}; "
             f"{seconds:.0f} s in all", "", "| test | result | s | detail |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {n} | {o} | {s} | {d.replace('|', '/')} |" for n, o, s, d in rows]
    lines += [
        "",
        "## GPU benchmark (halo/train/measure/gpubench.py)",
        "",
        *bench_lines(out / "bench.json"),
    ]
    return "\n".join(lines) + "\n"


def versions(env: dict[str, str]) -> str:
    code = ("import torch,sys;print(f'python {sys.version.split()[0]}, torch {torch.__version__}, "
            "CUDA {torch.version.cuda}, NCCL {\".\".join(map(str, torch.cuda.nccl.version()))}, "
            "GPU {torch.cuda.get_device_name() if torch.cuda.is_available() else None}')")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    return (
        (proc.stdout or proc.stderr).strip().splitlines()[-1]
        if (proc.stdout or proc.stderr)
        else "?"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=470)
    args = parser.parse_args(argv)
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    install(args.bundle)
    repo = Path.cwd()
    # The tree's halo (the wheel holds the same hashed files) first, so the tests and the
    # benchmark find examples/; the bundle's dependencies after it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), SITE]), "PYTHONUNBUFFERED": "1"}
    env.setdefault("HALO_SCRATCH", "/tmp/halo-scratch")
    left = args.budget - (time.monotonic() - start)
    tests_s = max(60.0, left - BENCH_S)
    pytest = [sys.executable, "-m", "pytest", "tests/gpu_core", "-m", "gpu_core", "-p", "no:cacheprovider",
              "-rs", f"--junitxml={args.out / 'gpu_core.xml'}", "-o", "junit_family=xunit1",
              "--timeout", str(int(min(PER_TEST_S, tests_s)))]  # fmt: skip
    print(f"device-check: gpu_core ({tests_s:.0f} s at most)", flush=True)
    rc_tests = run_logged(pytest, args.out / "gpu_core.log", tests_s + 15, env)
    left = args.budget - (time.monotonic() - start)
    print(f"device-check: GPU benchmark ({left:.0f} s at most)", flush=True)
    bench = [
        sys.executable,
        "-m",
        "halo.train.measure.gpubench",
        "--json",
        str(args.out / "bench.json"),
    ]
    rc_bench = run_logged(bench, args.out / "bench.log", max(30.0, left - 5), env)
    page = table(args.out, versions(env), rc_tests, rc_bench, time.monotonic() - start)
    (args.out / "table.md").write_text(page)
    print(page, flush=True)
    return 0 if rc_tests == 0 and rc_bench == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
