"""End to end through `halo launch`: real training, DDP/FSDP on gloo, signals, resume, export."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from halo.train.checkpoints import checkpoint

from .conftest import (
    EXAMPLES,
    TINY,
    halo_cmd,
    halo_env,
    metrics,
    model_override,
    outputs,
    run_halo,
    train_here,
)

pytestmark = pytest.mark.cpu

SFT = EXAMPLES / "sft" / "config.yaml"
STEPS = 16
# Two epochs of the example, a checkpoint every 4 steps, all kept.
BASE = [f"--training.max_steps={STEPS}", "--checkpoint.every_steps=4", "--checkpoint.keep_last=0"]


def launch(
    tmp: Path, *extra: str, method: str = "sft", config: Path = SFT, nproc: int = 1
) -> subprocess.CompletedProcess[str]:
    r = run_halo("launch", method, str(config), f"--nproc={nproc}", "--", *outputs(tmp), *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def losses(tmp: Path, job: str = "tiny-sft") -> list[float]:
    return [r["loss"] for r in metrics(tmp, job) if "loss" in r]


def final_weights(tmp: Path, job: str = "tiny-sft") -> dict[str, torch.Tensor]:
    found = checkpoint.latest(tmp / "ck" / job)
    assert found is not None
    return checkpoint.load_weights(found.path)


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
    assert "<|im_start|>assistant\\n[[6 + 6 = 12.<|im_end|>]]\\n" in out  # example 1's mask
    names = [f.path.name for f in checkpoint.complete(tmp / "ck" / "tiny-sft")]
    assert names == [
        "r1_epoch_0_step_4",
        "r1_epoch_0_step_8",
        "r1_epoch_1_step_12",
        "r1_epoch_1_step_16",
    ]
    last = tmp / "ck" / "tiny-sft" / "r1_epoch_1_step_16"
    hf_files = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
    assert hf_files <= {p.name for p in last.iterdir()}
    meta = json.loads((last / "meta.json").read_text())
    assert meta["step"] == STEPS and meta["epoch"] == 1 and meta["reason"] == "periodic"
    assert set(meta["files"]) >= hf_files | {"trainer/optimizer.pt", "trainer/rng.pt"}
    assert checkpoint.verify(last) is None


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_match_one(reference: tuple[Path, str], tmp_path: Path, mode: str) -> None:
    # FSDP2 on gloo: sharded on the meta device, then filled from rank 0, as on GPUs.
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


def _start(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        halo_cmd(*args),
        env=halo_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT], [signal.SIGTERM] * 3])
def test_signals_finish_the_batch_save_once_and_resume_exactly(
    reference: tuple[Path, str], tmp_path: Path, signals: list[int]
) -> None:
    proc = _start(
        "launch", "sft", str(SFT), "--", *outputs(tmp_path), *BASE[:-1], "--checkpoint.keep_last=2"
    )
    seen: list[str] = []
    _read_until(proc, f"step 6/{STEPS}", seen)
    for sig in signals:  # a scheduler's repeated SIGTERM, 0.3 s apart
        proc.send_signal(sig)
        time.sleep(0.3)
    rest, _ = proc.communicate(timeout=180)
    out = "".join(seen) + rest
    assert proc.returncode == 0, out
    assert out.count("writing an emergency checkpoint") == 1, out
    job = tmp_path / "ck" / "tiny-sft"
    found = checkpoint.latest(job)
    assert found is not None
    meta = json.loads((found.path / "meta.json").read_text())
    assert meta["reason"] == "signal" and 6 <= meta["step"] < STEPS
    assert len(checkpoint.complete(job)) <= 2  # keep_last pruned the older ones
    if len(signals) > 1:
        return
    rc, again = train_here("sft", SFT, tmp_path, *BASE[:-1], "--checkpoint.keep_last=2")
    assert rc == 0, again
    assert f"resumed from {found.path} (step {meta['step']})" in again
    assert_same_weights(final_weights(tmp_path), final_weights(reference[0]))
    assert losses(tmp_path)[-1] == losses(reference[0])[-1]


def test_sigterm_under_torchrun_saves_and_exits_0(tmp_path: Path) -> None:
    proc = _start("launch", "sft", str(SFT), "--nproc", "2", "--", *outputs(tmp_path), *BASE)
    seen: list[str] = []
    _read_until(proc, f"step 3/{STEPS}", seen)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, "".join(seen) + rest
    assert "the workers saved an emergency checkpoint, exiting 0" in rest
    found = checkpoint.latest(tmp_path / "ck" / "tiny-sft")
    assert found is not None
    meta = json.loads((found.path / "meta.json").read_text())
    assert meta["reason"] == "signal" and meta["world_size"] == 2 and 3 <= meta["step"] < STEPS


def test_sigkill_mid_checkpoint_write_resumes_from_the_previous_one(
    reference: tuple[Path, str], tmp_path: Path
) -> None:
    proc = _start(
        "launch", "sft", str(SFT), "--", *outputs(tmp_path), *BASE,
        **{checkpoint.TEST_HOOK_SLEEP_ENV: "8:120"},
    )  # fmt: skip
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
    assert checkpoint.latest(job).path.name == "r1_epoch_0_step_4"  # type: ignore[union-attr]

    rc, again = train_here("sft", SFT, tmp_path, *BASE)
    assert rc == 0, again
    assert f"ignoring and removing partial write {partial[0].name}" in again
    assert f"resumed from {job / 'r1_epoch_0_step_4'} (step 4)" in again
    assert not partial[0].exists()
    assert_same_weights(final_weights(tmp_path), final_weights(reference[0]))


def _answer_probs(model: torch.nn.Module, tok: object, rows: list[dict]) -> list[float]:
    """Per group: the rewarded completion's share of the probability of all completions."""
    from halo.train.data import formats
    from halo.train.data.batching import pad
    from halo.train.methods.grpo_data import encode_group
    from halo.train.models.hf import batch_logprobs

    out = []
    for n, row in enumerate(rows):
        group = encode_group(formats.group(row, f"row {n}"), tok, 64)  # type: ignore[arg-type]
        assert group is not None
        b = pad(list(group.seqs), 0)
        with torch.no_grad():
            seq = (batch_logprobs(model, b) * b["weights"]).sum(-1)
        share = torch.softmax(seq, 0)
        out.append(float(share[[c["reward"] for c in row["completions"]].index(1.0)]))
    return out


