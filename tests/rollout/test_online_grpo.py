"""Online GRPO against the live server: every push is served exactly and changes what the
server answers, the held-out reward is measured as the run goes, a server that goes away is
retried once and then stops the run with its checkpoints intact, a reward that raises is one
line.

The trainer runs as `halo launch` runs it (python -m halo.train.run), on the arithmetic example,
from the model the server was started on (the SFT example, exported by the trainer).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from proxy import Relay
from rollout_client import Server

from halo.rollout.client import Client
from halo.rollout.weights import reload

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "online-grpo" / "config.yaml"
STEPS = 8


@dataclass(frozen=True)
class Run:
    rc: int
    out: str
    rows: list[dict]
    job_dir: Path


def scratch_dirs(name: str) -> tuple[Path, Path]:
    """(this process's folder, the same folder as the server sees it)."""
    root = Path(os.environ.get("HALO_SCRATCH") or "/tmp") / "online-grpo-test" / name
    server_root = Path(
        os.environ.get("HALO_SERVER_SCRATCH") or os.environ.get("HALO_SCRATCH") or "/tmp"
    )
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    return root, server_root / "online-grpo-test" / name


def launch(name: str, model: Path, url: str, *extra: str, timeout: float = 900, watch=None) -> Run:
    root, on_server = scratch_dirs(name)
    argv = [
        os.environ.get("HALO_TRAINER_PYTHON", sys.executable),
        "-m",
        "halo.train.run",
        "--method",
        "online-grpo",
        "--config",
        str(CONFIG),
        f"--model.name_or_path={model}",
        f"--runtime.paths.checkpoints={root}/checkpoints",
        f"--runtime.paths.logs={root}/logs",
        f"--runtime.rollout_url={url}",
        f"--rollout.export_dir={root}/served",
        f"--rollout.export_dir_on_server={on_server}/served",
        f"--training.max_steps={STEPS}",
        *extra,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    metrics = root / "logs" / "tiny-online-grpo" / "metrics.jsonl"
    if watch is not None:
        watch(proc, metrics)
    out, _ = proc.communicate(timeout=timeout)
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    return Run(proc.returncode, out, rows, root / "checkpoints" / "tiny-online-grpo")


def restore(server: Server, served_folder: Path) -> None:
    """Serve the folder the server was started on again, unpaused: later tests expect it."""
    client = Client(server.url, server.get_json("/v1/models")["data"][0]["id"])
    client.call("POST", "/resume")  # a push cut between pause and resume leaves it paused
    reload(client, os.environ.get("HALO_SERVED_FOLDER_ON_SERVER", str(served_folder)))


@pytest.fixture(scope="module")
def learning(vllm_server: Server, served_folder: Path) -> Run:
    try:
        run = launch("learn", served_folder, vllm_server.url)
    finally:
        restore(vllm_server, served_folder)
    assert run.rc == 0, run.out[-3000:]
    return run


@pytest.mark.rollout_vllm
def test_every_push_is_served_and_changes_the_answers(learning: Run) -> None:
    curve = [(r["step"], round(r["eval_reward"], 4)) for r in learning.rows if "eval_reward" in r]
    print("held-out mean reward by step:", curve)
    assert [c[0] for c in curve] == list(range(0, STEPS + 1, 4)), curve
    steps = [r for r in learning.rows if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        # The server scores the probe as the policy does (checked before the next rollout)...
        assert r["probe_gap"] <= 1e-3, r
        # ...and, after an update that moved the policy, differently from before the push (a
        # batch whose every group has equal rewards has no advantage: nothing moves).
        if r["groups_with_signal"] > 0:
            assert r["served_shift"] > 1e-4, r
    assert sum(r["groups_with_signal"] > 0 for r in steps) >= STEPS // 2, steps


@pytest.mark.rollout_vllm
def test_a_server_that_goes_away_is_retried_once_then_stops_the_run_with_checkpoints_intact(
    vllm_server: Server, served_folder: Path
) -> None:
    from halo.train import checkpoint

    relay = Relay(int(vllm_server.url.rsplit(":", 1)[1]))
    relay.start()
    events = []

    def watch(proc: subprocess.Popen, metrics: Path) -> None:
        def steps_done() -> int:
            if not metrics.is_file():
                return 0
            return sum(1 for x in metrics.read_text().splitlines() if '"loss"' in x)

        def wait_for(n: int) -> None:
            deadline = time.monotonic() + 600
            while steps_done() < n and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)

        wait_for(2)  # killed after step 2 (checkpointed at 2): the first failure...
        relay.stop()
        events.append("down")
        time.sleep(2)  # ...inside the 4 s backoff: back before the retry
        relay.start()
        events.append("up")
        wait_for(3)
        relay.stop()  # killed for good: the retry fails too
        events.append("down for good")

    try:
        run = launch(
            "kill",
            served_folder,
            relay.url,
            "--rollout.backoff_s=4",
            "--rollout.attempts=2",
            "--checkpoint.every_steps=2",
            "--rollout.eval_every_steps=0",
            watch=watch,
        )
    finally:
        relay.stop()
        restore(vllm_server, served_folder)
    assert events == ["down", "up", "down for good"]
    assert run.rc == 1, run.out[-3000:]
    lines = run.out.splitlines()
    retried = [x for x in lines if "retrying in" in x]
    assert retried and all("server unreachable" in x for x in retried), lines[-30:]
    assert lines[-1].startswith("halo: error: ") and "giving up" in lines[-1], lines[-5:]
    # Nothing lost: every checkpoint on disk verifies, and the newest holds the last step.
    found = checkpoint.complete(run.job_dir)
    assert found, run.out[-2000:]
    assert all(checkpoint.verify(f.path) is None for f in found)
    # The policy of the last finished step (a push cut mid-way is after its update) was saved.
    last_step = max(r["step"] for r in run.rows if "loss" in r)
    assert found[-1].step in (last_step, last_step + 1), (found, last_step)
    assert checkpoint.read_meta(found[-1].path)["reason"] == "rollout-failure"


@pytest.mark.rollout_vllm
def test_a_reward_that_raises_is_one_line(vllm_server: Server, served_folder: Path) -> None:
    try:
        run = launch(
            "reward",
            served_folder,
            vllm_server.url,
            "--rollout.reward=rewards_for_tests:raises",
            "--rollout.eval_every_steps=0",
        )
    finally:
        restore(vllm_server, served_folder)
    assert run.rc == 1
    last = run.out.strip().splitlines()[-1]
    assert last.startswith(
        "halo: error: rollout.reward rewards_for_tests:raises raised KeyError"
    ), last
