"""End to end through `halo launch`: real training, DDP on gloo, signals, resume, pruning."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from halo.train import checkpoint

from .conftest import EXAMPLES, halo_cmd, halo_env, outputs, run_halo

pytestmark = pytest.mark.cpu

SFT = EXAMPLES / "sft" / "config.yaml"
STEPS = 16
# Two epochs of the example, a checkpoint every 4 steps, all kept.
BASE = [f"--training.max_steps={STEPS}", "--checkpoint.every_steps=4", "--checkpoint.keep_last=0"]


def launch(
    tmp: Path, *extra: str, method: str = "sft", config: Path = SFT, nproc: int = 1
) -> subprocess.CompletedProcess[str]:
    r = run_halo(
        "launch", method, str(config), f"--nproc={nproc}", "--", *outputs(tmp), *extra, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def losses(tmp: Path, job: str = "tiny-sft") -> list[float]:
    rows = [
        json.loads(line) for line in (tmp / "logs" / job / "metrics.jsonl").read_text().splitlines()
    ]
    return [r["loss"] for r in rows]


def final_weights(tmp: Path, job: str = "tiny-sft") -> dict[str, torch.Tensor]:
    found = checkpoint.latest(tmp / "ck" / job)
    assert found is not None
    return load_file(str(found.path / "model.safetensors"))


def assert_same_weights(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0
) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if atol:
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)
        else:
            assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("reference")
    r = launch(tmp, *BASE)
    return tmp, r.stdout


def test_sft_trains_with_a_falling_loss(reference: tuple[Path, str]) -> None:
    tmp, out = reference
    curve = losses(tmp)
    assert len(curve) == STEPS
    assert sum(curve[-4:]) / 4 < sum(curve[:4]) / 4 - 1.0, curve
    assert "attention: sdpa (no CUDA GPU: torch SDPA)" in out
    assert "[[6 + 6 = 12.<|im_end|>]]" in out  # the logged loss mask of example 1
    names = [f.path.name for f in checkpoint.complete(tmp / "ck" / "tiny-sft")]
    assert names == ["epoch_0_step_4", "epoch_0_step_8", "epoch_1_step_12", "epoch_1_step_16"]
    last = tmp / "ck" / "tiny-sft" / "epoch_1_step_16"
    assert {p.name for p in last.iterdir()} >= set(checkpoint.REQUIRED)
    meta = json.loads((last / "meta.json").read_text())
    assert meta["step"] == STEPS and meta["epoch"] == 1 and meta["reason"] == "periodic"


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_match_one(reference: tuple[Path, str], tmp_path: Path, mode: str) -> None:
    # FSDP2 runs on gloo too: the code path the GPU images use, checked here on the CPU.
    r = launch(tmp_path, *BASE, f"--runtime.parallel_mode={mode}", nproc=2)
    assert f"world 2 ({mode})" in r.stdout
    assert losses(tmp_path) == pytest.approx(losses(reference[0]), abs=1e-4)
    assert_same_weights(final_weights(tmp_path), final_weights(reference[0]), atol=1e-4)


def _read_until(
    proc: subprocess.Popen[str], needle: str, seen: list[str], timeout: float = 240
) -> None:
    """Read the trainer's output up to ``needle``; a trainer that stalls fails the test, not CI."""
    assert proc.stdout is not None
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            seen.append(line)
            if needle in line:
                return
    finally:
        watchdog.cancel()
    raise AssertionError(
        f"trainer exited (or stalled {timeout:.0f}s) before {needle!r}:\n{''.join(seen)}"
    )


