"""The minimum-driver check: a fake `nvidia-smi` on PATH stands in for the host's driver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import EXAMPLES, outputs, run_halo

pytestmark = pytest.mark.cpu

SFT = EXAMPLES / "sft" / "config.yaml"


def _fake_smi(folder: Path, version: str | None) -> str:
    """A PATH whose nvidia-smi prints ``version`` as nvidia-smi's csv does (None: no nvidia-smi)."""
    folder.mkdir()
    if version is not None:
        smi = folder / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho '{version}'\n")
        smi.chmod(0o755)
    # Only the fake folder and the basics: a real nvidia-smi further on must not answer.
    return os.pathsep.join([str(folder), "/usr/bin", "/bin"])


def test_driver_too_old_is_one_line_and_fails_preflight(tmp_path: Path) -> None:
    path = _fake_smi(tmp_path / "bin", "550.54.15")
    r = run_halo("preflight", str(SFT), "--", *outputs(tmp_path / "out"), PATH=path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        "halo: error: preflight failed: driver: driver 550.54.15, image needs ≥ 580 (CUDA 13.0)"
    ]


@pytest.mark.parametrize(
    ("version", "shown"), [("580.65.06", "driver 580.65.06 (≥ 580"), (None, "no GPU here")]
)
def test_new_enough_driver_or_none_at_all_passes(
    tmp_path: Path, version: str | None, shown: str
) -> None:
    path = _fake_smi(tmp_path / "bin", version)
    r = run_halo("preflight", str(SFT), "--", *outputs(tmp_path / "out"), PATH=path)
    assert r.returncode == 0 and "preflight: ok" in r.stdout, r.stderr
    assert shown in r.stdout


def test_the_gpu_tiers_skip_with_the_same_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from halo.train.launch.driver import check

    monkeypatch.setenv("PATH", _fake_smi(tmp_path / "bin", "535.183.01"))
    assert check().detail == "driver 535.183.01, image needs ≥ 580 (CUDA 13.0)"
    assert not check().ok


def _count_gpus(driver_paths: list[str]) -> tuple[int, bool]:
    """gpu_count in a fresh interpreter: its answer, and whether torch got imported."""
    code = (
        "import sys; from halo.train.launch.preflight import gpu_count; "
        f"n = gpu_count({tuple(driver_paths)!r}); print(n, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    n, imported = out.stdout.split()
    return int(n), imported == "True"


def test_without_a_driver_the_launcher_counts_no_gpu_and_never_imports_torch(
    tmp_path: Path,
) -> None:
    # No driver: 0, and torch stays out of the launcher (the trainer imports it once).
    assert _count_gpus([str(tmp_path / "no-nvidiactl")]) == (0, False)
    # A driver's node present: torch is asked (here it finds no GPU, since there is none).
    node = tmp_path / "nvidiactl"
    node.touch()
    assert _count_gpus([str(node)]) == (0, True)
