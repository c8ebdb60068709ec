"""Many GPUs, run by hand (`nox -s test-gpu-full`): FSDP2 and DDP against one GPU, DeepEP on
every visible GPU, the trainer's weights over NCCL. Each test says in its skip reason how many
GPUs (or which server) it needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cpu.conftest import EXAMPLES, outputs, run_halo

pytestmark = pytest.mark.gpu_full


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _one_vs_many(
    tmp: Path, method: str, example: str, job: str, steps: int, mode: str = "fsdp"
) -> None:
    """The same run on one GPU and ``mode`` over all of them: the same curve within bf16."""
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
        mode_arg = [f"--runtime.parallel_mode={mode}"] if launch else []
        r = run_halo(
            "launch",
            method,
            cfg,
            *launch,
            "--",
            *outputs(tmp / name),
            *mode_arg,
            *common,
            timeout=900,
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


def test_ddp_over_all_gpus_matches_one_gpu(tmp_path: Path) -> None:
    _one_vs_many(tmp_path, "sft", "sft", "tiny-sft", 12, mode="ddp")


def test_deepep_intranode_on_every_gpu() -> None:
    from gpu_core.test_gpu_core import deepep_round_trip

    n = _gpus()
    if n < 2:
        pytest.skip(f"DeepEP intranode needs at least 2 GPUs on one node; {n} visible")
    deepep_round_trip(min(n, 8))


BROADCAST = Path(__file__).resolve().parent / "nccl_weights.py"


def test_trainer_weights_cross_gpus_over_nccl_bit_for_bit() -> None:
    """What a weight push rides on: the trainer's state dict broadcast over NCCL from GPU 0
    arrives on every other GPU bit for bit (torch's NCCL, the version the servers must share)."""
    n = _gpus()
    if n < 2:
        pytest.skip(f"an NCCL broadcast between GPUs needs at least 2 GPUs; {n} visible")
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={min(n, 8)}"]
    r = subprocess.run([*argv, str(BROADCAST)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("nccl: weights identical") == min(n, 8) - 1, r.stdout[-2000:]


def test_weight_push_to_a_gpu_vllm_server_over_nccl() -> None:
    n = _gpus()
    if n < 2:
        pytest.skip(
            f"needs at least 2 GPUs (the trainer on one, the vLLM server on another); {n} visible"
        )
    if not os.environ.get("HALO_VLLM_GPU_URL"):
        pytest.skip(
            "needs a vLLM server on another GPU of this machine at $HALO_VLLM_GPU_URL "
            "(start it from vllm-server:0.26.0 with `halo serve start vllm`)"
        )
    pytest.skip(
        "halo.rollout.weights pushes through a shared folder and /reload, not NCCL yet: "
        "nothing to compare over NCCL (tracked in docs/gpu.md)"
    )
