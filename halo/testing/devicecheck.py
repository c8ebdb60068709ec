"""`nox -s device-check`: one prepared command for a lent GPU machine (docs/gpu.md).

Such a machine has Python 3.12, torch with CUDA 13, transformers, pytest, ... but no network,
no pydantic and no halo; what travels with the working tree is at most 64 MiB. So, here:

1. bundle what it lacks under BUNDLE (git-ignored): halo's wheel and halo's dependencies that
   are not there, as cp312 manylinux wheels, each pinned by version and sha256 from the
   toolchain's lock (pip download --require-hashes), plus the runner (device_runner.py);
2. check the bundle and the working tree together fit the 64 MiB;
3. print the exact command and carry list for the device tool's `run`
   (`--dry-run` stops here); with a GPU on this machine, run that command here too.

On the machine, the runner installs the wheels with `pip install --no-index --target`, runs
gpu_core natively and the GPU benchmark within 8 minutes, and writes a junit file and a
one-page table under $OUT.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError

REPO = Path(__file__).resolve().parents[2]
BUNDLE = ".device-check"  # relative to the repository root; in .gitignore
LIMIT = 64 * 1024 * 1024  # what the device tool carries: working tree + carried paths
COMMAND_LIMIT = 2000
CARRY_LIMIT = 8
RUNNER = Path(__file__).resolve().parent / "device_runner.py"
# The device machine's interpreter and platform.
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64")
# halo's runtime dependencies the machine lacks (it has pyyaml and packaging) and what
# pydantic needs in turn; versions and hashes come from the toolchain lock.
MISSING = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection",
           "typing-extensions", "tomli-w")  # fmt: skip
LOCK = "pins/toolchain.txt"
# The runner's own time budget (the device tool allows 10 minutes a command; the issue 8).
BUDGET_S = 470


@dataclass(frozen=True)
class Plan:
    command: str
    carry: tuple[str, ...]
    bundle_bytes: int
    tree_bytes: int


def locked_requirements(lock_text: str, names: tuple[str, ...], where: str = LOCK) -> list[str]:
    """The ``name==version --hash=...`` entries of ``names`` from a uv-compiled lock."""
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in [*lock_text.splitlines(), ""]:
        if line.startswith((" ", "\t")) and current:
            part = line.strip()
            if part.startswith("--hash="):
                current.append(part.rstrip("\\").strip())
            continue
        if current:
            name = current[0].split("==")[0].strip().lower()
            entries[name] = " ".join(current)
            current = []
        if line and not line.startswith("#") and "==" in line:
            current = [line.rstrip("\\").strip()]
    missing = [n for n in names if n not in entries]
    if missing:
        raise HaloError(f"{where}: no pinned entry for {', '.join(missing)}")
    return [entries[n] for n in names]


def _download(reqs: list[str], dest: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="halo-devcheck-") as tmp:
        req_file = Path(tmp) / "requirements.txt"
        req_file.write_text("\n".join(reqs) + "\n")
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--only-binary=:all:", "--require-hashes", "--python-version", PYTHON_VERSION,
                "--implementation", "cp", "--dest", str(dest), "-r", str(req_file)]  # fmt: skip
        for p in PLATFORMS:
            argv += ["--platform", p]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise HaloError(f"{LOCK}: pip download of the device bundle failed: {tail[0]}")


def tree_bytes(repo: Path) -> int:
    """What the device tool sends besides the carried paths: tracked and untracked,
    not-ignored files."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, capture_output=True, check=True,
    ).stdout  # fmt: skip
    return sum(
        (repo / p).stat().st_size for p in out.decode().split("\0") if p and (repo / p).is_file()
    )


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def check_size(bundle: int, tree: int, limit: int = LIMIT) -> None:
    if bundle + tree > limit:
        raise HaloError(
            f"{BUNDLE}: bundle {bundle / 2**20:.1f} MiB + working tree {tree / 2**20:.1f} MiB "
            f"exceeds the device tool's {limit / 2**20:.0f} MiB"
        )


def device_command(bundle: str = BUNDLE, budget_s: int = BUDGET_S) -> tuple[str, tuple[str, ...]]:
    """The `run` tool's command string and carry list."""
    command = (
        f"set -o pipefail; PYTHONUNBUFFERED=1 python3 {bundle}/device_runner.py "
        f'--bundle {bundle} --out "$OUT" --budget {budget_s} 2>&1 | tee "$OUT/runner.log"'
    )
    carry = (bundle,)
    if len(command) > COMMAND_LIMIT or len(carry) > CARRY_LIMIT:
        raise HaloError(f"device command: {len(command)} characters, {len(carry)} carried paths")
    return command, carry


def build(repo: Path = REPO) -> Plan:
    """Make BUNDLE afresh (staged, then renamed into place) and return the plan."""
    from halo.images.wheel import build_wheel

    final = repo / BUNDLE
    stage = Path(tempfile.mkdtemp(prefix=".device-check-", dir=repo))
    stage.chmod(0o755)
    try:
        wheels = stage / "wheels"
        wheels.mkdir()
        reqs = locked_requirements((repo / LOCK).read_text(), MISSING)
        _download(reqs, wheels)
        build_wheel(repo, wheels)
        shutil.copy2(RUNNER, stage / "device_runner.py")
        files = sorted(p for p in stage.rglob("*") if p.is_file())
        manifest = {
            p.relative_to(stage).as_posix(): {
                "bytes": p.stat().st_size,
                "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
            }
            for p in files
        }
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if final.exists():
            shutil.rmtree(final)
        stage.rename(final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    size = folder_bytes(final)
    tree = tree_bytes(repo)
    check_size(size, tree)
    command, carry = device_command()
    return Plan(command, carry, size, tree)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m halo.testing.devicecheck", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="build the bundle and print the command; run nothing"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where a local run writes (default: a temp folder)"
    )
    args = parser.parse_args(argv)
    try:
        plan = build()
    except HaloError as exc:
        print(f"halo: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    wheels = sorted((REPO / BUNDLE / "wheels").glob("*.whl"))
    print(f"device-check: bundle {BUNDLE}/ {plan.bundle_bytes / 2**20:.2f} MiB ({len(wheels)} wheels: "
          f"{', '.join(w.name.split('-')[0] for w in wheels)}); working tree {plan.tree_bytes / 2**20:.2f} MiB; "
          f"limit {LIMIT // 2**20} MiB")  # fmt: skip
    print(f"device-check: run tool command ({len(plan.command)} chars):")
    print(plan.command)
    print(f"device-check: carry: {json.dumps(list(plan.carry))}")
    if args.dry_run:
        return 0
    from halo.train.measure.gpubench import no_gpu_reason

    if reason := no_gpu_reason():
        print(f"device-check: no GPU here ({reason}); pass the command above to a lent GPU machine")
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="halo-device-check-"))
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OUT": str(out)}
    rc = subprocess.run(["bash", "-c", plan.command], cwd=REPO, env=env, check=False).returncode
    print(f"device-check: results under {out}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
