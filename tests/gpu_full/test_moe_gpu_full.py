"""gpu_full, MoE and the mesh over several GPUs: DeepEP against all-to-all on the same block,
expert parallelism with FSDP2 against one GPU, context parallelism (ring attention, which has
no CPU kernel) against one GPU. Each test names in its skip reason the GPUs it needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cpu.conftest import EXAMPLES, REPO, halo_env, outputs, run_halo

pytestmark = pytest.mark.gpu_full


def _gpus(least: int) -> int:
    import torch

    n = min(torch.cuda.device_count(), 8)
    if n < least:
        pytest.skip(f"needs at least {least} GPUs; {n} visible")
    return n


def _curve(tmp: Path, example: Path, job: str, nproc: int, *extra: str) -> list[float]:
    r = run_halo(
        "launch", "sft", str(example), f"--nproc={nproc}", *extra[: extra.index("--")],
        "--", *outputs(tmp), *extra[extra.index("--") + 1 :], timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rows = (tmp / "logs" / job / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in rows if "loss" in json.loads(x)]


def _same_curve(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):  # bf16 reductions in another order: bf16's tolerance
        assert abs(x - y) <= 2e-2 * max(1.0, abs(x)), (a, b)


def test_deepep_matches_all_to_all_outputs_and_gradients() -> None:
    from halo.train.parallel import ep

    n = _gpus(2)
    if why := ep.deepep_loads():
        pytest.skip(why)
    script = Path(__file__).with_name("moe_dispatch.py")
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", str(script)],
        env=halo_env(), capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("deepep == all_to_all") == n


def test_ep_with_fsdp_over_the_gpus_matches_one_gpu(tmp_path: Path) -> None:
    n = _gpus(2)
    moe = EXAMPLES / "moe" / "config.yaml"
    common = ["--", "--training.precision=bf16", "--training.max_steps=6",
              "--checkpoint.every_steps=0", f"--training.global_batch_size={8 * n}",
              "--runtime.parallelism.expert_parallel_backend=all_to_all"]  # fmt: skip
    one = _curve(tmp_path / "one", moe, "tiny-moe", 1, *common)
    many = _curve(tmp_path / "many", moe, "tiny-moe", n, "--expert_parallel_size", "2", *common)
    _same_curve(one, many)


def test_cp2_matches_one_gpu(tmp_path: Path) -> None:
    _gpus(2)
    sft = EXAMPLES / "sft" / "config.yaml"
    common = ["--", "--training.precision=bf16", "--training.max_steps=6",
              "--checkpoint.every_steps=0", "--model.attention=sdpa"]  # fmt: skip
    one = _curve(tmp_path / "one", sft, "tiny-sft", 1, *common)
    cp = _curve(tmp_path / "cp", sft, "tiny-sft", 2, "--context_parallel_size", "2", *common)
    _same_curve(one, cp)
