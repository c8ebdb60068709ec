"""Environmental GRPO against the live vLLM server: the calculator example's mean reward rises.

The example's starting point (examples/environmental-grpo/sft.yaml: the architecture the CPU
server serves, so its weights can replace the served ones in place) is trained and exported
first; the trainer then runs as `halo launch` runs it (python -m halo.train.run), pushes the
starting point to the server before its first rollout, and plays every turn there: the n
episodes of a row share one request, later turns one each, the calculator's answers rendered
between them. The rollout URL is given with the OpenAI /v1 suffix, as OpenAI clients take it.
Afterwards the server serves the folder it was started on again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rollout_client import Server
from test_online_grpo import restore, scratch_dirs

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "environmental-grpo"
CONFIG = EXAMPLE / "config.yaml"
# The example as it is (12 steps of 4 rows x 8 episodes), sampled in the trainer's own process
# instead (rollout.backend: local, seed 0): the mean reward went 0.25 -> 0.88 (the mean of the
# last three steps), the held-out one 0.24 -> 0.69 -> 0.83 -> 0.85 at steps 0, 4, 8, 12. A
# third of the starting point's episodes call the calculator, and those are right; the rest
# guess a two-digit sum.
RISE = 0.3
HELD_OUT_RISE = 0.2


def trainer(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    python = os.environ.get("HALO_TRAINER_PYTHON", sys.executable)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [python, "-m", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def start() -> Path:
    """The example's starting point, as its config says: `halo launch sft`, `halo export`."""
    from halo.train.checkpoints import checkpoint

    root, _ = scratch_dirs("env-start")
    r = trainer(
        "halo.train.run", "--method", "sft", "--config", str(EXAMPLE / "sft.yaml"),
        f"--runtime.paths.checkpoints={root}/checkpoints", f"--runtime.paths.logs={root}/logs",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    found = checkpoint.latest(root / "checkpoints" / "tiny-env-start")
    assert found is not None
    r = trainer("halo", "export", str(found.path), str(root / "served"))
    assert r.returncode == 0, r.stderr
    return root / "served"


@pytest.mark.rollout_vllm
def test_the_calculator_examples_reward_rises_against_the_server(
    vllm_server: Server, served_folder: Path, start: Path
) -> None:
    root, on_server = scratch_dirs("env-grpo")
    try:
        r = trainer(
            "halo.train.run", "--method", "environmental-grpo", "--config", str(CONFIG),
            f"--model.name_or_path={start}",
            f"--runtime.paths.checkpoints={root}/checkpoints", f"--runtime.paths.logs={root}/logs",
            f"--runtime.rollout_url={vllm_server.url}/v1",
            f"--rollout.export_dir={root}/served", f"--rollout.export_dir_on_server={on_server}/served",
            "--rollout.eval_every_steps=6",  # 256 held-out episodes a time: three of them
        )  # fmt: skip
    finally:
        restore(vllm_server, served_folder)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "sampled by the rollout server" in r.stdout
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("environmental-grpo: sampling")]
    assert "/v1" not in line, line  # the suffix is the client's own, not part of the server's URL
    rows = [
        json.loads(x)
        for x in (root / "logs" / "tiny-env-grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [x for x in rows if "loss" in x]
    assert [x["step"] for x in steps] == list(range(1, 13))
    rewards = [x["reward"] for x in steps]
    print("mean episode reward by step:", [round(x, 3) for x in rewards])
    assert sum(rewards[-3:]) / 3 >= rewards[0] + RISE, rewards
    held_out = [(x["step"], x["eval_reward"]) for x in rows if "eval_reward" in x]
    print("held-out mean reward by step:", held_out)
    assert [s for s, _ in held_out] == [0, 6, 12]
    assert held_out[-1][1] >= held_out[0][1] + HELD_OUT_RISE, held_out
    for x in steps:
        assert x["env_errors"] == 0 and x["probe_gap"] <= 1e-3, x  # served what was pushed
    # Multi-turn: by the end most episodes call the calculator, then answer.
    assert sum(x["turns"] for x in steps[-3:]) / 3 > 1.5, steps[-3:]
