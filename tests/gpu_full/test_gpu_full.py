"""Many GPUs, run by hand (`nox -s test-gpu-full`): FSDP2 across every visible GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cpu.conftest import EXAMPLES, outputs, run_halo

pytestmark = pytest.mark.gpu_full


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _losses(tmp: Path) -> list[float]:
    rows = (tmp / "logs" / "tiny-sft" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in rows]


def test_fsdp_over_all_gpus_matches_one_gpu(tmp_path: Path) -> None:
    n = min(_gpus(), 8)
    if n < 2:
        pytest.skip(f"needs at least 2 GPUs; {n} visible")
    common = [
        "--training.precision=bf16",
        "--training.max_steps=12",
        "--checkpoint.every_steps=0",
        f"--training.global_batch_size={8 * n}",
    ]
    one, many = tmp_path / "one", tmp_path / "many"
    r1 = run_halo(
        "launch",
        "sft",
        str(EXAMPLES / "sft" / "config.yaml"),
        "--",
        *outputs(one),
        *common,
        timeout=900,
    )
    assert r1.returncode == 0, r1.stderr[-3000:]
    rn = run_halo(
        "launch",
        "sft",
        str(EXAMPLES / "sft" / "config.yaml"),
        f"--nproc={n}",
        "--",
        *outputs(many),
        "--runtime.parallel_mode=fsdp",
        *common,
        timeout=900,
    )
    assert rn.returncode == 0, rn.stderr[-3000:]
    # bf16 reductions differ in order across ranks: same curve within bf16 tolerance.
    for a, b in zip(_losses(one), _losses(many), strict=True):
        assert abs(a - b) <= 2e-2 * max(1.0, abs(a))


def test_dpo_with_a_sharded_reference_matches_one_gpu(tmp_path: Path) -> None:
    """FSDP shards the reference model too; the curve matches one GPU's."""
    n = min(_gpus(), 8)
    if n < 2:
        pytest.skip(f"needs at least 2 GPUs; {n} visible")
    common = [
        "--training.precision=bf16",
        "--training.max_steps=8",
        f"--training.global_batch_size={8 * n}",
    ]
    cfg = str(EXAMPLES / "dpo" / "config.yaml")
    r1 = run_halo(
        "launch", "preference/dpo", cfg, "--", *outputs(tmp_path / "one"), *common, timeout=900
    )
    assert r1.returncode == 0, r1.stderr[-3000:]
    rn = run_halo(
        "launch", "preference/dpo", cfg, f"--nproc={n}", "--", *outputs(tmp_path / "many"),
        "--runtime.parallel_mode=fsdp", *common, timeout=900,
    )  # fmt: skip
    assert rn.returncode == 0, rn.stderr[-3000:]
    one = [
        json.loads(x)["loss"]
        for x in (tmp_path / "one" / "logs" / "tiny-dpo" / "metrics.jsonl").read_text().splitlines()
    ]
    many = [
        json.loads(x)["loss"]
        for x in (tmp_path / "many" / "logs" / "tiny-dpo" / "metrics.jsonl")
        .read_text()
        .splitlines()
    ]
    for a, b in zip(one, many, strict=True):
        assert abs(a - b) <= 2e-2 * max(1.0, abs(a))
