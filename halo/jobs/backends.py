"""The two places a job runs: a detached container on this host, or a Slurm batch job.

One interface (start, state, stop), so `halo job` is the same whichever runs the job:

- docker: `docker run -d --name JOB-N` through halo.testing.container (the flags every Halo
  container gets), the command's output appended to the job's log on the scratch volume;
  stop is `docker stop --time GRACE`: SIGTERM to the trainer (through --init), SIGKILL after
  the grace period. `--debug` adds SYS_PTRACE, for py-spy on a hung rank.
- slurm: `halo launch --slurm` renders and submits the sbatch script; the state comes from
  squeue/scontrol; stop is `scancel --signal=TERM` (every step's tasks: the trainer writes its
  emergency checkpoint), then `scancel` once the grace period is over.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.jobs.record import JobRecord

RUNNING = "running"


@dataclass(frozen=True)
class State:
    state: str  # running, pending, exited, failed, cancelled, unknown
    exit_code: int | None
    detail: str = ""

    @property
    def active(self) -> bool:
        return self.state in (RUNNING, "pending")


def _outputs(job: JobRecord, ck: str, logs: str) -> list[str]:
    return [f"--runtime.paths.checkpoints={ck}", f"--runtime.paths.logs={logs}"]


# --- docker -----------------------------------------------------------------------------------


def _docker() -> str:
    from halo.images.docker import Docker

    return Docker.discover().exe


def _docker_start(job: JobRecord) -> str:
    from halo.paths import find_repo, scratch_root
    from halo.testing.container import SCRATCH, WORKSPACE, RunSpec, docker_run_args

    repo = find_repo()
    config = Path(job.config)
    try:
        inside = f"{WORKSPACE}/{config.relative_to(repo)}"
    except ValueError:
        raise HaloError(
            f"{config}: a docker job's config must be inside the checkout {repo} (mounted at "
            f"{WORKSPACE})"
        ) from None
    folder = f"{SCRATCH}/jobs/{job.name}"
    name = f"{job.name}-{len(job.ids) + 1}"
    log = f"{folder}/train.log"
    argv = ["halo", "launch", job.method, inside, "--"]
    argv += [*_outputs(job, f"{folder}/checkpoints", f"{folder}/logs"), *job.overrides]
    # The trainer's output goes to the log on the scratch volume (it outlives the container);
    # exec, so that SIGTERM from `docker stop` (through --init) reaches halo launch itself.
    shell = ["sh", "-c", f'exec "$@" >>{log} 2>&1', "sh", *argv]
    spec = RunSpec(
        image=job.image or "halo:cpu",
        argv=shell,
        detach_name=name,
        cap_add=("SYS_PTRACE",) if job.debug else (),
    )
    scratch = scratch_root()
    (job.folder).mkdir(parents=True, exist_ok=True)
    args = docker_run_args(spec, repo, scratch)
    proc = subprocess.run([_docker(), "run", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise HaloError(f"job {job.name}: docker run failed: {proc.stderr.strip()[-300:]}")
    job.log = str(job.folder / "train.log")
    return name


def _docker_state(cid: str) -> State:
    try:
        exe = _docker()
    except HaloError as exc:
        return State("unknown", None, exc.message)
    proc = subprocess.run(
        [exe, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", cid],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return State("unknown", None, f"no container {cid}")
    status, code = proc.stdout.split()
    if status in ("running", "restarting", "paused"):
        return State(RUNNING, None, f"container {cid}")
    if status == "created":
        return State("pending", None, f"container {cid}")
    rc = int(code)
    return State("exited" if rc == 0 else "failed", rc, f"container {cid}")


def _docker_stop(cid: str, grace_s: int) -> None:
    subprocess.run(
        [_docker(), "stop", "--time", str(grace_s), cid], capture_output=True, check=False
    )


def _docker_forget(cid: str) -> None:
    subprocess.run([_docker(), "rm", "-f", cid], capture_output=True, check=False)


# --- slurm ------------------------------------------------------------------------------------


def _slurm_start(job: JobRecord) -> str:
    argv = [sys.executable, "-m", "halo", "launch", job.method, job.config, "--slurm"]
    if job.venv:
        argv.append(f"--venv={job.venv}")
    if job.container:
        argv.append(f"--container={job.container}")
    argv += ["--", *_outputs(job, str(job.checkpoints), str(job.logs)), *job.overrides]
    job.folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise HaloError(f"job {job.name}: halo launch --slurm failed: {tail[0]}")
    job_id = proc.stdout.strip().splitlines()[-1]
    job.log = str(job.logs / _job_name(job) / f"slurm-{job_id}.out")
    return job_id


def _job_name(job: JobRecord) -> str:
    """The config's runtime.job_name: the folder halo launch writes its logs into."""
    from halo.train.config import load

    return load(Path(job.config), None, job.overrides).runtime.job_name


SLURM_ACTIVE = {"PENDING": "pending", "CONFIGURING": "pending", "RUNNING": RUNNING}
SLURM_ACTIVE |= {"COMPLETING": RUNNING, "SUSPENDED": RUNNING, "REQUEUED": "pending"}


def _slurm_state(job_id: str) -> State:
    try:
        proc = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        return State("unknown", None, f"Slurm job {job_id} (no scontrol on PATH)")
    if proc.returncode != 0:
        return State("unknown", None, f"Slurm job {job_id} (no longer known to slurmctld)")
    fields = dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)
    st = fields.get("JobState", "UNKNOWN")
    where = f"Slurm job {job_id} on {fields.get('NodeList', '?')}"
    if st in SLURM_ACTIVE:
        return State(SLURM_ACTIVE[st], None, where)
    rc = int(fields.get("ExitCode", "1:0").split(":")[0])
    if st == "CANCELLED":
        return State("cancelled", rc, where)
    return State("exited" if st == "COMPLETED" and rc == 0 else "failed", rc, f"{where} ({st})")


def _slurm_stop(job_id: str, grace_s: int) -> None:
    subprocess.run(["scancel", "--signal=TERM", job_id], capture_output=True, check=False)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _slurm_state(job_id).active:
            return
        time.sleep(1)
    subprocess.run(["scancel", job_id], capture_output=True, check=False)


# --- one interface ----------------------------------------------------------------------------


def start(job: JobRecord) -> str:
    new = _docker_start(job) if job.backend == "docker" else _slurm_start(job)
    job.ids.append(new)
    return new


def state(job: JobRecord) -> State:
    return _docker_state(job.current) if job.backend == "docker" else _slurm_state(job.current)


def stop(job: JobRecord) -> State:
    """SIGTERM, up to the grace period for the emergency checkpoint, then kill."""
    if state(job).active:
        (_docker_stop if job.backend == "docker" else _slurm_stop)(job.current, job.grace_s)
    deadline = time.monotonic() + 30
    while state(job).active and time.monotonic() < deadline:  # the container/job winding down
        time.sleep(0.5)
    return state(job)


def forget_previous(job: JobRecord) -> None:
    """Before a restart: the old container (kept for its exit code) goes."""
    if job.backend == "docker" and job.ids:
        _docker_forget(job.current)


def start_timer(job: JobRecord) -> int | None:
    """max_duration_hours: a detached `halo job stop` after that long (the same graceful stop)."""
    if not job.max_duration_hours:
        return None
    seconds = max(1, round(job.max_duration_hours * 3600))
    out = (job.folder / "timer.log").open("a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "halo", "job", "stop", job.name, "--after", str(seconds),
         "--only", job.current],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env=os.environ.copy(),
    )  # fmt: skip
    return proc.pid
