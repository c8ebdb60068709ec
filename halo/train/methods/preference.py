"""What DPO, SimPO and SMPO share: one data path and one forward over chosen and rejected.

The pairs are read, rendered and tokenized by halo.train.methods.dpo_data (no torch there);
here a micro-batch of n pairs is one padded batch of 2n rows, the chosen responses first and
the rejected second, through the model once. Each row's response log-probability is summed in
fp32 together with its token count, so a method takes sums (DPO) or means (SimPO, SMPO) of
the same forward. A method supplies only its per-pair loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from halo.errors import HaloError
from halo.train.config import Config
from halo.train.data import batching
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import dpo_data
from halo.train.models.hf import batch_logprobs
from halo.train.state import Batch, Method

# (policy, micro-batch, prepared) -> (sum of per-pair losses, extra metric sums)
Loss = Callable[[nn.Module, Batch, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def collate(pairs: list[dpo_data.Pair], pad_id: int) -> Batch:
    # Chosen first, rejected second: rows i and i + n are one pair.
    batch = batching.pad([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id)
    batch["pairs"] = torch.ones(len(pairs))
    return batch


def logprobs(model: nn.Module, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the response's summed log-probability and its token count, both fp32."""
    w = b["weights"].float()
    return (batch_logprobs(model, b).float() * w).sum(-1), w.sum(-1)


def halves(x: torch.Tensor, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen rows, rejected rows) of a per-row tensor."""
    n = b["pairs"].shape[0]
    return x[:n], x[n:]


def build(
    cfg: Config,
    tok: ChatTokenizer,
    name: str,
    loss: Loss,
    note: str,
    prepare: Callable[[nn.Module, nn.Module | None, list[Batch]], list[Any]] | None = None,
) -> Method:
    """The method ``name`` with its ``loss`` over the run's pairs (a reference model is loaded
    only when ``prepare`` is given: it is the one that reads it)."""
    train, evals = batching.load(dpo_data.sources(cfg.data), cfg.training.seed, dpo_data.parse)
    pairs, dropped = dpo_data.encode(train, tok, cfg.data.max_seq_len)
    if not pairs:
        raise HaloError("data.train: no pair fits within data.max_seq_len")
    eval_pairs, _ = dpo_data.encode(evals, tok, cfg.data.max_seq_len)
    notes = [f"{name}: {len(pairs)} pairs, {note}", *dpo_data.describe(cfg, tok)]
    if dropped:
        notes.append(f"{name}: dropped {dropped} pairs longer than data.max_seq_len")
    return Method(
        name=name,
        items=pairs,
        collate=lambda ps: collate(ps, tok.pad_id),
        loss=loss,
        prepare=prepare,
        needs_reference=prepare is not None,
        count=lambda b: float(b["pairs"].shape[0]),
        eval_items=eval_pairs,
        notes=notes,
    )
