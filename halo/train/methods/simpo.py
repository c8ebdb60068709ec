"""SimPO (Meng, Xia and Chen, 2024, arXiv 2405.14734): preference optimisation with no
reference model, on length-normalised log-probabilities and a target margin.

Per pair, with ``c`` and ``r`` the chosen and rejected responses' mean token log-probability
(their summed log-probability divided by their length)::

    loss = -log sigmoid(beta * (c - r) - gamma)

averaged over the global batch; TRL's CPOTrainer with ``loss_type="simpo"`` computes the same
with ``simpo_gamma = gamma`` (its ``gamma_beta_ratio`` is ``gamma / beta``). The data path and
the one forward over chosen and rejected are the preference family's
(halo.train.methods.preference).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from halo.train.config import Config, Simpo
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import preference
from halo.train.state import Batch, Method


def mean_logprobs(model: nn.Module, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) mean token log-probabilities of the responses, fp32."""
    sums, counts = preference.logprobs(model, b)
    return preference.halves(sums / counts.clamp(min=1), b)


def losses(chosen: torch.Tensor, rejected: torch.Tensor, s: Simpo) -> torch.Tensor:
    """Per pair, from mean log-probabilities."""
    return -functional.logsigmoid(s.beta * (chosen - rejected) - s.gamma)


def make(s: Simpo) -> preference.Loss:
    def loss(
        model: nn.Module, b: Batch, prepared: object
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chosen, rejected = mean_logprobs(model, b)
        margin = s.beta * (chosen - rejected).detach()
        extra = {"reward_acc": (margin > 0).float().sum(), "margin": margin.sum()}
        return losses(chosen, rejected, s).sum(), extra

    return loss


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    s = cfg.simpo or Simpo()
    note = f"beta {s.beta}, gamma {s.gamma}, no reference model"
    return preference.build(cfg, tok, "preference/simpo", make(s), note)
