"""The GPU tiers' comparison logic (halo.train.measure.numerics), proven on the CPU.

SDPA in the dtypes the GPUs train in, against a hand-written attention (explicit
softmax(QK^T/sqrt(d) + mask)V, KV heads repeated for GQA, a block-diagonal mask from
cu_seqlens), forward and backward; and the comparison must reject what is wrong on purpose:
a wrong scale, a varlen mask shifted by one, GQA heads mapped the wrong way, a different
model. The trainer-step comparison runs the tiny SFT example's real step, bf16 vs fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from halo.train.measure import numerics as nm

from .conftest import EXAMPLES

pytestmark = pytest.mark.cpu


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool,
    scale: float,
    packed: bool,
) -> torch.Tensor:
    """softmax(QK^T * scale + mask) V over all packed tokens at once, written out by hand."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    n = q.shape[0]
    row = torch.zeros(n, dtype=torch.long)
    for b in cu_seqlens.tolist()[1:-1]:
        row[b:] += 1
    allowed = row[:, None] == row[None, :]
    if causal:
        allowed &= torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    scores = torch.einsum("ihd,jhd->hij", q, k) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hij,jhd->ihd", scores.softmax(dim=-1), v)


def test_hand_written_attention_is_the_fp32_reference() -> None:
    """The reference itself (SDPA math, one call per row) equals attention written out."""
    for case in nm.CASES:
        x = nm.inputs(case)
        got = nm.forward_backward(explicit_attention, case, x, torch.float32, "cpu")
        want = nm.reference(case, x, torch.float32)
        for name in got:
            assert nm.relative_error(got[name], want[name]) < 1e-5, (case.name, name)


