"""SMPO, Simple Margin Preference Optimisation: reference-free, a target margin on
length-normalised log-probabilities, and a balancing SFT term.

Defined as in Vikhr's public effective_llm_alignment toolkit (github.com/VikhrModels/
effective_llm_alignment): ``SimpleMarginPOTrainer.smpo_loss`` and ``get_batch_loss_metrics``
in src/trainers/smpo_trainer.py, defaults from ``SimpleMarginPOConfig`` in
src/configs/smpo_config.py (read at commit 2e14ea7). With ``c`` and ``r`` the chosen and
rejected responses' mean token log-probabilities, ``lower = c - r - margin_min`` and
``upper = lower - margin_delta``, the preference term of a pair is, by ``loss_type``:

- sigmoid: ``-log sigmoid(beta * lower)``
- hinge: ``relu(-beta * lower)``
- ipo: ``(beta * lower) ** 2``
- smooth_lower_bound (the default): ``relu(-beta * lower) ** 2``
- smooth_double_bound: ``relu(-beta * lower) ** 2 + relu(beta * upper) ** 2``

and the SFT term adds the negative log-likelihood of the chosen response, weighted
``chosen_sft_ratio``, and of the rejected one, weighted ``1 - chosen_sft_ratio``, so the margin
is reached without unlearning the chosen text. The toolkit averages that negative
log-likelihood over the tokens of its micro-batch; here it is each pair's mean token NLL, the
same quantity the margin uses, so the loss does not depend on how a batch is split over
micro-batches and processes. The toolkit's optional trimming of extreme token log-probs is
not offered. The data path and the one forward over chosen and rejected are the preference
family's (halo.train.methods.preference).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from halo.train.config import Config, Smpo
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import preference, simpo
from halo.train.state import Batch, Method


def preference_losses(chosen: torch.Tensor, rejected: torch.Tensor, s: Smpo) -> torch.Tensor:
    """Per pair, the margin term, from mean log-probabilities."""
    lower = s.beta * (chosen - rejected - s.margin_min)
    if s.loss_type == "sigmoid":
        return -functional.logsigmoid(lower)
    if s.loss_type == "hinge":
        return torch.relu(-lower)
    if s.loss_type == "ipo":
        return lower.pow(2)
    below = torch.relu(-lower).pow(2)
    if s.loss_type == "smooth_lower_bound":
        return below
    return below + torch.relu(lower - s.beta * s.margin_delta).pow(2)


def sft_losses(chosen: torch.Tensor, rejected: torch.Tensor, s: Smpo) -> torch.Tensor:
    """Per pair, the balancing SFT term: weighted mean token NLLs."""
    return -(s.chosen_sft_ratio * chosen + (1 - s.chosen_sft_ratio) * rejected)


def make(s: Smpo) -> preference.Loss:
    def loss(
        model: nn.Module, b: Batch, prepared: object
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chosen, rejected = simpo.mean_logprobs(model, b)
        pref, sft = preference_losses(chosen, rejected, s), sft_losses(chosen, rejected, s)
        gap = (chosen - rejected).detach()
        extra = {
            "reward_acc": (gap > 0).float().sum(),
            "margin": gap.sum(),
            "sft_loss": sft.detach().sum(),
        }
        return (pref + sft).sum(), extra

    return loss


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    s = cfg.smpo or Smpo()
    note = (
        f"loss_type {s.loss_type}, beta {s.beta}, margin_min {s.margin_min}, "
        f"margin_delta {s.margin_delta}, chosen_sft_ratio {s.chosen_sft_ratio}, no reference model"
    )
    return preference.build(cfg, tok, "preference/smpo", make(s), note)
