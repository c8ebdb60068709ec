"""`halo stack verify SET --image NAME`: the stack check run inside a built image.

The host starts the image once (halo.testing.container: `--network none`, the checkout at
/workspace read-only) with the image's own halo: `halo stack verify SET --installed
/opt/venv`. Inside, nothing is installed: the checks read the environment the image build
made — the lock it was built from (/etc/halo/build.json's lock hash == the checkout's lock),
pip check, versions, imports, torch/NCCL/numpy, absent modules, the server's own parser, the
JIT toolchain, the ELF audit and the patches (already in place; nothing is written). The rows
come back as one JSON line after a marker and are printed by the host like a venv check.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from halo.errors import HaloError
from halo.hashing import sha256_file
from halo.patching.engine import drift_lines, plan_all
from halo.patching.loader import load_patches
from halo.patching.model import State
from halo.pins.lockfile import normalize
from halo.stack import verify as checks
from halo.stack.verify import FAIL, OK, Inputs, Row

BUILD_JSON = Path("/etc/halo/build.json")
VENV = "/opt/venv"
ROWS_MARK = "@@halo-stack-rows@@"


def _row(check: str, failures: list[str], detail: str) -> Row:
    return Row(check, FAIL if failures else OK, detail, tuple(failures))


def build_record(path: Path = BUILD_JSON) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise HaloError(f"{path}: not a halo image's build record ({exc})") from exc


def lock_row(lock_path: Path, record: dict) -> Row:
    """The image was built from the lock being checked (else every other row checks the wrong
    thing)."""
    inputs = record.get("inputs", {})
    built = inputs.get("lock_sha256")
    have = sha256_file(lock_path)
    failures = []
    if built != have:
        failures.append(
            f"{lock_path.name}: sha256 {have[:12]}, the image was built from {str(built)[:12]}; "
            f"rebuild it (`halo image build`) or check the lock it was built from"
        )
    detail = f"{record.get('image_ref', '?')} built from {lock_path.name} ({have[:12]})"
    return _row("lock", failures, detail)


def kernel_distributions(record: dict) -> frozenset[str]:
    """The image's source-pin distributions (its kernels layer), from its build record."""
    sources = record.get("inputs", {}).get("sources") or {}
    return frozenset(normalize(str(pin.get("distribution", name))) for name, pin in sources.items())


def halo_distributions() -> frozenset[str]:
    """Halo itself, which every image installs on top of its lock (layer 3)."""
    from importlib.metadata import packages_distributions

    return frozenset(normalize(d) for d in packages_distributions().get("halo", []))


def patches_in_place(inputs: Inputs, site: Path) -> Row:
    """Every patch is applied, fixed upstream or not installed; a defect still present fails."""
    plans = plan_all(load_patches(inputs.patches), site)
    results = [p.result for p in plans]
    failures = drift_lines(results)
    failures += [
        f"{r.name}: the defect is still in {r.distribution} (the image did not apply it)"
        for r in results
        if r.state is State.APPLIED
    ]
    shown = [f"{r.name} {r.state}" for r in results if r.state is not State.NOT_INSTALLED]
    rest = sum(1 for r in results if r.state is State.NOT_INSTALLED)
    detail = "; ".join(shown + ([f"{rest} not installed"] if rest else []))
    return _row("patches", failures, detail + " (read only)")


def verify_installed(inputs: Inputs, record: dict, lock_path: Path) -> list[Row]:
    """The checks of `halo stack verify`, on the environment an image build installed."""
    rows = [lock_row(lock_path, record)]
    site = checks.site_packages(inputs.venv)
    kernels = kernel_distributions(record) | halo_distributions()
    rows.append(checks.pip_check(inputs))
    rows.append(checks.versions(inputs, site, kernels))
    rows.append(patches_in_place(inputs, site))
    result = checks.run_probe(inputs, Path("/tmp/halo-probe"))
    rows += checks.probe_rows(inputs, result, site)
    if inputs.lock.package(checks.NVCC) is not None:
        rows.append(checks.jit_toolchain(inputs, result.get("torch")))
    rows.append(checks.elf(inputs, site))
    return rows


def emit(rows: list[Row]) -> None:
    print(ROWS_MARK + json.dumps([asdict(r) for r in rows]))
    sys.stdout.flush()


def parse(stdout: str) -> list[Row] | None:
    for line in stdout.splitlines():
        if line.startswith(ROWS_MARK):
            return [
                Row(r["check"], r["result"], r["detail"], tuple(r["failures"]))
                for r in json.loads(line[len(ROWS_MARK) :])
            ]
    return None


def run_in(image_ref: str, set_name: str) -> tuple[list[Row], int]:
    """Start the image's own halo on its own venv; (rows, docker's exit status)."""
    from halo.images.docker import Docker
    from halo.paths import find_repo, scratch_root
    from halo.testing.container import RunSpec, docker_run_args, prepare_scratch

    scratch = scratch_root()
    prepare_scratch(scratch)
    spec = RunSpec(
        image=image_ref,
        entrypoint="",  # the server images' entrypoint is serve.sh
        argv=["halo", "stack", "verify", set_name, "--installed", VENV],
    )
    proc = Docker.discover().run(docker_run_args(spec, find_repo(), scratch), capture=True)
    sys.stderr.write(proc.stderr or "")
    rows = parse(proc.stdout or "")
    if rows is None:
        tail = [ln for ln in ((proc.stdout or "") + (proc.stderr or "")).splitlines() if ln][-2:]
        reason = " / ".join(tail) or "no output"
        rows = [
            Row(
                "in-image",
                FAIL,
                f"halo stack verify inside {image_ref}",
                (f"exited {proc.returncode} without rows: {reason}",),
            )
        ]
    return rows, proc.returncode


def remove_image(ref: str) -> list[str]:
    """Remove ``ref`` and the tags of the same image (moving and immutable); what went."""
    from halo.images.docker import Docker

    docker = Docker.discover()
    repository, _, tag = ref.rpartition(":")
    moving = tag.split("-", 1)[0] if "-" in tag else tag
    gone = [
        r
        for r in docker.refs(repository)
        if r == ref or r == f"{repository}:{moving}" or r.startswith(f"{repository}:{moving}-")
    ]
    for r in gone:
        docker.remove(r)
    return gone
