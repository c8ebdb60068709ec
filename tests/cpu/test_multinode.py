"""Beyond one node: torchrun c10d across two agents on loopback (two "nodes"), the sbatch
script `halo launch --slurm` writes, and the bad input both refuse with one line.

The real Slurm cluster (slurmctld, two slurmd in network namespaces) is the Slurm harness's
test; here the script is checked as text and by bash's parser, and submission through a
recording `Scheduler` (the interface `halo.train.launch.slurm.Sbatch` implements).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from halo.errors import HaloError
from halo.train import config
from halo.train.launch import launcher, slurm, supervise

from .conftest import (
    EXAMPLES,
    REPO,
    halo_cmd,
    halo_env,
    metrics,
    outputs,
    run_halo,
    run_halo_without,
)

pytestmark = pytest.mark.cpu

SFT = EXAMPLES / "sft" / "config.yaml"
STEPS = 4
SHORT = [f"--training.max_steps={STEPS}", "--checkpoint.every_steps=0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def losses(tmp: Path) -> list[float]:
    return [r["loss"] for r in metrics(tmp, "tiny-sft") if "loss" in r]


def start_nodes(
    tmp: Path, *extra: str, nodes: int = 2, started: int | None = None, rdzv_id: str = "t"
) -> list[subprocess.Popen[str]]:
    """``started`` (default all) of ``nodes`` torchrun agents on this host, one process each,
    meeting through c10d on 127.0.0.1 (each its own `halo launch`, as on separate machines)."""
    port = free_port()
    procs = []
    for n in range(nodes if started is None else started):
        log = (tmp / f"node{n}.log").open("w")
        cmd = halo_cmd(
            "launch", "sft", str(SFT), "--nnodes", str(nodes), "--nproc-per-node", "1",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id,
            "--", *outputs(tmp), "--runtime.parallel_mode=ddp", "--runtime.socket_ifname=lo",
            *extra,
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd, env=halo_env(), stdout=log, stderr=subprocess.STDOUT, text=True, cwd=REPO
            )
        )
    return procs


def wait_all(procs: list[subprocess.Popen[str]], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.monotonic(), 1)))
        except subprocess.TimeoutExpired as exc:
            for q in procs:
                q.kill()
            raise AssertionError(
                f"the nodes did not finish within {timeout:.0f}s (a hang)"
            ) from exc
    return codes


def node_logs(tmp: Path) -> str:
    return "".join(p.read_text() for p in sorted(tmp.glob("node*.log")))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    tmp = tmp_path_factory.mktemp("one")
    r = run_halo("launch", "sft", str(SFT), "--nproc", "1", "--", *outputs(tmp), *SHORT)
    assert r.returncode == 0, r.stdout + r.stderr
    return losses(tmp)


def test_two_nodes_match_one_process_and_save_once(
    one_process: list[float], tmp_path: Path
) -> None:
    # Same global batch (8): each rank gets 4 distinct examples, DDP averages the gradients.
    # A rank whose gradient is left out of the all-reduce, or two ranks given the same
    # examples, change the curve from step 1 or 2 on.
    procs = start_nodes(tmp_path, *SHORT)
    assert wait_all(procs, 400) == [0, 0], node_logs(tmp_path)
    out = node_logs(tmp_path)
    assert "world 2 (ddp)" in out
    assert len(one_process) == STEPS
    assert losses(tmp_path) == pytest.approx(one_process, abs=1e-5)
    # Written once, by rank 0, into the shared folder.
    assert out.count("checkpoint: writing") == 1
    assert [p.name for p in (tmp_path / "ck" / "tiny-sft").iterdir()] == ["r1_epoch_0_step_4"]


def _worker_of(rank: int, rdzv_id: str) -> int | None:
    """The pid of the trainer process with this global rank in the rendezvous ``rdzv_id``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"halo.train.run" in cmd
            and f"RANK={rank}".encode() in env
            and (f"TORCHELASTIC_RUN_ID={rdzv_id}".encode() in env)
        ):
            return int(proc.name)
    return None


