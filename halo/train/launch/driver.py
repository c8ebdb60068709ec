"""The minimum NVIDIA driver the GPU images need, checked where it is cheap: nvidia-smi.

The images carry CUDA 13.0 (the locks' nvidia-*-cu13 wheels); a CUDA 13.0 runtime needs a
driver of branch 580 or newer. Debian has no cuda-compat to lift that (see the README's
"Forward compatibility"), so an older driver gets one line saying so, not a CUDA error deep in
torch. No torch needed: a CPU-only host has no nvidia-smi, and that is fine.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

MIN_DRIVER = 580
CUDA = "13.0"
NEEDS = f"image needs ≥ {MIN_DRIVER} (CUDA {CUDA})"


@dataclass(frozen=True)
class Driver:
    version: str | None  # None: no nvidia-smi, or it found no GPU
    ok: bool
    detail: str


def query() -> str | None:
    """The driver version nvidia-smi reports (the first GPU's), or None where there is none."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.split()
    return lines[0] if proc.returncode == 0 and lines else None


def check(version: str | None = None, probe: bool = True) -> Driver:
    found = query() if version is None and probe else version
    if found is None:
        return Driver(
            None, True, "no NVIDIA driver (no nvidia-smi): no GPU here, the CPU path runs"
        )
    try:
        major = int(found.split(".", 1)[0])
    except ValueError:
        return Driver(found, False, f"driver {found!r}: not a version nvidia-smi gives; {NEEDS}")
    if major < MIN_DRIVER:
        return Driver(found, False, f"driver {found}, {NEEDS}")
    return Driver(found, True, f"driver {found} (≥ {MIN_DRIVER}, CUDA {CUDA})")
