"""What the training loop asks of a mesh run, one call per place (all no-ops without a mesh):
the routing losses of MoE blocks, gradient clipping over several meshes, the routing log,
evaluation that keeps every rank's collectives in step, and a test hook that dumps the
gradients of each update."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from halo.train.models import moe
from halo.train.parallel import norms
from halo.train.state import Trainer

# A test hook: a folder where each update's full gradients are written by rank 0
# (grads_<step>.pt, parameter name -> tensor). Unset in real runs.
TEST_HOOK_GRADS_ENV = "HALO_TEST_HOOK_GRADS"


def begin(tr: Trainer, batch: dict[str, torch.Tensor]) -> None:
    """Before a micro-batch's forward (MoE: which tokens are real, for the routing losses)."""
    if tr.ctx.mesh is not None:
        moe.begin(tr.model, batch.get("token_mask", batch.get("attention_mask")))


def router_loss(tr: Trainer, micro_batches: int) -> torch.Tensor | None:
    """The routing losses of the forward just done, scaled like the loop's loss; None: none."""
    return moe.router_loss(tr.model, micro_batches) if tr.ctx.mesh is not None else None


def grad_norm(tr: Trainer, clip: float) -> float | None:
    """Clip and return the total norm (mesh runs); None: torch's own clipping serves."""
    if tr.ctx.mesh is None:
        return None
    dump_grads(tr)
    return norms.clip_grad_norm_(tr.model.parameters(), clip)


def replicas(tr: Trainer) -> int:
    """How many ranks hold each token (tp: every rank of a tp group)."""
    return tr.ctx.mesh.dims.tp if tr.ctx.mesh is not None else 1


def step_stats(tr: Trainer) -> dict[str, float]:
    return moe.step_stats(tr.model) if tr.ctx.mesh is not None else {}


def eval_batches(
    tr: Trainer, mine: list[Any], items: list[Any], size: int
) -> Iterator[tuple[list[Any], bool]]:
    """(micro-batch, counted) pairs: this rank's, then, on a mesh of several ranks, uncounted
    repeats of the first item until every rank has run as many forwards (each forward is a
    collective there: FSDP gathers, EP exchanges)."""
    batches = [mine[i : i + size] for i in range(0, len(mine), size)]
    mesh = tr.ctx.mesh
    most = len(batches)
    if mesh is not None and mesh.distributed:  # agreed before any forward: they are collectives
        n = torch.tensor([len(batches)], device=tr.ctx.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        most = int(n)
    yield from ((b, True) for b in batches)
    for _ in range(most - len(batches)):
        yield items[:1], False


def dump_grads(tr: Trainer) -> None:
    folder = os.environ.get(TEST_HOOK_GRADS_ENV)
    if not folder:
        return
    full = {}
    for name, p in tr.model.named_parameters():
        if p.grad is not None:
            g = p.grad
            full[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().cpu()
    if tr.ctx.is_main:
        Path(folder).mkdir(parents=True, exist_ok=True)
        torch.save(full, Path(folder) / f"grads_{tr.step + 1}.pt")
