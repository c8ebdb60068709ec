"""Direct preference optimisation on chosen/rejected pairs, against a frozen reference.

Data: ``{"prompt": ..., "chosen": ..., "rejected": ...}`` with strings or message lists, or
full chosen/rejected conversations (halo.train.formats). The loss per pair is
``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` with sequence log-probabilities
of the responses (the assistant span after the prompt), averaged over the global batch.
The pairs are read, rendered and tokenized in halo.train.methods.dpo_data (no torch there).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional

from halo.errors import HaloError
from halo.train import data
from halo.train.config import Config, Dpo
from halo.train.methods import dpo_data
from halo.train.model import batch_logprobs
from halo.train.state import Batch, Method
from halo.train.tokenizer import ChatTokenizer


def collate(pairs: list[dpo_data.Pair], pad_id: int) -> Batch:
    # Chosen first, rejected second: rows i and i + n are one pair.
    batch = data.pad([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id)
    batch["pairs"] = torch.ones(len(pairs))
    return batch


def sequence_logprobs(model: nn.Module, b: Batch) -> torch.Tensor:
    return (batch_logprobs(model, b) * b["weights"]).sum(-1)


def make(d: Dpo) -> tuple[Any, Any]:
    def prepare(model: nn.Module, reference: nn.Module | None, batches: list[Batch]) -> list[Any]:
        assert reference is not None
        return [sequence_logprobs(reference, b) for b in batches]

    def loss(
        model: nn.Module, b: Batch, ref: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = b["pairs"].shape[0]
        delta = sequence_logprobs(model, b) - ref
        margin = d.beta * (delta[:n] - delta[n:])
        extra = {"reward_acc": (margin > 0).float().sum(), "margin": margin.detach().sum()}
        return -functional.logsigmoid(margin).sum(), extra

    return prepare, loss


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    d = cfg.dpo or Dpo()
    train, evals = data.load(cfg.data, cfg.training.seed, dpo_data.parse)
    pairs, dropped = dpo_data.encode(train, tok, cfg.data.max_seq_len)
    if not pairs:
        raise HaloError("data.train: no pair fits within data.max_seq_len")
    eval_pairs, _ = dpo_data.encode(evals, tok, cfg.data.max_seq_len)
    prepare, loss = make(d)
    notes = [f"preference/dpo: {len(pairs)} pairs, beta {d.beta}", *dpo_data.describe(cfg, tok)]
    if dropped:
        notes.append(f"preference/dpo: dropped {dropped} pairs longer than data.max_seq_len")
    return Method(
        name="preference/dpo",
        items=pairs,
        collate=lambda ps: collate(ps, tok.pad_id),
        loss=loss,
        prepare=prepare,
        needs_reference=True,
        count=lambda b: float(b["pairs"].shape[0]),
        eval_items=eval_pairs,
        notes=notes,
    )
