"""`halo job`: one lifecycle on both backends, the tiny example in halo:cpu here and on Slurm.

start (detached), status, logs, stop (graceful: the emergency checkpoint, exit 0), restart
(resumes), clean --keep (dry run, then --force), and max_duration_hours's timer. `halo job`
runs on the test's interpreter: in CI the toolchain's, which has no torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from .conftest import REPO, SFT, Cluster, meta

LONG = ["--training.epochs=50", "--checkpoint.every_steps=4", "--checkpoint.keep_last=0"]


def job(
    scratch: Path, *args: str, timeout: float = 400, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HALO_SCRATCH": str(scratch), "PYTHONPATH": str(REPO)}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra_env)
    return subprocess.run(
        [sys.executable, "-m", "halo", "job", *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout,
    )  # fmt: skip


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def wait_log(scratch: Path, name: str, needle: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = job(scratch, "logs", name).stdout
        if needle in out:
            return out
        time.sleep(1)
    job(scratch, "stop", name)
    raise AssertionError(f"{needle!r} not in {name}'s log after {timeout}s:\n{out[-3000:]}")


def checkpoints(scratch: Path, name: str) -> list[Path]:
    root = scratch / "jobs" / name / "checkpoints" / "tiny-sft"
    found = [p for p in root.iterdir() if (p / "meta.json").exists()] if root.is_dir() else []
    return sorted(found, key=lambda p: (int(p.name.split("_")[0][1:]), meta(p)["step"]))


def lifecycle(scratch: Path, backend: list[str]) -> None:
    name = f"life-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    out = ok(job(scratch, "start", str(SFT), "--name", name, *backend, "--", *LONG))
    assert f"started {name}" in out
    wait_log(scratch, name, "step 3/")
    status = ok(job(scratch, "status", name))
    assert "running" in status, status
    assert "step 3/" in ok(job(scratch, "logs", name))

    out = ok(job(scratch, "stop", name))
    assert "exited (exit 0)" in out and "(signal)" in out, out
    first = checkpoints(scratch, name)[-1]
    assert meta(first)["reason"] == "signal"
    assert "exited  0" in ok(job(scratch, "status", name))

    ok(job(scratch, "restart", name))
    log = wait_log(scratch, name, "resumed from ")
    assert f"(step {meta(first)['step']})" in log, log
    wait_log(scratch, name, f"step {meta(first)['step'] + 2}/")
    ok(job(scratch, "stop", name))
    found = checkpoints(scratch, name)
    assert len(found) >= 3, found

    dry = ok(job(scratch, "clean", name, "--keep", "1"))
    assert dry.count("would remove") == len(found) - 1 and "dry run" in dry, dry
    assert checkpoints(scratch, name) == found
    ok(job(scratch, "clean", name, "--keep", "1", "--force"))
    assert checkpoints(scratch, name) == found[-1:]
    print(f"{backend[:2]} lifecycle: {time.monotonic() - started:.0f}s")


@pytest.mark.docker
def test_docker_lifecycle(tmp_path: Path) -> None:
    if not shutil.which("docker") and not Path("/usr/bin/docker").exists():
        pytest.skip("needs Docker")
    from halo.testing.container import built_image_ref

    try:
        built_image_ref("cpu")
    except Exception as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"needs halo:cpu: {exc}")
    try:
        lifecycle(tmp_path, ["--backend", "docker"])
    finally:
        from halo.images.docker import Docker

        docker = Docker.discover().exe
        names = subprocess.run([docker, "ps", "-aq", "--filter", "name=life-"],
                               capture_output=True, text=True).stdout.split()  # fmt: skip
        if names:
            subprocess.run([docker, "rm", "-f", *names], capture_output=True)


@pytest.mark.slurm
def test_slurm_lifecycle(cluster: Cluster, venv: Path, tmp_path: Path) -> None:
    lifecycle(tmp_path, ["--backend", "slurm", "--venv", str(venv)])


@pytest.mark.slurm
def test_max_duration_hours_stops_the_job_gracefully(
    cluster: Cluster, venv: Path, tmp_path: Path
) -> None:
    name = f"timer-{uuid.uuid4().hex[:8]}"
    # 0.02 h: 72 s, while the job is still training: its step-8 checkpoint pauses for 90 s (the
    # trainer's test hook), however fast the steps are. The timer must fire after the trainer
    # has installed its signal handler: 22 s did not on a loaded CI machine (startup alone
    # took longer; the job died of the SIGTERM, 143).
    ok(job(tmp_path, "start", str(SFT), "--name", name, "--backend", "slurm", "--venv",
           str(venv), "--", *LONG, "--runtime.max_duration_hours=0.02",
           HALO_TEST_HOOK_CHECKPOINT_SLEEP="8:90"))  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if not {"running", "pending"} & set(job(tmp_path, "status", name).stdout.split()):
            break
        time.sleep(2)
    status = ok(job(tmp_path, "status", name))
    assert "exited" in status, status
    # The timer is a process of its own: it reports the checkpoint after the job has exited
    # (reading the config for it took seconds on a loaded machine; read at once, its last
    # line was not there yet).
    timer_log = tmp_path / "jobs" / name / "timer.log"
    deadline = time.monotonic() + 120
    while "latest checkpoint" not in timer_log.read_text() and time.monotonic() < deadline:
        time.sleep(1)
    timer = timer_log.read_text()
    assert "max_duration_hours reached" in timer and "(signal)" in timer, timer
    assert meta(checkpoints(tmp_path, name)[-1])["reason"] == "signal"
