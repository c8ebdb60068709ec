"""Offline GRPO: group-relative advantages over pre-generated completions with rewards.

Data: JSONL, one group per line::

    {"prompt": "What is 2+3?", "completions": [{"text": "5", "reward": 1.0}, ...]}

(``prompt`` may also be a list of chat messages). Each completion's advantage is its reward
minus the group mean, divided by the group's (population) standard deviation. The loss per
completion token is the clipped surrogate ``-min(r*A, clip(r, 1-eps, 1+eps)*A)`` with
``r = pi(token) / pi_old(token)``, plus ``kl_coef`` times the k3 estimate of KL to the frozen
reference, averaged over all completion tokens of the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from halo.errors import HaloError
from halo.train.config import Config, Grpo
from halo.train.data import Sequence, pad, read_jsonl, shift
from halo.train.loop import Batch, Method
from halo.train.model import token_logprobs
from halo.train.tokenizer import Tokenizer, render_chat


@dataclass(frozen=True)
class Group:
    seqs: tuple[Sequence, ...]
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]


def advantages(rewards: list[float], eps: float) -> list[float]:
    n = len(rewards)
    mean = sum(rewards) / n
    std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
    return [(r - mean) / (std + eps) for r in rewards]


def encode(
    rows: list[dict[str, Any]], tok: Tokenizer, cfg: Config, where: str
) -> tuple[list[Group], int]:
    g: Grpo = cfg.grpo or Grpo()
    groups, dropped = [], 0
    end = tok.special("<|im_end|>")
    for n, row in enumerate(rows, 1):
        prompt, comps = row.get("prompt"), row.get("completions")
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not isinstance(msgs, list) or not msgs:
            raise HaloError(f"{where}:{n}: expected 'prompt' as a string or a list of messages")
        if not isinstance(comps, list) or len(comps) < 2:
            raise HaloError(f"{where}:{n}: expected 'completions' as a list of at least 2")
        ids, _ = render_chat(tok, msgs, where=f"{where}:{n}: prompt")
        head = [*ids, tok.special("<|im_start|>"), *tok.encode("assistant\n")]
        seqs, rewards = [], []
        for k, c in enumerate(comps):
            if not (
                isinstance(c, dict)
                and isinstance(c.get("text"), str)
                and isinstance(c.get("reward"), int | float)
            ):
                raise HaloError(
                    f"{where}:{n}: completions[{k}]: expected {{'text': str, 'reward': number}}"
                )
            body = [*tok.encode(c["text"]), end]
            full = head + body
            train = [False] * len(head) + [True] * len(body)
            seqs.append(shift(full[: cfg.data.max_seq_len + 1], train[: cfg.data.max_seq_len + 1]))
            rewards.append(float(c["reward"]))
        if len(head) >= cfg.data.max_seq_len:
            dropped += 1
            continue
        groups.append(Group(tuple(seqs), tuple(rewards), tuple(advantages(rewards, g.adv_eps))))
    return groups, dropped


def collate(groups: list[Group], pad_id: int) -> Batch:
    seqs = [s for grp in groups for s in grp.seqs]
    batch = pad(seqs, pad_id)
    batch["advantages"] = torch.tensor([a for grp in groups for a in grp.advantages])
    return batch


def make(g: Grpo) -> tuple[Any, Any]:
    need_ref = g.kl_coef > 0 or g.old_policy == "reference"

    def prepare(model: nn.Module, reference: nn.Module | None, batches: list[Batch]) -> list[Any]:
        out = []
        for b in batches:
            ref = token_logprobs(reference(b["input_ids"]), b["targets"]) if need_ref else None
            old = (
                ref
                if g.old_policy == "reference"
                else token_logprobs(model(b["input_ids"]), b["targets"])
            )
            out.append({"ref": ref, "old": old})
        return out

    def loss(
        model: nn.Module, b: Batch, prep: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        lp = token_logprobs(model(b["input_ids"]), b["targets"])
        w = b["weights"]
        adv = b["advantages"][:, None]
        ratio = torch.exp(lp - prep["old"])
        clipped = torch.clamp(ratio, 1 - g.clip_eps, 1 + g.clip_eps)
        per_tok = -torch.minimum(ratio * adv, clipped * adv)
        extra = {"clip_frac": (((ratio - clipped).abs() > 0).float() * w).sum()}
        if g.kl_coef > 0:
            d = prep["ref"] - lp
            kl = torch.exp(d) - d - 1
            per_tok = per_tok + g.kl_coef * kl
            extra["kl"] = (kl * w).sum()
        return (per_tok * w).sum(), extra

    return prepare, loss


def build(cfg: Config, tok: Tokenizer) -> Method:
    g = cfg.grpo or Grpo()
    path = cfg.data.train
    groups, dropped = encode(read_jsonl(path), tok, cfg, str(path))
    if not groups:
        raise HaloError(f"{path}: no group has a prompt shorter than data.max_seq_len")
    prepare, loss = make(g)
    sizes = sorted({len(x.seqs) for x in groups})
    notes = [
        f"offline-grpo: {len(groups)} groups of {'/'.join(map(str, sizes))} completions; "
        f"old policy {g.old_policy}, clip {g.clip_eps}, kl_coef {g.kl_coef}"
    ]
    if dropped:
        notes.append(f"offline-grpo: dropped {dropped} groups whose prompt fills data.max_seq_len")
    return Method(
        name="offline-grpo",
        items=groups,
        collate=lambda gs: collate(gs, tok.pad_id),
        loss=loss,
        prepare=prepare,
        needs_reference=g.kl_coef > 0 or g.old_policy == "reference",
        updates_per_batch=g.updates_per_batch,
        notes=notes,
    )
