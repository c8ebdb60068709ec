"""Direct preference optimisation on chosen/rejected pairs, against a frozen reference.

Data: ``{"prompt": ..., "chosen": ..., "rejected": ...}`` with strings or message lists, or
full chosen/rejected conversations (halo.train.formats). The loss per pair is
``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` with sequence log-probabilities
of the responses (the assistant span after the prompt), averaged over the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from halo.errors import HaloError
from halo.train import data, formats
from halo.train.config import Config, Dpo, Source
from halo.train.model import batch_logprobs
from halo.train.state import Batch, Method
from halo.train.tokenizer import ChatTokenizer, Rendered, mask_note


@dataclass(frozen=True)
class Pair:
    chosen: data.Sequence
    rejected: data.Sequence


def parse(row: dict[str, Any], fmt: str, src: Source, where: str) -> tuple[formats.PairRow, str]:
    if fmt != "preference":
        raise HaloError(f"{where}: preference/dpo needs chosen/rejected rows, got {fmt}")
    return formats.pair(row, where), where


def renders(tok: ChatTokenizer, row: formats.PairRow, where: str) -> tuple[Rendered, Rendered]:
    try:
        return tuple(  # type: ignore[return-value]
            tok.render(row.prompt + answer, row.tools, train_from=len(row.prompt))
            for answer in (row.chosen, row.rejected)
        )
    except HaloError as exc:
        raise HaloError(f"{where}: {exc.message}") from None


def encode(
    rows: list[tuple[formats.PairRow, str]], tok: ChatTokenizer, max_len: int
) -> tuple[list[Pair], int]:
    pairs, dropped = [], 0
    for row, where in rows:
        c, r = renders(tok, row, where)
        if max(len(c.ids), len(r.ids)) > max_len + 1:
            dropped += 1
            continue
        pairs.append(Pair(data.shift(c.ids, c.train), data.shift(r.ids, r.train)))
    return pairs, dropped


def collate(pairs: list[Pair], pad_id: int) -> Batch:
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


def describe(cfg: Config, tok: ChatTokenizer) -> list[str]:
    return [
        mask_note(
            f"preference/dpo: chosen of {src.path.name}", tok.show_mask(renders(tok, row, where)[0])
        )
        for src, (row, where) in data.first_examples(cfg.data, parse)
    ]


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    d = cfg.dpo or Dpo()
    train, evals = data.load(cfg.data, cfg.training.seed, parse)
    pairs, dropped = encode(train, tok, cfg.data.max_seq_len)
    if not pairs:
        raise HaloError("data.train: no pair fits within data.max_seq_len")
    eval_pairs, _ = encode(evals, tok, cfg.data.max_seq_len)
    prepare, loss = make(d)
    notes = [f"preference/dpo: {len(pairs)} pairs, beta {d.beta}", *describe(cfg, tok)]
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