@pytest.mark.parametrize("case", nm.CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_sdpa_passes_forward_and_backward(case: nm.Case, dtype: torch.dtype) -> None:
    report = nm.compare_attention(nm.sdpa_attention, case, dtype)
    assert report.ok, report.describe()
    assert [e.tensor for e in report.errors] == ["out", "dq", "dk", "dv"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_hand_written_attention_passes_as_a_backend(dtype: torch.dtype) -> None:
    for case in nm.CASES:
        report = nm.compare_attention(explicit_attention, case, dtype)
        assert report.ok, report.describe()


def _mis_scaled(q, k, v, cu, max_len, causal, scale, packed):  # type: ignore[no-untyped-def]
    # 1/d instead of 1/sqrt(d): the classic port bug.
    return nm.sdpa_attention(q, k, v, cu, max_len, causal, scale * scale, packed)


def _shifted_mask(q, k, v, cu, max_len, causal, scale, packed):  # type: ignore[no-untyped-def]
    # Every row border one token late: the first token of each row sees the previous row's last.
    shifted = cu.clone()
    shifted[1:-1] += 1
    return nm.sdpa_attention(q, k, v, shifted, max_len, causal, scale, packed)


def _gqa_tiled(q, k, v, cu, max_len, causal, scale, packed):  # type: ignore[no-untyped-def]
    # KV heads tiled (0,1,0,1) instead of grouped (0,0,1,1): wrong query-to-KV mapping.
    g = q.shape[1] // k.shape[1]
    return explicit_attention(
        q, k.repeat(1, g, 1), v.repeat(1, g, 1), cu, max_len, causal, scale, packed
    )


def _not_causal(q, k, v, cu, max_len, causal, scale, packed):  # type: ignore[no-untyped-def]
    return nm.sdpa_attention(q, k, v, cu, max_len, False, scale, packed)


def _backward_scaled(q, k, v, cu, max_len, causal, scale, packed):  # type: ignore[no-untyped-def]
    # A correct forward with a wrong backward (gradients of dq scaled twice): only the
    # backward comparison can catch it.
    out = nm.sdpa_attention(q, k, v, cu, max_len, causal, scale, packed)
    return _ScaleGrad.apply(out, q)


class _ScaleGrad(torch.autograd.Function):
    """Identity on ``out``; adds a spurious gradient into q (as a kernel's dq bug would)."""

    @staticmethod
    def forward(ctx, out, q):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(q)
        return out.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        (q,) = ctx.saved_tensors
        return grad, 0.2 * q


@pytest.mark.parametrize(
    "broken,where",
    [
        (_mis_scaled, ("out", "dq", "dk", "dv")),
        (_shifted_mask, ("out",)),
        (_gqa_tiled, ("out",)),
        (_not_causal, ("out",)),
        (_backward_scaled, ("dq",)),
    ],
    ids=["wrong-scale", "varlen-mask-shifted-by-one", "gqa-heads-tiled", "not-causal", "bad-dq"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_comparison_rejects_a_broken_attention(
    broken: nm.AttentionFn, where: tuple[str, ...], dtype: torch.dtype
) -> None:
    case = nm.CASES[1] if broken is not _gqa_tiled else nm.CASES[0]  # packed rows, GQA
    report = nm.compare_attention(broken, case, dtype)
    assert not report.ok, report.describe()
    failed = {e.tensor for e in report.errors if not e.ok}
    assert set(where) <= failed, report.describe()


def test_a_shifted_varlen_mask_fails_the_backward_too() -> None:
    """The gradients of the keys next to a row border go wrong as well, not only the output."""
    report = nm.compare_attention(_shifted_mask, nm.CASES[2], torch.bfloat16)
    failed = {e.tensor for e in report.errors if not e.ok}
    assert {"dk", "dv"} <= failed, report.describe()


def test_non_finite_output_is_an_error() -> None:
    def nan_attention(q, k, v, cu, max_len, causal, scale, packed):  # type: ignore[no-untyped-def]
        return nm.sdpa_attention(q, k, v, cu, max_len, causal, scale, packed) * float("nan")

    assert not nm.compare_attention(nan_attention, nm.CASES[0], torch.bfloat16).ok


def test_a_case_refuses_heads_that_do_not_group() -> None:
    with pytest.raises(ValueError, match="do not group"):
        nm.Case("bad", (8,), heads=6, kv_heads=4, head_dim=64)


# --- trainer steps ---------------------------------------------------------------------------

SFT = EXAMPLES / "sft" / "config.yaml"


def _step(precision: str, *extra: str, update: bool = False) -> nm.StepNumbers:
    tr, items = nm.build_trainer("sft", SFT, [f"--training.precision={precision}", *extra], "cpu")
    return nm.measure_step(tr, items, update=update)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "activation-checkpointing"])
def test_bf16_step_matches_fp32_step(checkpointing: bool) -> None:
    ac = [f"--model.activation_checkpointing={str(checkpointing).lower()}"]
    want = _step("fp32", update=True)
    got = _step("bf16", *ac, update=True)
    report = nm.compare_steps(got, want, nm.STEP_TOLERANCES["bf16"])
    assert report.ok, report.describe()
    # Checkpointing recomputes the forward: in fp32 it must change nothing at all.
    if checkpointing:
        again = _step("fp32", *ac, update=True)
        assert again.loss == want.loss and torch.equal(again.grads, want.grads)


def test_the_step_comparison_rejects_another_model() -> None:
    """A different initialisation (seed) is caught even in bf16's loose tolerance."""
    want = _step("fp32")
    got = _step("bf16", "--training.seed=1")
    report = nm.compare_steps(got, want, nm.STEP_TOLERANCES["bf16"])
    assert not report.ok, report.describe()


def test_the_step_comparison_rejects_a_wrong_loss_scale(tmp_path: Path) -> None:
    want = _step("fp32")
    got = nm.StepNumbers(
        want.loss * 1.05, want.grad_norm, want.grad_norms, want.grads, want.update_norm
    )
    report = nm.compare_steps(got, want, nm.STEP_TOLERANCES["bf16"])
    assert [c.tensor for c in report.checks if not c.ok] == ["loss"], report.describe()