def test_sigterm_finishes_the_batch_saves_and_resumes_exactly(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    cmd = halo_cmd(
        "launch", "sft", str(SFT), "--", *outputs(tmp_path), *BASE[:-1], "--checkpoint.keep_last=2"
    )
    proc = subprocess.Popen(
        cmd, env=halo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: list[str] = []
    _read_until(proc, f"step 6/{STEPS}", seen)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(seen) + rest
    assert "writing an emergency checkpoint" in rest
    job = tmp_path / "ck" / "tiny-sft"
    found = checkpoint.latest(job)
    meta = json.loads((found.path / "meta.json").read_text())
    assert meta["reason"] == "sigterm" and 6 <= meta["step"] < STEPS
    assert len(checkpoint.complete(job)) <= 2  # keep_last pruned the older ones

    again = launch(tmp_path, *BASE[:-1], "--checkpoint.keep_last=2")
    assert f"resumed from {found.path} (step {meta['step']})" in again.stdout
    assert_same_weights(final_weights(tmp_path), final_weights(reference[0]))
    assert losses(tmp_path)[-1] == losses(reference[0])[-1]


def test_sigterm_under_torchrun_saves_and_exits_0(tmp_path: Path) -> None:
    cmd = halo_cmd("launch", "sft", str(SFT), "--nproc", "2", "--", *outputs(tmp_path), *BASE)
    proc = subprocess.Popen(
        cmd, env=halo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: list[str] = []
    _read_until(proc, f"step 3/{STEPS}", seen)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(seen) + rest
    assert "the workers saved an emergency checkpoint, exiting 0" in rest
    found = checkpoint.latest(tmp_path / "ck" / "tiny-sft")
    meta = json.loads((found.path / "meta.json").read_text())
    assert meta["reason"] == "sigterm" and meta["world_size"] == 2 and 3 <= meta["step"] < STEPS


def test_sigkill_mid_checkpoint_write_resumes_from_the_previous_one(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    cmd = halo_cmd("launch", "sft", str(SFT), "--", *outputs(tmp_path), *BASE)
    env = halo_env(**{checkpoint.TEST_HOOK_SLEEP_ENV: "8:120"})
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: list[str] = []
    try:
        _read_until(proc, "test hook: sleeping", seen)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    job = tmp_path / "ck" / "tiny-sft"
    partial = checkpoint.partials(job)
    assert len(partial) == 1 and (partial[0] / "model.safetensors").is_file()
    assert not (partial[0] / "meta.json").exists()
    assert checkpoint.latest(job).path.name == "epoch_0_step_4"

    again = launch(tmp_path, *BASE)
    assert f"ignoring and removing partial write {partial[0].name}" in again.stdout
    assert f"resumed from {job / 'epoch_0_step_4'} (step 4)" in again.stdout
    assert not partial[0].exists()
    assert_same_weights(final_weights(tmp_path), final_weights(reference[0]))


def test_offline_grpo_trains_with_a_falling_loss(tmp_path: Path) -> None:
    r = launch(tmp_path, method="offline-grpo", config=EXAMPLES / "grpo" / "config.yaml")
    assert "old policy reference, clip 0.2, kl_coef 0.01" in r.stdout
    curve = losses(tmp_path, "tiny-grpo")
    per_epoch = 8  # 32 groups, 4 per step
    first, last = curve[:per_epoch], curve[-per_epoch:]
    assert sum(last) / per_epoch < sum(first) / per_epoch - 0.02, curve
    rows = [
        json.loads(x)
        for x in (tmp_path / "logs" / "tiny-grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and max(r["kl"] for r in rows) > 0


def test_dry_run_prints_the_command_and_writes_nothing(tmp_path: Path) -> None:
    r = run_halo(
        "launch",
        "sft",
        str(SFT),
        "--nproc",
        "2",
        "--dry-run",
        "--",
        *outputs(tmp_path),
        "--lr=1e-5",
    )
    assert r.returncode == 0, r.stderr
    assert (
        "-m torch.distributed.run --standalone --local-addr=127.0.0.1 --nproc-per-node=2 -m halo.train.run"
        in r.stdout
    )
    assert f"checkpoints: {tmp_path / 'ck' / 'tiny-sft'}" in r.stdout
    assert "lr: 1.0e-05" in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_preflight_passes_and_fails_with_reasons(tmp_path: Path) -> None:
    ok = run_halo("preflight", str(SFT), "--", *outputs(tmp_path))
    assert ok.returncode == 0 and "preflight: ok" in ok.stdout, ok.stderr
    bad = run_halo(
        "preflight", str(SFT), "--nproc", "3", "--", *outputs(tmp_path), "--runtime.devices=[0]"
    )
    assert bad.returncode == 2
    assert "runtime.devices: GPUs [0] requested, 0 present" in bad.stderr
    assert "training.global_batch_size: 8 does not divide over --nproc 3" in bad.stderr
    assert list(tmp_path.iterdir()) == []


def test_launch_list_shows_nested_methods() -> None:
    r = run_halo("launch", "--list")
    assert r.returncode == 0
    for name in ("sft", "offline-grpo", "preference/dpo"):
        assert name in r.stdout


def test_dpo_learns_the_preferences(tmp_path: Path) -> None:
    launch(tmp_path, method="preference/dpo", config=EXAMPLES / "dpo" / "config.yaml")
    rows = [
        json.loads(x)
        for x in (tmp_path / "logs" / "tiny-dpo" / "metrics.jsonl").read_text().splitlines()
    ]
    per_epoch = 4  # 32 pairs, 8 per step
    first, last = rows[:per_epoch], rows[-per_epoch:]
    assert rows[0]["loss"] == pytest.approx(0.693147, abs=1e-5)  # policy == reference: log 2
    assert sum(r["loss"] for r in last) < sum(r["loss"] for r in first) - 0.2
    assert sum(r["reward_acc"] for r in last) / per_epoch > 0.7
