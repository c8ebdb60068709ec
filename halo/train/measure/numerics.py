"""Numerical comparisons the GPU tiers gate on: attention kernels and trainer steps against fp32.

Attention: a backend (FA4, FA3, FA2 or torch SDPA, behind one varlen signature) runs forward
and backward in bf16/fp16 on packed rows; the reference is fp32 SDPA (the math kernel), one
call per row, so a block-diagonal mask bug in the backend cannot hide in the reference too.
Errors are normalised by the reference's largest magnitude (bf16 keeps ~3 significant digits
whatever the scale), with a tolerance per dtype and per tensor (gradients accumulate more
rounding than the output).

Trainer steps: the same batch through the trainer's own forward/backward (halo.train.loop.loop) in
two set-ups (bf16 vs fp32, GPU vs CPU): loss, total and per-parameter gradient norms, the
gradients' cosine and, optionally, the update's size.

Only torch here at import time (the device box has no pydantic until the bundle installs
it); the trainer-step half imports the trainer lazily.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional

# fn(q, k, v, cu_seqlens, max_seqlen, causal, scale, packed) -> out; q (total, Hq, D),
# k/v (total, Hkv, D), cu_seqlens int32 (rows + 1,). packed=False: every row has the same
# length and the backend may run its dense (B, T, H, D) kernel instead of the varlen one.
AttentionFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, bool, float, bool], torch.Tensor
]


@dataclass(frozen=True)
class Tolerance:
    """Largest |backend - reference| / max|reference| allowed, for the output and gradients."""

    out: float
    grad: float


# bf16 has an 8-bit mantissa (eps 7.8e-3): one rounding of the output is ~4e-3 of its scale;
# flash kernels' measured errors against fp32 sit near 1e-2 for dq. fp32 against fp32 differs
# only by summation order.
TOLERANCES = {
    torch.float32: Tolerance(out=1e-4, grad=1e-4),
    torch.float16: Tolerance(out=5e-3, grad=1e-2),
    torch.bfloat16: Tolerance(out=2e-2, grad=4e-2),
}


@dataclass(frozen=True)
class Case:
    """One attention shape: rows (packed into one varlen batch), heads, KV heads, head_dim."""

    name: str
    seqlens: tuple[int, ...]
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool = True
    packed: bool = True

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: {self.heads} heads do not group over {self.kv_heads}")
        if not self.packed and len(set(self.seqlens)) != 1:
            raise ValueError(f"{self.name}: a dense (unpacked) case needs equal row lengths")

    @property
    def cu_seqlens(self) -> torch.Tensor:
        return torch.tensor([0, *itertools.accumulate(self.seqlens)], dtype=torch.int32)

    @property
    def total(self) -> int:
        return sum(self.seqlens)


# Causal everywhere (the trainer's only mode), GQA, packed rows of uneven length (a 1-token row
# too: the edge a varlen kernel's tiling gets wrong first), head_dim 64 and 128.
CASES = (
    Case("dense-gqa-d64", (128, 128), heads=8, kv_heads=2, head_dim=64, packed=False),
    Case("packed-gqa-d64", (37, 128, 91), heads=8, kv_heads=2, head_dim=64),
    Case("packed-gqa-d128", (64, 1, 190), heads=8, kv_heads=4, head_dim=128),
    Case("dense-mha-d128", (192, 192), heads=4, kv_heads=4, head_dim=128, packed=False),
)


@dataclass(frozen=True)
class Error:
    tensor: str
    error: float  # max |a - b| / max |reference|
    limit: float

    @property
    def ok(self) -> bool:
        return math.isfinite(self.error) and self.error <= self.limit


@dataclass(frozen=True)
class Report:
    case: str
    dtype: str
    errors: tuple[Error, ...]

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.errors)

    def describe(self) -> str:
        parts = ", ".join(
            f"{e.tensor} {e.error:.2e}{'' if e.ok else ' > ' + format(e.limit, '.0e')}"
            for e in self.errors
        )
        return f"{self.case} {self.dtype}: {parts}"


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (inf where got is not finite)."""
    got, want = got.detach().float(), want.detach().float()
    if got.shape != want.shape:
        raise ValueError(f"shape {tuple(got.shape)} against the reference's {tuple(want.shape)}")
    if not torch.isfinite(got).all():
        return math.inf
    scale = want.abs().max().clamp(min=1e-12)
    return float((got - want).abs().max() / scale)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """fp32 SDPA (math kernel), one call per row: (total, Hq, D) from (total, H*, D)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bounds = cu_seqlens.tolist()
    outs = []
    with sdpa_kernel(SDPBackend.MATH):
        for start, end in itertools.pairwise(bounds):
            qs, ks, vs = (t[start:end].float().transpose(0, 1)[None] for t in (q, k, v))
            o = functional.scaled_dot_product_attention(
                qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=True
            )
            outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


def segment_mask(cu_seqlens: torch.Tensor, total: int, causal: bool, device: Any) -> torch.Tensor:
    """(total, total) boolean: True where query i may attend key j (same row, j <= i if causal)."""
    seg = torch.zeros(total, dtype=torch.long, device=device)
    for b in cu_seqlens.tolist()[1:-1]:
        seg[b:] += 1
    mask = seg[:, None] == seg[None, :]
    if causal:
        mask &= torch.ones(total, total, dtype=torch.bool, device=device).tril()
    return mask


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool,
    scale: float,
    packed: bool,
) -> torch.Tensor:
    """torch SDPA as the trainer uses it on packed rows: one call, a block-diagonal mask."""
    if not packed:
        rows = len(cu_seqlens) - 1
        qb, kb, vb = (t.view(rows, -1, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
        o = functional.scaled_dot_product_attention(
            qb, kb, vb, is_causal=causal, scale=scale, enable_gqa=True
        )
        return o.transpose(1, 2).reshape(q.shape)
    mask = segment_mask(cu_seqlens, q.shape[0], causal, q.device)
    qs, ks, vs = (t.transpose(0, 1)[None] for t in (q, k, v))
    o = functional.scaled_dot_product_attention(
        qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return o[0].transpose(0, 1)


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> torch.Tensor:
    """Call a flash-attention entry point with the keywords it takes (they differ by
    generation: FA2's dropout_p, FA4's missing max_seqlen); the output, not the LSE."""
    try:
        params = inspect.signature(fn).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}
    except (TypeError, ValueError):
        pass
    out = fn(*args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def flash_attention(module_name: str) -> AttentionFn:
    """A flash-attention generation (its module, as halo.train.models.attention.MODULES names it)."""
    module = importlib.import_module(module_name)

    def fn(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        causal: bool,
        scale: float,
        packed: bool,
    ) -> torch.Tensor:
        if not packed:
            rows = len(cu_seqlens) - 1
            qb, kb, vb = (t.view(rows, -1, *t.shape[1:]) for t in (q, k, v))
            o = _call(module.flash_attn_func, qb, kb, vb, causal=causal, softmax_scale=scale)
            return o.reshape(q.shape)
        cu = cu_seqlens.to(q.device, torch.int32)
        return _call(
            module.flash_attn_varlen_func,
            q,
            k,
            v,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            max_seqlen_q=max_seqlen,
            max_seqlen_k=max_seqlen,
            causal=causal,
            softmax_scale=scale,
        )

    return fn


def backend_fn(backend: str) -> AttentionFn:
    """halo.train.models.attention's backend name -> the function under test."""
    if backend == "sdpa":
        return sdpa_attention
    from halo.train.models.attention import MODULES

    return flash_attention(MODULES[backend])


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor


