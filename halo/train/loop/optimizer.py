"""AdamW with decay only on matrices, and the learning-rate schedule as a pure function."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from halo.train.config import Optim


def lr_lambda(o: Optim, total_updates: int) -> Callable[[int], float]:
    def f(update: int) -> float:
        if o.warmup_steps and update < o.warmup_steps:
            return (update + 1) / o.warmup_steps
        if o.scheduler == "constant":
            return 1.0
        span = max(total_updates - o.warmup_steps, 1)
        frac = min(max(update - o.warmup_steps, 0) / span, 1.0)
        shape = 0.5 * (1 + math.cos(math.pi * frac)) if o.scheduler == "cosine" else 1 - frac
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * shape

    return f


def make(
    o: Optim, model: nn.Module, total_updates: int, fused: bool = True
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    # No decay on norms and biases (1-D): decaying them toward 0 fights the normalisation.
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=o.lr,
        betas=(o.betas[0], o.betas[1]),
        eps=o.eps,
        # One kernel per tensor instead of a dozen (CPU and CUDA); FSDP's DTensors take the
        # default multi-tensor path.
        fused=fused or None,
    )
    return optim, torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(o, total_updates))
