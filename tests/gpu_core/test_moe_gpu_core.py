"""gpu_core, the MoE path on one GPU: the grouped expert matmul against its loop reference
in bf16, and a MoE training run in bf16 against the same run in fp32. Without a GPU each is
skipped with the reason (tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cpu.conftest import EXAMPLES, outputs, run_halo

pytestmark = pytest.mark.gpu_core

MOE = EXAMPLES / "moe" / "config.yaml"


def test_grouped_matmul_matches_the_loop_reference_on_the_gpu() -> None:
    import torch

    from halo.train.models import grouped

    device = torch.device("cuda")
    if not grouped.available(device, torch.bfloat16):
        pytest.skip("torch._grouped_mm needs bf16 on SM90 or newer here; the loop serves")
    g = torch.Generator(device="cuda").manual_seed(0)
    counts = [96, 0, 160, 8, 256, 32, 0, 64]  # experts with no rows too
    x = torch.randn(sum(counts), 256, device=device, generator=g, dtype=torch.bfloat16)
    w = torch.randn(8, 256, 512, device=device, generator=g, dtype=torch.bfloat16) / 16
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    xl, wl = x.float().requires_grad_(), w.float().requires_grad_()
    out = grouped.grouped(xg, wg, counts)
    ref = grouped.loop(xl, wl, counts)  # the reference, in fp32
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=2e-2)
    dy = torch.randn_like(ref)
    out.backward(dy.to(out.dtype))
    ref.backward(dy)
    torch.testing.assert_close(xg.grad.float(), xl.grad, atol=1e-1, rtol=2e-2)
    torch.testing.assert_close(wg.grad.float(), wl.grad, atol=5e-1, rtol=2e-2)


def _curve(tmp: Path, precision: str) -> list[float]:
    r = run_halo(
        "launch", "sft", str(MOE), "--nproc=1", "--", *outputs(tmp),
        f"--training.precision={precision}", "--training.max_steps=6", "--checkpoint.every_steps=0",
        timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rows = (tmp / "logs" / "tiny-moe" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in rows if "loss" in json.loads(x)]


def test_moe_training_in_bf16_matches_fp32_on_one_gpu(tmp_path: Path) -> None:
    fp32, bf16 = _curve(tmp_path / "fp32", "fp32"), _curve(tmp_path / "bf16", "bf16")
    assert len(fp32) == len(bf16) == 6
    for a, b in zip(fp32, bf16, strict=True):
        assert abs(a - b) <= 2e-2 * max(1.0, abs(a)), (fp32, bf16)
    assert bf16[-1] < bf16[0]
