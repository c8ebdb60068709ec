"""`halo job` without a job running: bad input is one line and exit 2, and no torch is needed."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, halo

SFT = REPO / "examples" / "sft" / "config.yaml"
TARGETS = {
    "job-start": ["CONFIG=examples/sft/config.yaml"],
    "job-status": [],
    "job-logs": ["JOB=x", "FOLLOW=1"],
    "job-stop": ["JOB=x"],
    "job-restart": ["JOB=x"],
    "job-clean": ["JOB=x", "FORCE=1"],
    "test-slurm": [],
    "stack-install": ["PREFIX=/tmp/x"],
    "image-export": ["OUT=/tmp/x.sqsh"],
}


def test_each_job_target_is_one_halo_or_nox_command() -> None:
    if shutil.which("make") is None:
        pytest.skip("needs GNU make (.ci/run installs it)")
    for target, args in TARGETS.items():
        proc = subprocess.run(["make", "--no-print-directory", "-n", target, *args], cwd=REPO,
                              capture_output=True, text=True)  # fmt: skip
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        assert proc.returncode == 0 and len(lines) == 1, (target, proc.stdout, proc.stderr)
        argv = shlex.split(lines[0])
        assert argv[0] == "nox" or argv[0].endswith("halo"), (target, lines)
    help_ = subprocess.run(["make", "help"], cwd=REPO, capture_output=True, text=True).stdout
    assert set(TARGETS) <= {ln.split()[0] for ln in help_.splitlines() if ln.strip()}


def _env(tmp: Path) -> dict[str, str]:
    return {"HALO_SCRATCH": str(tmp)}


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["status", "nope"], "halo: error: job nope: no such job under"),
        (["logs", "nope"], "halo: error: job nope: no such job under"),
        (["stop", "nope"], "halo: error: job nope: no such job under"),
        (["start", str(SFT), "--", "--training.max_steps=oops"], "training.max_steps"),
        (["start", str(SFT), "--backend", "kube"], "--backend: expected docker or slurm"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, argv: list[str], line: str
) -> None:
    proc = halo("job", *argv, cwd=REPO, env=_env(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert line in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def _fake_job(tmp: Path, steps: list[int]) -> Path:
    """A job record and checkpoints with meta.json, as a stopped job leaves them."""
    folder = tmp / "jobs" / "fake"
    ck = folder / "checkpoints" / "tiny-sft"
    for s in steps:
        (ck / f"r1_epoch_0_step_{s}").mkdir(parents=True)
        (ck / f"r1_epoch_0_step_{s}" / "meta.json").write_text(json.dumps({"files": {}, "step": s}))
    record = {"name": "fake", "backend": "slurm", "method": "sft", "config": str(SFT),
              "overrides": [], "grace_s": 5, "ids": ["999999"], "log": str(folder / "x.log")}  # fmt: skip
    (folder / "job.json").write_text(json.dumps(record))
    return ck


def test_clean_is_a_dry_run_unless_forced_and_keeps_the_newest(tmp_path: Path) -> None:
    ck = _fake_job(tmp_path, [4, 8, 12])
    proc = halo("job", "clean", "fake", "--keep", "1", cwd=REPO, env=_env(tmp_path))
    assert proc.returncode == 0 and proc.stdout.count("would remove") == 2, proc.stdout
    assert len(list(ck.iterdir())) == 3
    proc = halo("job", "clean", "fake", "--keep", "1", "--force", cwd=REPO, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in ck.iterdir()] == ["r1_epoch_0_step_12"]
    proc = halo("job", "clean", "fake", "--keep", "0", cwd=REPO, env=_env(tmp_path))
    assert proc.returncode == 2 and "--keep: expected at least 1" in proc.stderr


def test_status_logs_and_clean_need_no_torch(tmp_path: Path) -> None:
    _fake_job(tmp_path, [4])
    (tmp_path / "jobs" / "fake" / "x.log").write_text("step 1/4 loss 5.0\n")
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises
        "from halo.cli import main\n"
        "for argv in (['job', 'logs', 'fake'], ['job', 'clean', 'fake', '--keep', '1']):\n"
        "    assert main(argv) == 0, argv\n"
    )
    env = {**os.environ, "HALO_SCRATCH": str(tmp_path), "PYTHONPATH": str(REPO)}
    # Job 999999 is not known to a Slurm here, or there is no Slurm: either way "unknown".
    proc = subprocess.run([sys.executable, "-c", code + "main(['job', 'status', 'fake'])"],
                          capture_output=True, text=True, env=env, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "step 1/4 loss 5.0" in proc.stdout and "unknown" in proc.stdout, proc.stdout
