"""Trackers (runtime.report_to): W&B offline and TensorBoard get exactly metrics.jsonl's rows,
read back with each library's own reader; a tracker that fails never stops training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import EXAMPLES, REPO, halo_env, metrics, outputs, train_here

pytestmark = pytest.mark.cpu

SFT = EXAMPLES / "sft" / "config.yaml"
JOB = "tiny-sft"


@pytest.fixture
def wandb_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Offline W&B whose own files (settings, cache) stay in the test's folder."""
    pytest.importorskip("wandb", reason="the trainer's stack carries wandb (trainer.in)")
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_SERVICE", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(key, raising=False)
    env = {
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-home"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-home" / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-home" / "data"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def wandb_runs(log_dir: Path) -> list[dict[str, Any]]:
    """Each offline W&B run under ``log_dir`` as its own records say: id, name, config, and
    the history rows by step (wandb's datastore reader and record protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal.datastore import DataStore

    runs = []
    for path in sorted((log_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        store = DataStore()
        store.open_for_scan(str(path))
        run: dict[str, Any] = {"history": {}}
        while (data := store.scan_data()) is not None:
            record = pb.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"], run["name"] = record.run.run_id, record.run.display_name
                updates = record.run.config.update
                run["config"] = {
                    u.key or ".".join(u.nested_key): json.loads(u.value_json) for u in updates
                }
            elif kind == "history":
                # A key comes as `key` or as `nested_key` parts, as the writer chose.
                items = record.history.item
                row = {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in items}
                step = row.pop("_step")
                run["history"].setdefault(step, {}).update(
                    {k: v for k, v in row.items() if not k.startswith("_")}
                )
        runs.append(run)
    return runs


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_trackers_get_every_metrics_row_and_a_resume_continues_the_wandb_run(
    tmp_path: Path, wandb_env: dict[str, str]
) -> None:
    import numpy as np

    both = "--runtime.report_to=[wandb, tensorboard]"
    secret = "hf_" + "9" * 20
    extra = [both, "--checkpoint.every_steps=0", f"--runtime.env.HF_TOKEN={secret}"]
    rc, out = train_here("sft", SFT, tmp_path, "--training.max_steps=3", *extra)
    assert rc == 0, out[-2000:]
    assert "tracker wandb: offline run" in out and "tracker tensorboard:" in out
    rc, out = train_here("sft", SFT, tmp_path, "--training.max_steps=5", *extra)
    assert rc == 0, out[-2000:]
    assert "resum" in out.lower()

    rows = metrics(tmp_path, JOB)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    log_dir = tmp_path / "logs" / JOB

    # W&B: two offline runs (the first and its resumption) under one id, named by the job,
    # whose history is metrics.jsonl row for row, every key, exactly.
    runs = wandb_runs(log_dir)
    run_id = json.loads((log_dir / "wandb-run.json").read_text())["id"]
    assert [(r["id"], r["name"]) for r in runs] == [(run_id, JOB)] * 2
    history = {s: v for r in runs for s, v in r["history"].items()}
    assert history == {r["step"]: {k: v for k, v in r.items() if k != "step"} for r in rows}
    config = runs[0]["config"]
    assert config["method"] == "sft" and config["runtime"]["job_name"] == JOB
    assert config["runtime"]["env"] == {"HF_TOKEN": "***"}
    assert config["training"]["max_steps"] == 3

    # TensorBoard: every key of every row at its step (scalars are stored as float32).
    scalars = tensorboard_scalars(log_dir / "tensorboard")
    for r in rows:
        for key, value in r.items():
            if key != "step":
                assert scalars[key][r["step"]] == np.float32(value), (key, r["step"])
    assert sorted(scalars["loss"]) == [1, 2, 3, 4, 5]

    assert not [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_a_wandb_that_fails_at_start_is_one_warning_line_and_training_goes_on(
    tmp_path: Path, wandb_env: dict[str, str]
) -> None:
    """Seed 002: wandb dies on a compute node's service socket. Here its service token names
    a socket nobody listens on; the trainer's process (what `halo launch` execs) still trains,
    exits 0 and says so in one line."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "halo.train.run", "--method", "sft", "--config", str(SFT),
            *outputs(tmp_path), "--training.max_steps=2", "--checkpoint.every_steps=0",
            "--runtime.report_to=[wandb, tensorboard]",
        ],
        env=halo_env(WANDB_SERVICE=f"3-1-unix-{tmp_path / 'no-such.sock'}", **wandb_env),
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "warning" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("halo: warning: tracker wandb failed to start (")
    assert warnings[0].endswith("training goes on without it, metrics.jsonl has every value")
    assert [r["step"] for r in metrics(tmp_path, JOB)] == [1, 2]
    assert sorted(tensorboard_scalars(tmp_path / "logs" / JOB / "tensorboard")["loss"]) == [1, 2]


def test_a_tracker_that_fails_mid_run_is_dropped_with_one_line() -> None:
    from halo.train.observe.trackers import Trackers

    class Full:
        """A tracker whose disk fills up at its second row."""

        name = "full"

        def __init__(self) -> None:
            self.rows: list[int] = []

        def log(self, row: dict[str, float], step: int) -> None:
            if self.rows:
                raise OSError(28, "No space left on device")
            self.rows.append(step)

        def close(self) -> None:
            raise AssertionError("a dropped tracker is not closed again")

    said: list[str] = []
    full, other = Full(), Full()
    other.log = lambda row, step: other.rows.append(step)  # type: ignore[method-assign]
    other.close = lambda: None  # type: ignore[method-assign]
    t = Trackers([full, other], warn=said.append)
    for step in (1, 2, 3):
        t.log({"step": step, "loss": 1.0})
    t.close()
    assert full.rows == [1] and other.rows == [1, 2, 3]
    assert said == [
        "tracker full failed to log step 2 (OSError: [Errno 28] No space left on device); "
        "training goes on without it, metrics.jsonl has every value"
    ]


def test_wandb_is_offline_unless_a_key_is_set_and_the_mode_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from halo.train.observe.trackers import start, wandb_mode

    monkeypatch.setenv("WANDB_MODE", "disabled")
    said: list[str] = []
    t = start(["wandb"], tmp_path, "job", {}, is_main=True, say=said.append)
    assert t.live == [] and said == ["tracker wandb: off (WANDB_MODE=disabled)"]
    assert start(["wandb"], tmp_path, "job", {}, is_main=False).live == []  # rank > 0

    assert wandb_mode({}) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k"}) == "online"
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}) == "disabled"
    assert wandb_mode({"WANDB_MODE": "online"}) == "offline"  # no key: nothing to log in with
