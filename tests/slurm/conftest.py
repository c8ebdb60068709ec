"""The Slurm end-to-end tests: a real cluster (ci/slurm-cluster.sh) and a venv with the stack.

The cluster is found through SLURM_CONF (what `ci/slurm-cluster.sh start` prints); the venv
through HALO_SLURM_VENV (`halo stack install cpu DIR`, as `nox -s test-slurm` makes it). Without
either the tests are skipped with the reason; with CI=true they fail instead, so a CI run that
lost its cluster cannot pass by skipping.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SFT = REPO / "examples" / "sft" / "config.yaml"
JOB = "tiny-sft"
VENV_ENV = "HALO_SLURM_VENV"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class Cluster:
    nodes: list[str]

    def state(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (no accounting database on this cluster)."""
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True
        ).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.state(job_id)
            if st.get("JobState") not in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING"}:
                return st
            time.sleep(1)
        subprocess.run(["scancel", job_id], check=False)
        raise AssertionError(
            f"job {job_id} still {self.state(job_id).get('JobState')} after {timeout}s"
        )


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    if not shutil.which("sinfo"):
        _unavailable("no Slurm client (sinfo) on PATH: start one with ci/slurm-cluster.sh")
    if not os.environ.get("SLURM_CONF"):
        _unavailable('SLURM_CONF is not set: eval "$(ci/slurm-cluster.sh start)" first')
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30
    )
    up = [
        ln.split()[0] for ln in proc.stdout.splitlines() if ln.split()[1:2] in (["idle"], ["mix"])
    ]
    if proc.returncode != 0 or len(up) < 2:
        _unavailable(f"no two idle Slurm nodes ({proc.stdout.strip() or proc.stderr.strip()})")
    return Cluster(sorted(up))


@pytest.fixture(scope="session")
def venv() -> Path:
    where = os.environ.get(VENV_ENV)
    if not where or not (Path(where) / "bin" / "halo").exists():
        _unavailable(f"{VENV_ENV} names no venv with halo and torch (halo stack install cpu DIR)")
    return Path(where)


def env(**extra: str) -> dict[str, str]:
    """The checkout's halo on every node (the filesystem is shared), one thread per rank."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO)
    e["OMP_NUM_THREADS"] = "1"
    e.update(extra)
    return e


def outputs(tmp: Path) -> list[str]:
    return [f"--runtime.paths.checkpoints={tmp / 'ck'}", f"--runtime.paths.logs={tmp / 'logs'}"]


def submit(venv: Path, tmp: Path, *overrides: str, nodes: int = 2, **extra_env: str) -> str:
    """`halo launch sft --slurm` from the venv: renders the sbatch script, submits, prints the id."""
    argv = [str(venv / "bin" / "halo"), "launch", "sft", str(SFT), "--slurm", f"--nodes={nodes}"]
    argv += ["--nproc=1", f"--venv={venv}", "--", *outputs(tmp), *overrides]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env(**extra_env), timeout=120, cwd=tmp
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+", job_id), proc.stdout
    return job_id


def slurm_log(tmp: Path, job_id: str) -> str:
    found = sorted((tmp / "logs").rglob(f"slurm-{job_id}.out"))
    return found[0].read_text(errors="replace") if found else ""


def wait_for_line(tmp: Path, job_id: str, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in slurm_log(tmp, job_id):
            return
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], check=False)
    raise AssertionError(
        f"{needle!r} not in job {job_id}'s log after {timeout}s:\n{slurm_log(tmp, job_id)}"
    )


def metrics(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "logs" / JOB / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def losses(tmp: Path) -> list[float]:
    return [r["loss"] for r in metrics(tmp) if "loss" in r]


def checkpoints(tmp: Path) -> list[Path]:
    root = tmp / "ck" / JOB
    found = [p for p in root.iterdir() if (p / "meta.json").exists()] if root.exists() else []
    return sorted(found, key=lambda p: meta(p)["step"])


def meta(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / "meta.json").read_text())


def weights_digest(ckpt: Path) -> str:
    return hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
