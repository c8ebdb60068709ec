"""Supervised fine-tuning on chat data; the loss covers assistant tokens only.

Data: JSONL, one ``{"messages": [{"role": "user", "content": "..."}, ...]}`` per line.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from halo.errors import HaloError
from halo.train.config import Config
from halo.train.data import Sequence, pad, read_jsonl, shift
from halo.train.loop import Batch, Method
from halo.train.model import token_logprobs
from halo.train.tokenizer import Tokenizer, render_chat, show_mask


def encode(
    rows: list[dict[str, Any]], tok: Tokenizer, max_len: int, where: str
) -> tuple[list[Sequence], int]:
    """Sequences to train on and how many rows were dropped (no assistant token left)."""
    out, dropped = [], 0
    for n, row in enumerate(rows, 1):
        msgs = row.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise HaloError(f"{where}:{n}: expected a non-empty 'messages' list")
        ids, train = render_chat(tok, msgs, where=f"{where}:{n}: messages")
        ids, train = ids[: max_len + 1], train[: max_len + 1]
        if not any(train[1:]):
            dropped += 1
            continue
        out.append(shift(ids, train))
    return out, dropped


def loss(
    model: nn.Module, batch: Batch, prepared: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    lp = token_logprobs(model(batch["input_ids"]), batch["targets"])
    return -(lp * batch["weights"]).sum(), {}


def build(cfg: Config, tok: Tokenizer) -> Method:
    path = cfg.data.train
    rows = read_jsonl(path)
    items, dropped = encode(rows, tok, cfg.data.max_seq_len, str(path))
    if not items:
        raise HaloError(f"{path}: no example has an assistant token within data.max_seq_len")
    first = rows[0]["messages"]
    ids, train = render_chat(tok, first)
    notes = [
        f"sft: loss mask of example 1 (trained-on text in [[...]]): {show_mask(tok, ids, train)!r}"
    ]
    if dropped:
        notes.append(
            f"sft: dropped {dropped} examples with no assistant token within data.max_seq_len"
        )
    return Method(
        name="sft",
        items=items,
        collate=lambda seqs: pad(seqs, tok.pad_id),
        loss=loss,
        notes=notes,
    )