def test_a_rank_that_dies_takes_the_job_down_with_a_line_naming_it(tmp_path: Path) -> None:
    rdzv = f"die-{os.getpid()}"
    procs = start_nodes(tmp_path, "--training.max_steps=1000", "--epochs=200", rdzv_id=rdzv)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "logs" / "tiny-sft" / "metrics.jsonl").is_file():
            assert time.monotonic() < deadline, node_logs(tmp_path)
            assert all(p.poll() is None for p in procs), node_logs(tmp_path)
            time.sleep(0.5)
        pid = _worker_of(1, rdzv)
        assert pid is not None, "rank 1's trainer process not found"
        os.kill(pid, signal.SIGKILL)
        codes = wait_all(procs, 180)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out = node_logs(tmp_path)
    assert all(c != 0 for c in codes), out
    line = [ln for ln in out.splitlines() if ln.startswith("halo launch: rank 1 ")]
    assert line and "failed with exit code -9" in line[0], out


def _tree(pid: int) -> list[int]:
    out = [pid]
    for child in supervise.children(pid):
        out += _tree(child)
    return out


def test_sigterm_to_every_process_of_both_nodes_saves_once_and_exits_0(tmp_path: Path) -> None:
    # What Slurm's `--signal=TERM@grace` does: SIGTERM to every process of the step on each
    # node (halo launch, torchrun, the trainer), not only to the top one.
    procs = start_nodes(
        tmp_path, "--training.max_steps=1000", "--epochs=200", "--checkpoint.every_steps=0",
        rdzv_id="term",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        rows = tmp_path / "logs" / "tiny-sft" / "metrics.jsonl"
        while not (rows.is_file() and rows.read_text().count("\n") >= 2):
            assert time.monotonic() < deadline, node_logs(tmp_path)
            assert all(p.poll() is None for p in procs), node_logs(tmp_path)
            time.sleep(0.5)
        for pid in [q for p in procs for q in _tree(p.pid)]:
            os.kill(pid, signal.SIGTERM)
        codes = wait_all(procs, 180)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out = node_logs(tmp_path)
    assert codes == [0, 0], out
    assert out.count("writing an emergency checkpoint") == 1, out
    (saved,) = (tmp_path / "ck" / "tiny-sft").iterdir()
    meta = json.loads((saved / "meta.json").read_text())
    assert meta["reason"] == "signal" and meta["world_size"] == 2, meta
    # Resubmitted: rank 0 picks that checkpoint and every rank of both nodes loads it.
    for log in tmp_path.glob("node*.log"):
        log.unlink()
    step = meta["step"]
    again = start_nodes(tmp_path, f"--training.max_steps={step + 1}", rdzv_id="term2")
    assert wait_all(again, 300) == [0, 0], node_logs(tmp_path)
    out = node_logs(tmp_path)
    assert f"resumed from {saved} (step {step})" in out, out
    assert f"step {step + 1}/{step + 1}" in out, out


def test_a_node_that_never_joins_is_an_error_within_the_join_timeout(tmp_path: Path) -> None:
    # One agent of two: the other never comes.
    (proc,) = start_nodes(tmp_path, "--runtime.rdzv.join_timeout_s=5", started=1)
    codes = wait_all([proc], 120)
    out = node_logs(tmp_path)
    assert codes == [1], out
    assert out.splitlines()[-1].startswith("halo launch: the rendezvous timed out"), out


# --- the batch rule and the launch command ---------------------------------------------------


def _cfg(*overrides: str) -> config.Config:
    return config.load(SFT, "sft", list(overrides))


def test_gradient_accumulation_is_derived_from_the_fixed_global_batch() -> None:
    cfg = _cfg("--training.global_batch_size=96", "--training.micro_batch_size=4")
    assert launcher.check_batch(cfg, 8) == 3  # 96 / (4 x 8)
    cfg = _cfg("--training.global_batch_size=96", "--training.micro_batch_size=4", "--nnodes=3")
    assert launcher.check_batch(cfg, 8) == 1
    with pytest.raises(HaloError, match="does not divide over 5 node"):
        launcher.check_batch(_cfg("--training.global_batch_size=96", "--nnodes=5"), 8)
    with pytest.raises(HaloError, match="micro_batch_size: 5 does not divide"):
        launcher.check_batch(
            _cfg("--training.global_batch_size=96", "--training.micro_batch_size=5"), 2
        )


def test_torchrun_flags_for_one_and_many_nodes() -> None:
    assert launcher.torchrun_args(_cfg(), 2) == [
        "--standalone", "--local-addr=127.0.0.1", "--nproc-per-node=2",
    ]  # fmt: skip
    many = _cfg("--nnodes=4", '--runtime.rdzv.endpoint="n1:29500"', "--runtime.node_rank=2")
    assert launcher.torchrun_args(many, 8) == [
        "--nnodes=4",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=n1:29500",
        "--rdzv-id=tiny-sft",
        "--rdzv-conf=join_timeout=600,last_call_timeout=30",
        "--max-restarts=0",
        "--node-rank=2",
    ]
    local = _cfg("--nnodes=2", '--runtime.rdzv.endpoint="127.0.0.1:29500"')
    assert launcher.torchrun_args(local, 1)[-1] == "--local-addr=127.0.0.1"
    with pytest.raises(HaloError, match=r"rdzv\.endpoint: 4 nodes need a rendezvous endpoint"):
        launcher.torchrun_args(_cfg("--nnodes=4"), 8)


# What the model's class imports: a refusal of the launch's own input must not need them.
NO_MODEL_CLASS = ["torch", "transformers"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--nnodes", "0"], "--nnodes: expected a positive number, got 0"),
        (["--nnodes", "3"], "training.global_batch_size: 8 does not divide over 3 node(s)"),
        (["--slurm", "--nodes", "0"], "--nnodes: expected a positive number, got 0"),
        (["--slurm", "--nodes", "3"], "does not divide over 3 node(s) x 1 process(es)"),
        (["--slurm", "--container", "/no/such.sqsh"], "--container: /no/such.sqsh: no such"),
        (["--slurm", "--container", "missing.sif"], "--container: missing.sif: no such image"),
        (["--slurm", "--venv", "/no/venv"], "--venv: /no/venv/bin/halo not found"),
        (["--slurm", "--container", "x.sif", "--venv", "/v"], "choose one"),
    ],
)
def test_bad_launch_input_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    # The launch's own inputs are refused before the model's class is looked up, which
    # imports transformers and torch (seconds of CPU for a wrong flag): here either is an error.
    r = run_halo_without(
        NO_MODEL_CLASS, "launch", "sft", str(SFT), *args, "--dry-run", "--", *outputs(tmp_path),
        forbid=True,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and expected in r.stderr, r.stderr
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


def test_slurm_without_sbatch_submits_nothing(tmp_path: Path) -> None:
    r = run_halo_without(
        NO_MODEL_CLASS, "launch", "sft", str(SFT), "--slurm", "--nodes", "2", "--", *outputs(tmp_path),
        forbid=True, PATH=str(tmp_path / "empty"),
    )  # fmt: skip
    assert r.returncode == 2
    assert "halo: error: --slurm: sbatch is not on PATH" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_requested_efa_that_does_not_load_is_an_error_not_sockets(tmp_path: Path) -> None:
    r = run_halo_without(
        NO_MODEL_CLASS, "launch", "sft", str(SFT), "--nproc", "2", "--", *outputs(tmp_path),
        "--runtime.fabric=efa", forbid=True,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "runtime.fabric: efa needs the aws-ofi-nccl plugin" in r.stderr
    assert not (tmp_path / "ck").exists()


# --- the sbatch script -----------------------------------------------------------------------


class Recording:
    """A cluster that knows two partitions and records what it is given to run."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def available(self) -> str | None:
        return None

    def partitions(self) -> list[str]:
        return ["cpu", "gpu"]

    def submit(self, script: str) -> str:
        self.submitted.append(script)
        return "4242"


def _job(tmp: Path, *flags: str) -> slurm.SlurmJob:
    cfg = _cfg(*outputs(tmp), *flags)
    return slurm.job_from_config("sft", SFT, cfg, None, ["--lr=1e-4"])


def _bash_parses(script: str) -> None:
    r = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_sbatch_script_runs_torchrun_per_node_and_signals_the_step(tmp_path: Path) -> None:
    job = _job(
        tmp_path, "--nnodes=2", '--runtime.slurm.partition="gpu"', '--runtime.slurm.time="01:00:00"',
        "--runtime.slurm.gpus_per_node=4", "--runtime.slurm.grace_s=120",
        "--runtime.slurm.requeue=true", "--training.global_batch_size=16",
    )  # fmt: skip
    script = slurm.render(job)
    _bash_parses(script)
    lines = script.splitlines()
    for want in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=01:00:00",
        "#SBATCH --signal=TERM@120",
        "#SBATCH --requeue",
        'HALO_RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    ):
        assert want in lines, script
    assert "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 \\" in lines
    node = lines[-1].strip()
    assert node.endswith(
        f'launch sft {SFT} --nnodes "$SLURM_NNODES" --nproc-per-node 4 '
        '--rdzv-endpoint "$HALO_RDZV_HOST:29500" --rdzv-id "slurm-$SLURM_JOB_ID" -- --lr=1e-4'
    ), node
    assert slurm.render(job) == script  # a pure function of the job


def test_sbatch_script_for_pyxis_apptainer_and_a_venv(tmp_path: Path) -> None:
    sqsh, sif = tmp_path / "halo.sqsh", tmp_path / "halo.sif"
    sqsh.write_bytes(b"")
    sif.write_bytes(b"")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "halo").write_text("#!/bin/sh\n")
    pyxis = slurm.render(_job(tmp_path, f"--runtime.slurm.container={sqsh}"))
    assert f"--container-image={sqsh} --container-mounts=" in pyxis
    assert f"--container-workdir={Path.cwd()}" in pyxis
    assert "\n  halo launch sft" in pyxis
    app = slurm.render(_job(tmp_path, f"--runtime.slurm.container={sif}"))
    assert "--kill-on-bad-exit=1 apptainer exec --bind=" in app and f" {sif} \\" in app
    assert "--nv" not in app  # no GPUs asked for
    gpu = slurm.render(_job(tmp_path, f"--container={sif}", "--runtime.slurm.gpus_per_node=1"))
    assert "apptainer exec --nv --bind=" in gpu
    v = slurm.render(_job(tmp_path, f"--runtime.slurm.venv={venv}"))
    assert f"\n  {venv}/bin/halo launch sft" in v
    for script in (pyxis, app, gpu, v):
        _bash_parses(script)
    docker = _job(tmp_path, '--container="nvcr.io#nvidia/pytorch:25.01-py3"')
    slurm.check(docker, Recording())  # a registry reference: pulled by pyxis on the node


def test_submission_checks_the_partition_and_prints_the_job_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = Recording()
    with pytest.raises(
        HaloError, match=r"--partition: big is not a partition of this cluster \(cpu, gpu\)"
    ):
        slurm.launch(_job(tmp_path, '--runtime.slurm.partition="big"'), False, cluster)
    assert cluster.submitted == []
    job = _job(tmp_path, '--runtime.slurm.partition="cpu"')
    assert slurm.launch(job, False, cluster) == 0
    assert capsys.readouterr().out == "4242\n"
    assert cluster.submitted == [slurm.render(job)]
    assert (tmp_path / "logs" / "tiny-sft").is_dir()  # where Slurm writes the job's output


def test_failed_rank_line_from_torchrun_summary() -> None:
    summary = """[E1202 torch/distributed/elastic/multiprocessing/api.py] failed
============================================================
halo.train.run FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_01:00:00
  host      : n2
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 77)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 77
============================================================
"""
    assert supervise.failed_rank(summary.splitlines(keepends=True)) == (
        "halo launch: rank 3 (local rank 1) on n2 failed with exit code -9: "
        "Signal 9 (SIGKILL) received by PID 77; the job is stopped"
    )
    assert supervise.failed_rank(["nothing\n"]) is None


def test_slurm_dry_run_and_the_batch_rule_need_no_torch(tmp_path: Path) -> None:
    # A login node: halo and its base dependencies, no training stack.
    r = run_halo_without(
        ["torch"], "launch", "sft", str(SFT), "--slurm", "--nodes", "2", "--dry-run", "--",
        f"--runtime.paths.checkpoints={tmp_path}/ck", f"--runtime.paths.logs={tmp_path}/logs",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("#!/bin/bash\n") and "srun --nodes=2" in r.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "sft", "--dry-run"],
        ["launch", "sft", "--nnodes", "2", "--rdzv-endpoint", "n1:29500", "--dry-run"],
        ["preflight"],
    ],
    ids=["dry-run", "multinode-dry-run", "preflight"],
)
def test_a_login_node_needs_no_torch(argv: list[str], tmp_path: Path) -> None:
    # torch made unimportable, as on a login node with halo and the tokenizer libraries only.
    # A copy of the example: its outputs (relative to the YAML) land in tmp, and preflight's
    # writability checks pass where the checkout is read-only (the tier's /workspace).
    import shutil

    for name in ("sft", "tokenizer"):
        shutil.copytree(EXAMPLES / name, tmp_path / "examples" / name)
    config = str(tmp_path / "examples" / "sft" / "config.yaml")
    r = run_halo_without(["torch"], argv[0], *argv[1:2], config, *argv[2:])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "torch" not in r.stderr, r.stderr
