"""A job's record: what was started, where, and how to find it again (no torch needed).

Kept at $HALO_SCRATCH/jobs/<job>/job.json, written atomically; the job's checkpoints and logs
live beside it, so one folder holds all a job wrote.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from halo.atomic import write_text
from halo.errors import HaloError
from halo.paths import scratch_root

BACKENDS = ("docker", "slurm")


def jobs_root() -> Path:
    return scratch_root() / "jobs"


@dataclass
class JobRecord:
    name: str  # the config's runtime.job_name (or --name)
    backend: str
    method: str
    config: str  # absolute path on the host
    overrides: list[str]
    grace_s: int
    max_duration_hours: float | None = None
    image: str | None = None  # docker: the image reference
    debug: bool = False
    venv: str | None = None  # slurm: DIR with halo and the stack
    container: str | None = None  # slurm: .sqsh / .sif / docker ref
    ids: list[str] = field(default_factory=list)  # container names or Slurm job ids, oldest first
    log: str = ""  # the current run's log on the host
    timer_pid: int | None = None

    @property
    def folder(self) -> Path:
        return jobs_root() / self.name

    @property
    def checkpoints(self) -> Path:
        return self.folder / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    @property
    def current(self) -> str:
        if not self.ids:
            raise HaloError(f"job {self.name}: never started")
        return self.ids[-1]

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_text(self.folder / "job.json", json.dumps(asdict(self), indent=2) + "\n")


def load(name: str) -> JobRecord:
    path = jobs_root() / name / "job.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        known = [j.name for j in all_jobs()]
        raise HaloError(
            f"job {name}: no such job under {jobs_root()} (known: {', '.join(known) or 'none'})"
        ) from None
    except ValueError as exc:
        raise HaloError(f"{path}: not a job record ({exc})") from None
    return JobRecord(**raw)


def all_jobs() -> list[JobRecord]:
    root = jobs_root()
    return [load(p.parent.name) for p in sorted(root.glob("*/job.json"))] if root.is_dir() else []
