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


def _one_vs_many(tmp: Path, method: str, example: str, job: str, steps: int) -> None:
    """The same run on one GPU and FSDP over all of them: the same curve within bf16."""
    n = min(_gpus(), 8)
    if n < 2:
        pytest.skip(f"needs at least 2 GPUs; {n} visible")
    common = [
        "--training.precision=bf16",
        f"--training.max_steps={steps}",
        "--checkpoint.every_steps=0",
        f"--training.global_batch_size={8 * n}",
    ]
    cfg = str(EXAMPLES / example / "config.yaml")
    curves = []
    for name, launch in (("one", []), ("many", [f"--nproc={n}"])):
        mode = ["--runtime.parallel_mode=fsdp"] if launch else []
        r = run_halo(
            "launch", method, cfg, *launch, "--", *outputs(tmp / name), *mode, *common, timeout=900
        )
        assert r.returncode == 0, r.stderr[-3000:]
        rows = (tmp / name / "logs" / job / "metrics.jsonl").read_text().splitlines()
        curves.append([json.loads(x)["loss"] for x in rows])
    # bf16 reductions differ in order across ranks: same curve within bf16 tolerance.
    for a, b in zip(*curves, strict=True):
        assert abs(a - b) <= 2e-2 * max(1.0, abs(a))


def test_fsdp_over_all_gpus_matches_one_gpu(tmp_path: Path) -> None:
    _one_vs_many(tmp_path, "sft", "sft", "tiny-sft", 12)


def test_dpo_with_a_sharded_reference_matches_one_gpu(tmp_path: Path) -> None:
    """FSDP shards the reference model too; the curve matches one GPU's."""
    _one_vs_many(tmp_path, "preference/dpo", "dpo", "tiny-dpo", 8)
