"""The minimum-driver check: a fake `nvidia-smi` on PATH stands in for the host's driver."""

from __future__ import annotations

import os
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
