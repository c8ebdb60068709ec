"""`halo launch --slurm`: a run as an sbatch script, and its submission.

`render` is a pure function (a `SlurmJob` in, the script's text out); `check` validates a job
against a `Scheduler` (what the cluster says: partitions) and the files it names; `Sbatch` is
the one place that runs Slurm's commands. No torch is imported here: a login node renders and
submits with halo and its base dependencies only.

The script runs one srun task per node; each task is `halo launch ... --nnodes $SLURM_NNODES
--rdzv-endpoint FIRST_NODE:PORT --rdzv-id slurm-$SLURM_JOB_ID`, so torchrun's c10d
rendezvous on the first node of the allocation assigns the node ranks.

Signals: `#SBATCH --signal=TERM@GRACE` (no `B:`) makes Slurm send SIGTERM, GRACE seconds
before the time limit, to every process of every job step (slurmstepd signals the step's
whole process tree): `halo launch`, torchrun and the trainer ranks. torchrun runs with
SIGTERM blocked (halo.train.launch.supervise), so it does not start its 30-second kill of the
workers; the ranks finish their batch, write one emergency checkpoint and exit 0, and the
step with them. `B:` would signal only the batch shell, which does not forward it to srun's
tasks.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from halo.errors import HaloError

if TYPE_CHECKING:
    from halo.train.config import Config

Runner = Literal["pyxis", "apptainer", "venv", "host"]
RDZV_PORT = 29500
# A container given by file: an Enroot squashfs (pyxis) or an Apptainer SIF.
_SQUASHFS = (".sqsh", ".sqfs", ".squashfs")
_SIF = (".sif",)
# A docker reference as pyxis takes it: [REGISTRY#]NAME[:TAG][@DIGEST].
_DOCKER_REF = re.compile(
    r"^([A-Za-z0-9.-]+(:[0-9]+)?#)?[a-z0-9][a-z0-9._/-]*(:[\w.-]+)?(@sha256:[0-9a-f]{64})?$"
)


@dataclass(frozen=True)
class SlurmJob:
    """Everything the script says; paths absolute, as the compute nodes see them."""

    job_name: str
    nodes: int
    nproc_per_node: int
    # halo's arguments on each node, e.g. ["launch", "sft", "/abs/config.yaml", "--", ...]:
    # the script inserts the rendezvous flags before the `--`.
    launch_args: list[str]
    workdir: Path
    log_dir: Path
    # Folders created before the step starts (checkpoints, logs) and mounted into a container.
    mkdirs: list[Path] = field(default_factory=list)
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    runner: Runner = "host"
    container: str | None = None
    container_mounts: list[str] = field(default_factory=list)
    venv: Path | None = None
    # How halo runs on a node without container or venv (this interpreter: a shared install).
    host_halo: list[str] = field(default_factory=lambda: ["halo"])
    grace_s: int = 300
    requeue: bool = False
    rdzv_port: int = RDZV_PORT
    # Secret override values by the variable the script reads them from (hide_overrides):
    # sbatch passes them in the job's environment, never in the script.
    secrets: dict[str, str] = field(default_factory=dict, repr=False)


SECRET_VAR = "HALO_SECRET_{}"
_SECRET_REF = re.compile(r"^(--[^=\s]+=)\$\{(HALO_SECRET_[0-9]+)\}$")


def hide_overrides(overrides: list[str]) -> tuple[list[str], dict[str, str]]:
    """Overrides as the script may show them: a value that holds a secret (a key naming a
    secret, a URL's credentials: halo.urls) becomes ``${HALO_SECRET_N}``; the values by name."""
    from halo.urls import hide_override

    shown, values = [], {}
    for arg in overrides:
        if hide_override(arg) == arg:
            shown.append(arg)
            continue
        name = SECRET_VAR.format(len(values) + 1)
        key, _, values[name] = arg.partition("=")
        shown.append(f"{key}=${{{name}}}")
    return shown, values


def runner_for(container: str | None, venv: Path | None) -> Runner:
    if container and venv:
        raise HaloError("--container and --venv: choose one (the image or the venv holds halo)")
    if venv:
        return "venv"
    if container:
        return "apptainer" if container.endswith(_SIF) else "pyxis"
    return "host"


def _halo(job: SlurmJob) -> list[str]:
    if job.runner == "venv":
        assert job.venv is not None
        return [str(job.venv / "bin" / "halo")]
    if job.runner in ("pyxis", "apptainer"):
        return ["halo"]  # on the image's PATH
    return list(job.host_halo)


def _mounts(job: SlurmJob) -> list[str]:
    """Container mounts: the given ones, else the workdir and the run's folders, same path."""
    if job.container_mounts:
        return list(job.container_mounts)
    dirs = sorted({str(p) for p in (job.workdir, *job.mkdirs)})
    return [f"{d}:{d}" for d in dirs]


def _node_command(job: SlurmJob) -> str:
    """One node's `halo launch`, as shell words (the rendezvous flags expand per job)."""
    args = list(job.launch_args)
    cut = args.index("--") if "--" in args else len(args)
    head, tail = args[:cut], args[cut:]
    rdzv = [
        "--nnodes",
        '"$SLURM_NNODES"',
        "--nproc-per-node",
        str(job.nproc_per_node),
        "--rdzv-endpoint",
        f'"$HALO_RDZV_HOST:{job.rdzv_port}"',
        "--rdzv-id",
        '"slurm-$SLURM_JOB_ID"',
    ]
    return " ".join([*map(_word, _halo(job)), *map(_word, head), *rdzv, *map(_word, tail)])


def _word(word: str) -> str:
    """One shell word; a secret's reference expands from the job's environment."""
    if m := _SECRET_REF.match(word):
        return f'{shlex.quote(m.group(1))}"${{{m.group(2)}}}"'
    return shlex.quote(word)


def render(job: SlurmJob) -> str:
    """The sbatch script for ``job``: data in, text out (nothing is run or checked here)."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job.job_name}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if job.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    for key, value in (
        ("partition", job.partition),
        ("account", job.account),
        ("time", job.time),
        ("cpus-per-task", job.cpus_per_task),
    ):
        if value is not None:
            lines.append(f"#SBATCH --{key}={value}")
    lines += [
        # SIGTERM to every process of the step, grace_s before the limit: the ranks write
        # their emergency checkpoint (see halo/train/launch/slurm.py for why not B:).
        f"#SBATCH --signal=TERM@{job.grace_s}",
        "#SBATCH --requeue" if job.requeue else "#SBATCH --no-requeue",
        f"#SBATCH --output={job.log_dir}/slurm-%j.out",
        "#SBATCH --open-mode=append",
        f"#SBATCH --chdir={job.workdir}",
        "set -euo pipefail",
        "# torchrun's c10d store runs on the first node of the allocation.",
        'HALO_RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export HALO_RDZV_HOST",
    ]
    if job.mkdirs:
        lines.append("mkdir -p " + " ".join(q(str(p)) for p in job.mkdirs))
    srun = [
        "srun",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        # One task that fails ends the others: a dead node never leaves the job hanging.
        "--kill-on-bad-exit=1",
    ]
    if job.runner == "pyxis":
        assert job.container is not None
        srun += [
            f"--container-image={q(job.container)}",
            f"--container-mounts={q(','.join(_mounts(job)))}",
            f"--container-workdir={q(str(job.workdir))}",
        ]
    elif job.runner == "apptainer":
        assert job.container is not None
        srun += ["apptainer", "exec"]
        if job.gpus_per_node:
            srun.append("--nv")
        srun += [f"--bind={q(','.join(_mounts(job)))}", q(job.container)]
    lines.append(" ".join(srun) + " \\\n  " + _node_command(job))
    return "\n".join(lines) + "\n"


class Scheduler(Protocol):
    """What `check` and submission need from a cluster."""

    def available(self) -> str | None:
        """None when jobs can be submitted here, else why not."""

    def partitions(self) -> list[str]: ...

    def submit(self, script: str) -> str:
        """Submit ``script``; the job id."""


class Sbatch:
    """Slurm's own commands on PATH (sbatch, sinfo)."""

    def available(self) -> str | None:
        if shutil.which("sbatch") is None:
            return "sbatch is not on PATH (run on a Slurm login node, or use --dry-run)"
        return None

    def partitions(self) -> list[str]:
        r = subprocess.run(
            ["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=60, check=False
        )
        if r.returncode != 0:
            raise HaloError(f"sinfo -h -o %P failed: {(r.stderr or r.stdout).strip()}")
        # The default partition carries a '*'.
        return sorted({p.strip().rstrip("*") for p in r.stdout.split() if p.strip()})

    def submit(self, script: str, env: dict[str, str] | None = None) -> str:
        # sbatch exports its environment to the job (--export=ALL): the secrets travel there.
        r = subprocess.run(
            ["sbatch", "--parsable"],
            input=script,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, **(env or {})},
        )
        if r.returncode != 0:
            raise HaloError(f"sbatch: {(r.stderr or r.stdout).strip()}")
        return r.stdout.strip().split(";")[0]  # "ID" or "ID;CLUSTER"


def check_container(container: str) -> None:
    """A container given by file must exist; a docker reference must be well formed (pyxis
    pulls it on the compute node, where the registry is reachable)."""
    looks_like_file = container.startswith(("/", "./", "../", "~")) or container.endswith(
        _SQUASHFS + _SIF
    )
    if looks_like_file:
        path = Path(container).expanduser()
        if not path.is_file():
            raise HaloError(f"--container: {container}: no such image file")
        return
    if not _DOCKER_REF.match(container.removeprefix("docker://")):
        raise HaloError(
            f"--container: {container}: neither an image file (.sqsh, .sif) nor a docker "
            "reference ([REGISTRY#]NAME[:TAG])"
        )


def check(job: SlurmJob, scheduler: Scheduler | None) -> None:
    """Bad input as one line, before anything is submitted. ``scheduler``: None for a dry
    run where Slurm is absent (the cluster's own checks are then skipped)."""
    if job.nodes < 1:
        raise HaloError(f"--nodes: expected a positive number, got {job.nodes}")
    if job.runner in ("pyxis", "apptainer"):
        assert job.container is not None
        check_container(job.container)
    if job.runner == "venv":
        assert job.venv is not None
        if not (job.venv / "bin" / "halo").is_file():
            raise HaloError(f"--venv: {job.venv}/bin/halo not found (halo stack install SET DIR)")
    if scheduler is None:
        return
    if job.partition is not None:
        known = scheduler.partitions()
        if job.partition not in known:
            raise HaloError(
                f"--partition: {job.partition} is not a partition of this cluster "
                f"({', '.join(known) or 'none'})"
            )


def job_from_config(
    method: str, config_path: Path, cfg: Config, nproc: int | None, overrides: list[str]
) -> SlurmJob:
    """The job a config (with the launch flags applied as overrides) describes."""
    import sys

    from halo.train.launch import launcher

    rt, sl = cfg.runtime, cfg.runtime.slurm
    per_node = nproc if nproc is not None else rt.nproc_per_node or max(sl.gpus_per_node, 1)
    if per_node < 1:
        raise HaloError(f"--nproc-per-node: expected a positive number, got {per_node}")
    launcher.check_batch(cfg, per_node)
    venv = Path(sl.venv) if sl.venv is not None else None
    shown, secrets = hide_overrides(overrides)
    return SlurmJob(
        job_name=rt.job_name,
        nodes=rt.nnodes,
        nproc_per_node=per_node,
        launch_args=["launch", method, str(config_path), "--", *shown],
        workdir=Path.cwd(),
        log_dir=cfg.log_dir,
        mkdirs=[cfg.job_dir, cfg.log_dir],
        gpus_per_node=sl.gpus_per_node,
        partition=sl.partition,
        account=sl.account,
        time=sl.time,
        cpus_per_task=sl.cpus_per_task,
        runner=runner_for(sl.container, venv),
        container=sl.container,
        container_mounts=list(sl.container_mounts),
        venv=venv,
        host_halo=[sys.executable, "-m", "halo"],
        grace_s=sl.grace_s,
        requeue=sl.requeue,
        secrets=secrets,
    )


def refuse(job: SlurmJob, dry_run: bool, scheduler: Scheduler) -> None:
    """The job's own refusals, each one line: Slurm's commands where it is submitted, then
    `check`."""
    missing = scheduler.available()
    if missing is not None and not dry_run:
        raise HaloError(f"--slurm: {missing}")
    check(job, None if missing else scheduler)


def launch(job: SlurmJob, dry_run: bool, scheduler: Scheduler) -> int:
    """Check ``job``; print its script (dry run) or submit it and print the job id."""
    refuse(job, dry_run, scheduler)
    return submit(job, dry_run, scheduler)


def submit(job: SlurmJob, dry_run: bool, scheduler: Scheduler) -> int:
    """Print the script of a checked ``job`` (dry run) or submit it and print the job id."""
    import sys

    script = render(job)
    if dry_run:
        print(script, end="")
        return 0
    # Slurm opens the job's output file on the first node: its folder must exist already.
    job.log_dir.mkdir(parents=True, exist_ok=True)
    # (Only a job with secrets passes an environment: a Scheduler may take the script alone.)
    job_id = scheduler.submit(script, job.secrets) if job.secrets else scheduler.submit(script)  # type: ignore[call-arg]
    print(f"halo launch: submitted {job.job_name} as job {job_id}", file=sys.stderr, flush=True)
    print(job_id)
    return 0
