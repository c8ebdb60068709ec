"""Direct preference optimisation on chosen/rejected pairs, against a frozen reference.

Data: JSONL, one ``{"prompt": "...", "chosen": "...", "rejected": "..."}`` per line
(``prompt`` may also be a list of chat messages). The loss per pair is
``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` with sequence log-probabilities of
the responses, averaged over the pairs of the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from halo.errors import HaloError
from halo.train.config import Config, Dpo
from halo.train.data import Sequence, pad, read_jsonl, shift
from halo.train.loop import Batch, Method
from halo.train.model import token_logprobs
from halo.train.tokenizer import Tokenizer, render_chat


@dataclass(frozen=True)
class Pair:
    chosen: Sequence
    rejected: Sequence


def encode(
    rows: list[dict[str, Any]], tok: Tokenizer, max_len: int, where: str
) -> tuple[list[Pair], int]:
    pairs, dropped = [], 0
    end = tok.special("<|im_end|>")
    for n, row in enumerate(rows, 1):
        prompt = row.get("prompt")
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not isinstance(msgs, list) or not msgs:
            raise HaloError(f"{where}:{n}: expected 'prompt' as a string or a list of messages")
        if not (isinstance(row.get("chosen"), str) and isinstance(row.get("rejected"), str)):
            raise HaloError(f"{where}:{n}: expected string 'chosen' and 'rejected'")
        ids, _ = render_chat(tok, msgs, where=f"{where}:{n}: prompt")
        head = [*ids, tok.special("<|im_start|>"), *tok.encode("assistant\n")]
        seqs = []
        for key in ("chosen", "rejected"):
            body = [*tok.encode(row[key]), end]
            seqs.append(shift([*head, *body], [False] * len(head) + [True] * len(body)))
        if len(head) + max(len(s.input_ids) for s in seqs) - len(head) > max_len:
            dropped += 1
            continue
        pairs.append(Pair(*seqs))
    return pairs, dropped


def collate(pairs: list[Pair], pad_id: int) -> Batch:
    # Chosen first, rejected second: rows i and i + n are one pair.
    batch = pad([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id)
    batch["pairs"] = torch.ones(len(pairs))
    return batch


def sequence_logprobs(model: nn.Module, b: Batch) -> torch.Tensor:
    return (token_logprobs(model(b["input_ids"]), b["targets"]) * b["weights"]).sum(-1)


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
        return -functional.logsigmoid(margin).sum(), {"reward_acc": (margin > 0).float().sum()}

    return prepare, loss


def build(cfg: Config, tok: Tokenizer) -> Method:
    d = cfg.dpo or Dpo()
    path = cfg.data.train
    pairs, dropped = encode(read_jsonl(path), tok, cfg.data.max_seq_len, str(path))
    if not pairs:
        raise HaloError(f"{path}: no pair fits within data.max_seq_len")
    prepare, loss = make(d)
    notes = [f"preference/dpo: {len(pairs)} pairs, beta {d.beta}"]
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
        notes=notes,
    )