def inputs(case: Case, seed: int = 0) -> Inputs:
    """Seeded fp32 inputs on the CPU (the same bits on every device)."""
    g = torch.Generator().manual_seed(seed)
    n, d = case.total, case.head_dim
    q = torch.randn(n, case.heads, d, generator=g)
    k = torch.randn(n, case.kv_heads, d, generator=g)
    v = torch.randn(n, case.kv_heads, d, generator=g)
    return Inputs(q, k, v, torch.randn(n, case.heads, d, generator=g))


def forward_backward(
    fn: AttentionFn,
    case: Case,
    x: Inputs,
    dtype: torch.dtype,
    device: Any,
    scale: float | None = None,
) -> dict[str, torch.Tensor]:
    """out, dq, dk, dv of ``fn`` with inputs rounded to ``dtype`` on ``device``."""
    scale = scale if scale is not None else case.head_dim**-0.5
    q, k, v = (t.to(device, dtype).requires_grad_() for t in (x.q, x.k, x.v))
    cu = case.cu_seqlens.to(device)
    out = fn(q, k, v, cu, max(case.seqlens), case.causal, scale, case.packed)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), x.grad_out.to(device, dtype))
    return {"out": out, "dq": dq, "dk": dk, "dv": dv}


def reference(case: Case, x: Inputs, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The fp32 reference from the *same rounded* inputs the backend saw, on the CPU."""
    q, k, v = (t.to(dtype).float().requires_grad_() for t in (x.q, x.k, x.v))
    out = reference_attention(q, k, v, case.cu_seqlens, case.causal, case.head_dim**-0.5)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), x.grad_out.to(dtype).float())
    return {"out": out, "dq": dq, "dk": dk, "dv": dv}


def compare_attention(
    fn: AttentionFn,
    case: Case,
    dtype: torch.dtype = torch.bfloat16,
    device: Any = "cpu",
    seed: int = 0,
    tolerance: Tolerance | None = None,
) -> Report:
    """Forward and backward of ``fn`` in ``dtype`` against the fp32 reference."""
    tol = tolerance or TOLERANCES[dtype]
    x = inputs(case, seed)
    got = forward_backward(fn, case, x, dtype, device)
    want = reference(case, x, dtype)
    errors = tuple(
        Error(
            name,
            relative_error(got[name].cpu(), want[name]),
            tol.out if name == "out" else tol.grad,
        )
        for name in ("out", "dq", "dk", "dv")
    )
    return Report(case.name, str(dtype).removeprefix("torch."), errors)


# --- trainer steps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepNumbers:
    """One step's loss and gradients (fp32, on the CPU), and the update's size if taken."""

    loss: float
    grad_norm: float
    grad_norms: dict[str, float]
    grads: torch.Tensor = field(repr=False)
    update_norm: float | None = None


@dataclass(frozen=True)
class StepTolerance:
    loss: float  # relative
    grad_norm: float  # relative, the total norm
    param_norm: float  # relative, each parameter's gradient norm (above a floor)
    cosine: float  # lowest cosine between the flattened gradients
    update: float = 0.05  # relative, the optimizer update's norm


# bf16 autocast vs fp32: the loss to ~1%, gradients' direction to >0.99 (measured on the tiny
# models: cosine 0.9995+, loss 1e-3). CPU vs GPU in fp32: summation order only.
STEP_TOLERANCES = {
    "bf16": StepTolerance(loss=2e-2, grad_norm=5e-2, param_norm=0.15, cosine=0.99),
    "fp32": StepTolerance(loss=1e-4, grad_norm=1e-3, param_norm=1e-2, cosine=0.9999, update=1e-3),
}


@dataclass(frozen=True)
class StepReport:
    checks: tuple[Error, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def describe(self) -> str:
        return ", ".join(
            f"{c.tensor} {c.error:.2e}{'' if c.ok else ' > ' + format(c.limit, '.0e')}"
            for c in self.checks
        )


def _rel(a: float, b: float, floor: float = 1e-12) -> float:
    return abs(a - b) / max(abs(b), floor) if math.isfinite(a) else math.inf


# GRPO's first-step loss is ~0 (the ratio is 1 and the advantages sum to zero): below this
# the loss is compared absolutely.
LOSS_FLOOR = 1e-2


def compare_steps(got: StepNumbers, want: StepNumbers, tol: StepTolerance) -> StepReport:
    """``got`` (e.g. bf16, GPU) against ``want`` (fp32, CPU). Errors, each with its limit; the
    cosine is reported as 1 - cosine against 1 - tol.cosine."""
    if got.grad_norms.keys() != want.grad_norms.keys():
        raise ValueError("the two steps trained different parameters")
    floor = 1e-3 * want.grad_norm  # parameters with almost no gradient: relative error is noise
    worst = max(
        (_rel(got.grad_norms[k], w) for k, w in want.grad_norms.items() if w > floor), default=0.0
    )
    cos = float(functional.cosine_similarity(got.grads, want.grads, dim=0))
    checks = [
        Error("loss", _rel(got.loss, want.loss, LOSS_FLOOR), tol.loss),
        Error("grad_norm", _rel(got.grad_norm, want.grad_norm), tol.grad_norm),
        Error("param_grad_norm", worst, tol.param_norm),
        Error(
            "1-cosine", max(0.0, 1.0 - cos) if math.isfinite(cos) else math.inf, 1.0 - tol.cosine
        ),
    ]
    if got.update_norm is not None and want.update_norm is not None:
        checks.append(Error("update_norm", _rel(got.update_norm, want.update_norm), tol.update))
    return StepReport(tuple(checks))


def build_trainer(
    method_name: str, config: Any, overrides: list[str], device: str | torch.device
) -> tuple[Any, list[Any]]:
    """A one-process Trainer on ``device`` from a config file and its first global batch."""
    from halo.train import config as config_mod
    from halo.train.data import tokenizer as tk
    from halo.train.data.batching import Schedule
    from halo.train.loop import setup
    from halo.train.methods import registry
    from halo.train.parallel import distributed

    spec = registry.default().get(method_name)
    cfg = config_mod.load(config, spec.name, overrides)
    dev = torch.device(device)
    ctx = distributed.Context(0, 1, 0, dev)
    tok = tk.for_config(cfg)
    method = importlib.import_module(spec.module).build(cfg, tok)
    t = cfg.training
    sched = Schedule(len(method.items), t.global_batch_size, t.seed, t.epochs, t.max_steps)
    tr = setup.setup(cfg, method, tok, ctx, sched.total_steps)
    # The method's own sharding (GRPO computes group advantages there), as the loop does.
    items = method.shard([method.items[i] for i in sched.global_batch_of(0)], 0, 1)
    return tr, items


def measure_step(tr: Any, items: list[Any], update: bool = False) -> StepNumbers:
    """The trainer's own forward/backward over ``items`` (halo.train.loop.loop), and optionally its
    clip + optimizer update."""
    from halo.train.loop import loop

    batches, prepared, count = loop.prepare(tr, items)
    loss_sum, _ = loop.backward(tr, batches, prepared, count)
    named = [(n, p) for n, p in tr.model.named_parameters() if p.grad is not None]
    norms = {n: float(p.grad.detach().float().norm()) for n, p in named}
    grads = torch.cat([p.grad.detach().float().flatten().cpu() for _, p in named])
    delta = None
    if update:
        before = torch.cat([p.detach().float().flatten().cpu() for _, p in named])
        torch.nn.utils.clip_grad_norm_(tr.model.parameters(), tr.cfg.optim.grad_clip or math.inf)
        tr.optim.step()
        after = torch.cat([p.detach().float().flatten().cpu() for _, p in named])
        delta = float((after - before).norm())
    return StepNumbers(
        float(loss_sum) / count, float(grads.norm()), norms, grads, update_norm=delta
    )
