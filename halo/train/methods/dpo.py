"""Direct preference optimisation on chosen/rejected pairs, against a frozen reference.

Data: ``{"prompt": ..., "chosen": ..., "rejected": ...}`` with strings or message lists, or
full chosen/rejected conversations (halo.train.data.formats). The loss per pair is
``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` with sequence log-probabilities
of the responses (the assistant span after the prompt), averaged over the global batch.
Data path and forward are the preference family's (halo.train.methods.preference).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional

from halo.train.config import Config, Dpo
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import preference
from halo.train.state import Batch, Method

collate = preference.collate


def sequence_logprobs(model: nn.Module, b: Batch) -> torch.Tensor:
    return preference.logprobs(model, b)[0]


def make(d: Dpo) -> tuple[Any, Any]:
    def prepare(model: nn.Module, reference: nn.Module | None, batches: list[Batch]) -> list[Any]:
        assert reference is not None
        return [sequence_logprobs(reference, b) for b in batches]

    def loss(
        model: nn.Module, b: Batch, ref: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chosen, rejected = preference.halves(sequence_logprobs(model, b) - ref, b)
        margin = d.beta * (chosen - rejected)
        extra = {"reward_acc": (margin > 0).float().sum(), "margin": margin.detach().sum()}
        return -functional.logsigmoid(margin).sum(), extra

    return prepare, loss


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    d = cfg.dpo or Dpo()
    prepare, loss = make(d)
    return preference.build(cfg, tok, "preference/dpo", loss, f"beta {d.beta}", prepare)
