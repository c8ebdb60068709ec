"""Gradient-norm clipping over parameters that live on different meshes.

torch.nn.utils.clip_grad_norm_ stacks every gradient's norm into one tensor, which DTensors
on different meshes (dense weights on FSDP's mesh, experts on EP x FSDP, TP shards) cannot
share. Here each group of one mesh and placement is reduced by DTensor itself, the groups'
totals are combined as plain numbers, and every gradient is scaled by the same factor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def _key(g: torch.Tensor) -> tuple[object, ...]:
    spec = getattr(g, "_spec", None)
    if spec is None:
        return ("local", g.device, g.dtype)
    return ("dtensor", id(spec.mesh), tuple(spec.placements), g.dtype)


def total_norm(grads: list[torch.Tensor]) -> float:
    groups: dict[tuple[object, ...], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault(_key(g), []).append(g)
    sq = 0.0
    for group in groups.values():
        norms = torch.stack([torch.linalg.vector_norm(g, 2.0, dtype=torch.float32) for g in group])
        n = torch.linalg.vector_norm(norms, 2.0)
        if hasattr(n, "full_tensor"):
            n = n.full_tensor()  # the norm over every shard (a collective on that mesh)
        sq += float(n) ** 2
    return math.sqrt(sq)


def clip_grad_norm_(params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """The total gradient norm before clipping (as torch's), gradients scaled to ``max_norm``."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = total_norm(grads)
    if math.isfinite(norm) and norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        for g in grads:
            g.mul_(coef)
    return norm