def test_offline_grpo_raises_the_rewarded_answers_probability(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from halo.train import config
    from halo.train.data import tokenizer as tk
    from halo.train.models import hf

    cfg_path = EXAMPLES / "grpo" / "config.yaml"
    rc, out = train_here("offline-grpo", cfg_path, tmp_path)
    assert rc == 0, out
    assert "old policy current, clip 0.2, kl_coef 0.01, scale_rewards group, loss_type token" in out
    rows = [json.loads(x) for x in (EXAMPLES / "grpo" / "train.jsonl").read_text().splitlines()]
    cfg = config.load(cfg_path, "offline-grpo")
    tok = tk.for_config(cfg)
    start = hf.build(cfg.model, hf.hf_config(cfg.model, tok), "sdpa", cfg.training.seed).eval()
    found = checkpoint.latest(tmp_path / "ck" / "tiny-grpo")
    assert found is not None
    trained = AutoModelForCausalLM.from_pretrained(str(found.path)).eval()
    before, after = _answer_probs(start, tok, rows), _answer_probs(trained, tok, rows)
    mean_before, mean_after = sum(before) / len(before), sum(after) / len(after)
    best_after = sum(p > 0.5 for p in after) / len(after)
    assert mean_after > mean_before + 0.2, (mean_before, mean_after)
    assert best_after > 0.5, after
    rows_m = metrics(tmp_path, "tiny-grpo")
    assert rows_m[0]["clip_frac"] == 0.0  # one update per batch: ratio 1, nothing clipped
    assert rows_m[0]["kl"] == pytest.approx(0.0, abs=1e-6) and max(r["kl"] for r in rows_m) > 0


def test_dpo_learns_the_preferences(tmp_path: Path) -> None:
    rc, out = train_here("preference/dpo", EXAMPLES / "dpo" / "config.yaml", tmp_path)
    assert rc == 0, out
    rows = metrics(tmp_path, "tiny-dpo")
    per_epoch = 4  # 32 pairs, 8 per step
    first, last = rows[:per_epoch], rows[-per_epoch:]
    assert rows[0]["loss"] == pytest.approx(0.693147, abs=1e-5)  # policy == reference: log 2
    assert sum(r["loss"] for r in last) < sum(r["loss"] for r in first) - 0.2
    assert sum(r["reward_acc"] for r in last) / per_epoch > 0.7


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize(
    ("method", "example"), [("sft", "sft"), ("preference/dpo", "dpo"), ("offline-grpo", "grpo")]
)
def test_families_train_and_export_to_identical_logits(
    tmp_path: Path, family: str, method: str, example: str
) -> None:
    from transformers import AutoModelForCausalLM

    from halo.train import config
    from halo.train.checkpoints import export
    from halo.train.data import tokenizer as tk
    from halo.train.models import hf

    cfg_path = EXAMPLES / example / "config.yaml"
    extra = [model_override(family), "--training.max_steps=2", "--checkpoint.every_steps=0"]
    rc, out = train_here(method, cfg_path, tmp_path, *extra)
    assert rc == 0, out
    found = checkpoint.latest(next((tmp_path / "ck").iterdir()))
    assert found is not None
    served = export.export(found.path, tmp_path / "serve")
    assert not (served / "meta.json").exists() and not (served / "trainer").exists()
    loaded = AutoModelForCausalLM.from_pretrained(str(served)).eval()
    assert loaded.config.model_type == family
    # The trainer's own model, built from the YAML and given the checkpoint's weights.
    cfg = config.load(cfg_path, method, [model_override(family)])
    tok = tk.for_config(cfg)
    mine = hf.build(cfg.model, hf.hf_config(cfg.model, tok), "sdpa", 0)
    missing, unexpected = mine.load_state_dict(checkpoint.load_weights(found.path), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    mine.eval()
    ids = torch.tensor([tok.encode("What is 2 + 2? 2 + 2 = 4.")])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, mine(ids).logits)
    if family == "qwen3":
        assert any("q_norm" in k for k in checkpoint.load_weights(found.path))
    assert TINY[family]["hidden_size"] == loaded.config.hidden_size


def test_mixed_formats_train_with_eval_loss_and_show_each_mask(tmp_path: Path) -> None:
    cfg = EXAMPLES / "sft-mix" / "config.yaml"
    dry = run_halo("launch", "sft", str(cfg), "--dry-run", "--", *outputs(tmp_path))
    assert dry.returncode == 0, dry.stderr
    assert "sharegpt.jsonl example 1" in dry.stdout
    assert (
        '[[<tool_call>{"name": "add", "arguments": {"a": 40, "b": 48}}</tool_call><|im_end|>]]'
        in dry.stdout
    )
    assert "<|im_start|>tool\\n88<|im_end|>" in dry.stdout  # tool output: not trained on
    assert "prompt_completion.parquet example 1" in dry.stdout
    rc, out = train_here("sft", cfg, tmp_path, "--training.max_steps=6")
    assert rc == 0, out
    rows = metrics(tmp_path, "tiny-sft-mix")
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert len(evals) == 2 and evals[1] < evals[0], rows


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
    assert "[[6 + 6 = 12.<|im_end|>]]" in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_preflight_passes_and_fails_with_reasons(tmp_path: Path) -> None:
    ok = run_halo("preflight", str(SFT), "--", *outputs(tmp_path))
    assert ok.returncode == 0 and "preflight: ok" in ok.stdout, ok.stderr
    bad = run_halo(
        "preflight", str(SFT), "--nproc", "3", "--", *outputs(tmp_path), "--runtime.devices=[0]",
        "--model.tokenizer=no-such/tokenizer",
    )  # fmt: skip
    assert bad.returncode == 2
    assert "runtime.devices: GPUs [0] requested, 0 present" in bad.stderr
    assert "training.global_batch_size: 8 does not divide over --nproc 3" in bad.stderr
    assert "model.tokenizer: no-such/tokenizer: no tokenizer.json" in bad.stderr
    assert list(tmp_path.iterdir()) == []


def test_launch_list_shows_nested_methods() -> None:
    r = run_halo("launch", "--list")
    assert r.returncode == 0
    for name in ("sft", "offline-grpo", "preference/dpo"):
        assert name in r.stdout
