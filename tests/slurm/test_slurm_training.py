"""The tiny SFT example on a real two-node Slurm cluster: sbatch -> srun -> torchrun c10d -> DDP.

Each node is a network namespace with its own address and hostname (ci/slurm-cluster.sh), so
the rendezvous, the gloo all-reduce and the shared checkpoint folder cross nodes as on a cluster.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from .conftest import (
    SFT,
    Cluster,
    checkpoints,
    env,
    losses,
    meta,
    outputs,
    slurm_log,
    submit,
    wait_for_line,
    weights_digest,
)

pytestmark = pytest.mark.slurm

STEPS = 16
# Two epochs of the example (global batch 8), a checkpoint every 4 steps, all kept.
BASE = [f"--training.max_steps={STEPS}", "--checkpoint.every_steps=4", "--checkpoint.keep_last=0"]
JOB_TIMEOUT = 300


@pytest.fixture(scope="module")
def single(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process on this host, the same global batch: the curve the two nodes must match."""
    tmp = tmp_path_factory.mktemp("single")
    argv = [str(venv / "bin" / "halo"), "launch", "sft", str(SFT), "--", *outputs(tmp), *BASE]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp


@pytest.fixture(scope="module")
def two_nodes(cluster: Cluster, venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("two-nodes")
    started = time.monotonic()
    job_id = submit(venv, tmp, *BASE)
    st = cluster.wait(job_id, JOB_TIMEOUT)
    log = slurm_log(tmp, job_id)
    assert st["JobState"] == "COMPLETED" and st["ExitCode"] == "0:0", f"{st}\n{log}"
    print(f"two-node Slurm job {job_id}: {time.monotonic() - started:.0f}s end to end")
    return tmp


def test_two_nodes_match_one_process(single: Path, two_nodes: Path) -> None:
    assert len(losses(two_nodes)) == STEPS
    assert losses(two_nodes) == pytest.approx(losses(single), abs=1e-4)
    assert sum(losses(two_nodes)[-4:]) < sum(losses(two_nodes)[:4]) - 4.0


def test_one_checkpoint_per_save_by_rank_0(two_nodes: Path) -> None:
    found = checkpoints(two_nodes)
    assert [meta(c)["step"] for c in found] == [4, 8, 12, 16]
    assert all(meta(c)["world_size"] == 2 for c in found)
    # Nothing half-written or written twice (a second rank's copy, a leftover temp folder).
    assert sorted(p.name for p in (two_nodes / "ck" / "tiny-sft").iterdir()) == sorted(
        c.name for c in found
    )


def test_scancel_term_saves_exits_0_and_resubmit_resumes_bitwise(
    cluster: Cluster, venv: Path, two_nodes: Path, tmp_path: Path
) -> None:
    # The step-8 checkpoint pauses (the trainer's test hook; sbatch passes the environment on)
    # so the signal lands mid-run however fast the steps are: the emergency one is step 9's.
    job_id = submit(venv, tmp_path, *BASE, HALO_TEST_HOOK_CHECKPOINT_SLEEP="8:20")
    wait_for_line(tmp_path, job_id, "test hook: sleeping", JOB_TIMEOUT)
    # scancel --signal without --batch/--full signals every job step's tasks: srun's, where
    # halo launch relays it to torchrun's workers (the batch shell would not forward it).
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True)
    st = cluster.wait(job_id, JOB_TIMEOUT)
    log = slurm_log(tmp_path, job_id)
    assert st["JobState"] == "COMPLETED" and st["ExitCode"] == "0:0", f"{st}\n{log}"
    assert log.count("writing an emergency checkpoint") == 1, log
    last = checkpoints(tmp_path)[-1]
    assert meta(last)["reason"] == "signal" and 6 <= meta(last)["step"] < STEPS, meta(last)

    again = submit(venv, tmp_path, *BASE)
    st = cluster.wait(again, JOB_TIMEOUT)
    log = slurm_log(tmp_path, again)
    assert st["JobState"] == "COMPLETED" and st["ExitCode"] == "0:0", f"{st}\n{log}"
    assert f"(step {meta(last)['step']})" in log and "resumed from" in log, log
    assert weights_digest(checkpoints(tmp_path)[-1]) == weights_digest(checkpoints(two_nodes)[-1])
    assert losses(tmp_path)[-1] == losses(two_nodes)[-1]


def test_a_node_that_never_joins_fails_within_the_join_timeout(
    cluster: Cluster, venv: Path, tmp_path: Path
) -> None:
    # One srun task on one node, told to expect two: the second never comes.
    node = cluster.nodes[0]
    argv = ["srun", "-N1", f"-w{node}", "--time=5", str(venv / "bin" / "halo"), "launch", "sft"]
    argv += [str(SFT), "--nnodes=2", "--nproc=1", f"--rdzv-endpoint={node}:29511"]
    argv += ["--rdzv-id=lonely", "--", *outputs(tmp_path), "--runtime.rdzv.join_timeout_s=20"]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=240)
    took = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert took < 20 + 60, f"{took:.0f}s: {out}"
    low = out.lower()
    assert "rendezvous" in low and ("timed out" in low or "timeout" in low), out
    assert not checkpoints(tmp_path)
