"""Context parallelism: each of cp ranks holds a part of every sequence; attention is a ring.

A micro-batch is padded on the right to a multiple of 2 x cp and cut into 2 x cp chunks; rank
r keeps chunks r and 2cp-1-r (head and tail: every rank gets the same share of the causal
triangle, the layout PyTorch's context_parallel load balancer uses). The position ids go
along, the attention mask becomes all ones: right padding is causal-safe (no real token
attends to a later pad) and an all-ones mask lets transformers call SDPA with is_causal,
which ``context_parallel`` turns into ring attention over the cp ranks. The loss is the sum
over this rank's tokens; its count is this rank's targets, so the trainer's global
normalisation holds unchanged.

PyTorch's ring attention runs on CUDA SDPA kernels (flash, efficient, cuDNN); its CPU kernel
has no context-parallel rule, so CP needs GPUs (tests: gpu_full).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from halo.train.state import Batch

SEQ_KEYS = ("input_ids", "targets", "weights", "attention_mask", "position_ids", "token_mask")


def chunks(length: int, cp: int, rank: int) -> torch.Tensor:
    """Positions of the sequence rank ``rank`` keeps: chunk r and chunk 2cp-1-r."""
    size = length // (2 * cp)
    head = torch.arange(rank * size, (rank + 1) * size)
    tail = torch.arange((2 * cp - 1 - rank) * size, (2 * cp - rank) * size)
    return torch.cat([head, tail])


def shard(batch: Batch, cp: int, rank: int, pad_id: int) -> Batch:
    """This rank's part of a padded micro-batch (every (B, T) tensor cut the same way)."""
    ids = batch["input_ids"]
    b, t = ids.shape
    step = 2 * cp
    full = -(-t // step) * step
    out: Batch = {}
    fill = {"input_ids": pad_id, "targets": pad_id, "weights": 0, "attention_mask": 0}
    for key, value in batch.items():
        if key not in SEQ_KEYS:
            out[key] = value
            continue
        if full > t:
            extra = value.new_full((b, full - t), fill.get(key, 0))
            value = torch.cat([value, extra], dim=1)
        out[key] = value
    # The real tokens (MoE routing statistics skip padding); then a mask SDPA reads as causal.
    out["token_mask"] = out.get("attention_mask", torch.ones((b, full), dtype=torch.long))
    out["attention_mask"] = torch.ones((b, full), dtype=torch.long)
    if "position_ids" not in out:
        out["position_ids"] = torch.arange(full).unsqueeze(0).expand(b, -1)
    keep = chunks(full, cp, rank)
    return {k: (v[:, keep].contiguous() if k in SEQ_KEYS else v) for k, v in out.items()}


@contextlib.contextmanager
def ring(cp_mesh: Any) -> Iterator[None]:
    """SDPA inside this block is ring attention over ``cp_mesh`` (inputs already sharded)."""
    from torch.distributed.tensor.experimental import context_parallel

    with context_parallel(cp_mesh):
        yield


def wrap_method(method: Any, cp_mesh: Any, pad_id: int) -> None:
    """A method's collate shards for this cp rank, and its loss runs inside ``ring``."""
    cp, rank = cp_mesh.size(), cp_mesh.get_local_rank()
    collate: Callable[[list[Any]], Batch] = method.collate
    loss = method.loss

    def sharded_collate(items: list[Any]) -> Batch:
        return shard(collate(items), cp, rank, pad_id)

    def ring_loss(model: Any, batch: Batch, prepared: Any) -> Any:
        with ring(cp_mesh):
            return loss(model, batch, prepared)

    method.collate = sharded_collate
    method.loss = ring_loss
