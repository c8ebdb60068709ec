"""`halo stack install cpu DIR` (run by `nox -s test-slurm`): DIR/bin/halo trains on its own."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import SFT, checkpoints, losses, meta, outputs

pytestmark = pytest.mark.slurm


def test_the_installed_venv_trains_without_the_checkout(venv: Path, tmp_path: Path) -> None:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    e["OMP_NUM_THREADS"] = "1"
    # Its own halo (the wheel the install step put there), not this checkout's.
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import halo; print(halo.__file__)"],
        capture_output=True, text=True, env=e, cwd=tmp_path, check=True,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(venv)), where
    argv = [str(venv / "bin" / "halo"), "launch", "sft", str(SFT), "--", *outputs(tmp_path)]
    proc = subprocess.run(
        [*argv, "--training.max_steps=4"], capture_output=True, text=True, env=e, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(losses(tmp_path)) == 4 and losses(tmp_path)[-1] < losses(tmp_path)[0]
    assert [meta(c)["reason"] for c in checkpoints(tmp_path)] == ["final"]
