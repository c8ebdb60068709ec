"""The pull-request GPU gate: one GPU, the image's own CUDA 13 stack, the trainer in bf16.

Run inside the image (`nox -s test-gpu-core`) or natively (`halo test gpu-core --native`).
Without a GPU every test here is skipped with the reason (tests/conftest.py), never passed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cpu.conftest import EXAMPLES, REPO, outputs, run_halo

pytestmark = pytest.mark.gpu_core

BUILD_RECORD = Path("/etc/halo/build.json")


def _torch():  # type: ignore[no-untyped-def]
    import torch

    return torch


def test_torch_is_the_cuda13_build() -> None:
    torch = _torch()
    assert torch.version.cuda is not None and torch.version.cuda.startswith("13."), (
        torch.version.cuda
    )
    assert torch.cuda.is_available()
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(
        (x @ x.T).float().cpu(), x.float().cpu() @ x.float().cpu().T, atol=2.0, rtol=2e-2
    )


def test_nccl_is_the_locked_version() -> None:
    if not BUILD_RECORD.is_file():
        pytest.skip("needs an image's /etc/halo/build.json to know its pin set (running natively)")
    from halo.images.catalog import load_catalog
    from halo.pins.lockfile import load_lock, lock_path

    image = json.loads(BUILD_RECORD.read_text())["image"]
    lock = load_lock(lock_path(REPO / "pins", load_catalog(REPO).image(image).pins))
    pinned = lock.package("nvidia-nccl-cu13")
    assert pinned is not None
    major, minor, patch = _torch().cuda.nccl.version()
    assert f"{major}.{minor}.{patch}" == pinned.version


def test_attention_backend_fits_the_architecture_and_agrees_with_sdpa() -> None:
    torch = _torch()
    from halo.train import attention

    cap = torch.cuda.get_device_capability()
    choice = attention.select("auto", cap, attention.module_importable, half_precision=True)
    expected = {10: "fa4", 9: "fa3"}.get(cap[0])
    if expected and attention.module_importable(attention.MODULES[expected]):
        assert choice.backend == expected, choice
    kernel = attention.kernel(choice.backend)
    if kernel is None:
        pytest.skip(
            f"no flash-attention kernel for SM{cap[0]}{cap[1]} in this environment ({choice.reason})"
        )
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 256, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = kernel(q, k, v, causal=True)
    out = out[0] if isinstance(out, tuple) else out
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=3e-2)


def test_transformers_attention_matches_sdpa_including_packed_rows() -> None:
    """The implementation the trainer hands transformers agrees with SDPA, and packed rows
    (position_ids restarting per example) stay separate under the varlen kernel."""
    torch = _torch()
    from transformers import AutoConfig, AutoModelForCausalLM

    from halo.train import attention, data
    from halo.train.model import ATTN_IMPLEMENTATION, logits

    choice = attention.select(
        "auto", torch.cuda.get_device_capability(), attention.module_importable, True
    )
    if choice.backend == "sdpa":
        pytest.skip(f"no flash-attention here ({choice.reason})")
    conf = AutoConfig.for_model(
        "llama", vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, intermediate_size=512,
    )  # fmt: skip
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(conf, attn_implementation="sdpa", dtype=torch.bfloat16)
    fast = AutoModelForCausalLM.from_config(
        conf, attn_implementation=ATTN_IMPLEMENTATION[choice.backend], dtype=torch.bfloat16
    )
    fast.load_state_dict(ref.state_dict())
    ref, fast = ref.cuda().eval(), fast.cuda().eval()
    seqs = [data.Sequence(list(range(5, 45)), list(range(6, 46)), [1.0] * 40),
            data.Sequence(list(range(50, 70)), list(range(51, 71)), [1.0] * 20)]  # fmt: skip
    packed = {k: v.cuda() for k, v in data.pack(seqs).items()}
    padded = {k: v.cuda() for k, v in data.pad(seqs, 0).items()}
    with torch.no_grad():
        a, b = logits(fast, packed)[0].float(), logits(ref, padded).float()
    torch.testing.assert_close(a[:40], b[0, :40], atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(a[40:], b[1, :20], atol=5e-2, rtol=5e-2)


def test_sft_example_trains_in_bf16_on_the_gpu(tmp_path: Path) -> None:
    r = run_halo(
        "launch",
        "sft",
        str(EXAMPLES / "sft" / "config.yaml"),
        "--",
        *outputs(tmp_path),
        "--training.precision=bf16",
        "--training.max_steps=24",
        "--checkpoint.every_steps=0",
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "attention: " in r.stdout + r.stderr
    rows = [
        json.loads(x)
        for x in (tmp_path / "logs" / "tiny-sft" / "metrics.jsonl").read_text().splitlines()
    ]
    losses = [row["loss"] for row in rows]
    assert len(losses) == 24
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4, losses
