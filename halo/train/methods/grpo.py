"""GRPO: group-relative advantages over rewarded completions, clipped surrogate, k3 KL.

Offline data: one group per line::

    {"prompt": "What is 2+3?", "completions": [{"text": "5", "reward": 1.0}, ...]}

Advantage of completion i in group g: ``(r_i - mean_g) / (std + adv_eps)`` where std is the
group's sample standard deviation (``scale_rewards: group``, TRL's default), the whole
batch's (``batch``), or no division at all (``none``). Per completion token:
``-min(r*A, clip(r, 1-eps, 1+eps)*A) + kl_coef * (exp(ref - lp) - (ref - lp) - 1)`` with
``r = pi / pi_old``. ``loss_type: token`` averages over all completion tokens of the global
batch (DAPO); ``sequence`` averages each completion's tokens, then the completions
(DeepSeekMath).

The groups are read, rendered and tokenized in halo.train.methods.grpo_data (no torch there).

``policy_update`` is one optimizer step on a global batch of rollouts (prompt, completions,
rewards): offline GRPO calls it through the loop; online GRPO calls it after each rollout.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from halo.errors import HaloError
from halo.train.config import Config, Grpo
from halo.train.data import batching, examples, formats
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import grpo_data
from halo.train.models.hf import batch_logprobs
from halo.train.state import Batch, Method, StepStats, Trainer


@dataclass(frozen=True)
class Scored:
    """A group with its advantages (computed over the global batch it was drawn in)."""

    seqs: tuple[examples.Sequence, ...]
    advantages: tuple[float, ...]


def advantages(rewards: list[list[float]], scale: str, eps: float) -> list[list[float]]:
    """Per group, per completion: reward minus its group's mean, scaled as configured."""
    flat = [r for group in rewards for r in group]
    batch_std = statistics.stdev(flat) if len(flat) > 1 else 0.0
    out = []
    for group in rewards:
        mean = sum(group) / len(group)
        if scale == "none":
            out.append([r - mean for r in group])
            continue
        std = batch_std if scale == "batch" else statistics.stdev(group)
        out.append([(r - mean) / (std + eps) for r in group])
    return out


def make_shard(g: Grpo) -> Any:
    def shard(groups: list[grpo_data.Group], rank: int, world: int) -> list[Scored]:
        adv = advantages([list(x.rewards) for x in groups], g.scale_rewards, g.adv_eps)
        scored = [Scored(x.seqs, tuple(a)) for x, a in zip(groups, adv, strict=True)]
        return batching.share(scored, rank, world)

    return shard


def collate(groups: list[Scored], pad_id: int) -> Batch:
    batch = batching.pad([s for grp in groups for s in grp.seqs], pad_id)
    batch["advantages"] = torch.tensor([a for grp in groups for a in grp.advantages])
    return batch


def make(g: Grpo) -> tuple[Any, Any, Any]:
    """(prepare, loss, count) for the config's GRPO variant."""
    need_ref = g.kl_coef > 0 or g.old_policy == "reference"
    # With one update per batch the current policy *is* the old one: lp.detach() in loss().
    need_old = g.old_policy == "current" and g.updates_per_batch > 1

    def prepare(model: nn.Module, reference: nn.Module | None, batches: list[Batch]) -> list[Any]:
        out = []
        for b in batches:
            ref = batch_logprobs(reference, b) if need_ref and reference is not None else None
            old = (
                ref
                if g.old_policy == "reference"
                else (batch_logprobs(model, b) if need_old else None)
            )
            out.append({"ref": ref, "old": old})
        return out

    def loss(
        model: nn.Module, b: Batch, prep: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        lp = batch_logprobs(model, b)
        w = b["weights"]
        adv = b["advantages"][:, None]
        old = prep["old"] if prep["old"] is not None else lp.detach()
        ratio = torch.exp(lp - old)
        clipped = torch.clamp(ratio, 1 - g.clip_eps, 1 + g.clip_eps)
        per_tok = -torch.minimum(ratio * adv, clipped * adv)
        # A clip is applied where the clipped term is the smaller one: there the token gets
        # no gradient. Where ratio is outside the range but the other side is taken, it does.
        applied = (clipped * adv < ratio * adv).float()
        terms = {"clip_frac": applied}
        if g.kl_coef > 0:
            d = prep["ref"] - lp
            kl = torch.exp(d) - d - 1
            per_tok = per_tok + g.kl_coef * kl
            terms["kl"] = kl.detach()
        if g.loss_type == "sequence":
            per_seq = w / w.sum(-1, keepdim=True).clamp(min=1)
            return (per_tok * per_seq).sum(), {k: (v * per_seq).sum() for k, v in terms.items()}
        return (per_tok * w).sum(), {k: (v * w).sum() for k, v in terms.items()}

    def count(b: Batch) -> float:
        if g.loss_type == "sequence":
            return float((b["weights"].sum(-1) > 0).sum())
        return float(b["weights"].sum())

    return prepare, loss, count


def method(
    cfg: Config,
    tok: ChatTokenizer,
    items: list[grpo_data.Group],
    eval_items: list[grpo_data.Group] | None = None,
    notes: list[str] | None = None,
) -> Method:
    g = cfg.grpo or Grpo()
    prepare, loss, count = make(g)
    return Method(
        name="offline-grpo",
        items=items,
        collate=lambda gs: collate(gs, tok.pad_id),
        loss=loss,
        prepare=prepare,
        needs_reference=g.kl_coef > 0 or g.old_policy == "reference",
        updates_per_batch=g.updates_per_batch,
        count=count,
        shard=make_shard(g),
        eval_items=eval_items or [],
        notes=notes or [],
    )


def policy_update(tr: Trainer, rollouts: list[formats.GroupRow]) -> StepStats:
    """One optimizer step on a global batch of rollouts (every process passes the same list)."""
    from halo.train.loop import loop

    groups = [grpo_data.encode_group(r, tr.tok, tr.cfg.data.max_seq_len) for r in rollouts]
    if any(x is None for x in groups):
        raise HaloError("policy_update: a prompt fills data.max_seq_len")
    return loop.step(tr, tr.method.shard(groups, tr.ctx.rank, tr.ctx.world))


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    g = cfg.grpo or Grpo()
    train, evals = batching.load(cfg.data, cfg.training.seed, grpo_data.parse)
    groups, dropped = grpo_data.encode_all(train, tok, cfg.data.max_seq_len)
    if not groups:
        raise HaloError("data.train: no group has a completion token within data.max_seq_len")
    eval_groups, _ = grpo_data.encode_all(evals, tok, cfg.data.max_seq_len)
    sizes = sorted({len(x.seqs) for x in groups})
    notes = [
        f"offline-grpo: {len(groups)} groups of {'/'.join(map(str, sizes))} completions; "
        f"old policy {g.old_policy}, clip {g.clip_eps}, kl_coef {g.kl_coef}, "
        f"scale_rewards {g.scale_rewards}, loss_type {g.loss_type}",
        *grpo_data.describe(cfg, tok),
    ]
    if dropped:
        notes.append(f"offline-grpo: dropped {dropped} groups whose prompt fills data.max_seq_len")
    return method(cfg, tok, groups, eval_groups, notes)
