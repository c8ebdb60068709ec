"""From a validated config to a ready Trainer: attention, models, optimizer.

The tokenizer comes first, from halo.train.data.tokenizer.for_config (no torch there).

One process or DDP: the model is built once on the CPU, the reference (when the method
needs one) is a frozen copy. FSDP: rank 0 alone builds the full model; every rank builds
it on the meta device, shards it, and receives its shard from rank 0 (policy and reference
alike), so no rank holds a full copy beside its shard.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from halo.errors import HaloError
from halo.train.config import Config
from halo.train.data import tokenizer as tk
from halo.train.loop import optimizer
from halo.train.models import attention, hf
from halo.train.parallel import build as parallel
from halo.train.parallel import distributed
from halo.train.state import Method, Trainer


def log(ctx: distributed.Context, msg: str) -> None:
    if ctx.is_main:
        print(msg, flush=True)


def _frozen(m: nn.Module) -> nn.Module:
    return m.requires_grad_(False).eval()


def _sharded(
    cfg: Config,
    conf: Any,
    backend: str,
    ctx: distributed.Context,
    bf16: bool,
    full: dict[str, torch.Tensor] | None,
    build: Callable[..., nn.Module] = hf.build,
) -> nn.Module:
    m = build(cfg.model, conf, backend, cfg.training.seed, device="meta")
    distributed.wrap(m, "fsdp", ctx, bf16)
    distributed.materialise(m, full, ctx)
    hf.restore_buffers(m, ctx.device)
    return m


def models(
    cfg: Config,
    conf: Any,
    backend: str,
    ctx: distributed.Context,
    mode: str,
    bf16: bool,
    reference: bool,
    build: Callable[..., nn.Module] = hf.build,
) -> tuple[nn.Module, nn.Module | None]:
    """(policy, reference or None), placed and wrapped for ``mode``."""
    if mode == "fsdp":
        full = None
        if ctx.is_main:
            full = build(cfg.model, conf, backend, cfg.training.seed).state_dict()
        policy = _sharded(cfg, conf, backend, ctx, bf16, full, build)
        ref = _frozen(_sharded(cfg, conf, backend, ctx, bf16, full, build)) if reference else None
        return policy.train(), ref
    base = build(cfg.model, conf, backend, cfg.training.seed).to(ctx.device)
    ref = _frozen(copy.deepcopy(base)) if reference else None
    return distributed.wrap(base.train(), mode, ctx, bf16), ref


def setup(
    cfg: Config, method: Method, tok: tk.ChatTokenizer, ctx: distributed.Context, total_steps: int
) -> Trainer:
    t = cfg.training
    if t.global_batch_size % ctx.world:
        raise HaloError(
            f"training.global_batch_size: {t.global_batch_size} does not divide over {ctx.world} processes"
        )
    mode = distributed.resolve_mode(cfg.runtime.parallel_mode, ctx.world, ctx.device.type == "cuda")
    bf16 = t.precision == "bf16"
    cap = torch.cuda.get_device_capability(ctx.device) if ctx.device.type == "cuda" else None
    choice = attention.select(
        cfg.model.attention, cap, attention.module_importable, half_precision=bf16
    )
    log(ctx, f"attention: {choice.backend} ({choice.reason})")
    conf = hf.hf_config(cfg.model, tok)
    if method.configure is not None:
        conf = method.configure(conf)
    build = method.build_model or hf.build
    # A mesh (tp, cp, ep; a MoE model): halo.train.parallel places the models; else below.
    placed = parallel.layout(cfg, conf, ctx, method.name)
    if placed is not None:
        layout, ctx = placed
        mode = layout.mode
        policy, ref = parallel.models(
            cfg, conf, choice.backend, ctx, layout, bf16, method.needs_reference, build
        )
        parallel.adapt_method(layout, method, tok.pad_id, lambda line: log(ctx, line))
    else:
        policy, ref = models(
            cfg, conf, choice.backend, ctx, mode, bf16, method.needs_reference, build
        )
    sharded = mode == "fsdp" or (placed is not None and placed[0].sharded)
    # FSDP: a forward before the first step leaves its shards in a state the first
    # checkpoint's state-dict gathering trips over; those runs skip this check.
    if not sharded:
        length = min(
            cfg.data.max_seq_len, getattr(conf, "max_position_embeddings", None) or 256, 256
        )
        hf.first_forward(policy, conf, cfg.model.name_or_path or "model.config", ctx.device, length)
    # Fused AdamW takes plain tensors only (FSDP's and TP/EP's DTensors: the foreach path).
    fused = not sharded and (ctx.mesh is None or not ctx.mesh.distributed)
    optim, scheduler = optimizer.make(
        cfg.optim, policy, total_steps * method.updates_per_batch, fused=fused
    )
    # FSDP casts through its mixed-precision policy; otherwise autocast does.
    autocast = (
        torch.autocast(ctx.device.type, dtype=torch.bfloat16)
        if bf16 and not sharded
        else contextlib.nullcontext()
    )
    return Trainer(cfg, method, tok, ctx, policy, ref, optim, scheduler, conf, mode, autocast)
