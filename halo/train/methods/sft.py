"""Supervised fine-tuning on chat data; the loss covers the assistant turns only.

Data: OpenAI messages, ShareGPT or prompt/completion rows (halo.train.formats), JSONL or
Parquet, one or several sources. The chat template renders each example and marks its
assistant spans; with ``data.packing`` each micro-batch is one padding-free row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from halo.errors import HaloError
from halo.train import data, formats
from halo.train.config import Config, Source
from halo.train.model import batch_logprobs
from halo.train.state import Batch, Method
from halo.train.tokenizer import ChatTokenizer, mask_note


def parse(row: dict[str, Any], fmt: str, src: Source, where: str) -> formats.Chat:
    return formats.chat(row, fmt, where, src.columns, src.tags)


def render(tok: ChatTokenizer, chat: formats.Chat) -> Any:
    try:
        return tok.render(chat.messages, chat.tools, chat.train_from)
    except HaloError as exc:
        raise HaloError(f"{chat.where}: {exc.message}") from None


def encode(
    chats: list[formats.Chat], tok: ChatTokenizer, max_len: int
) -> tuple[list[data.Sequence], int]:
    """Sequences to train on and how many were dropped (no assistant token within max_len)."""
    out, dropped = [], 0
    for chat in chats:
        r = render(tok, chat)
        ids, train = r.ids[: max_len + 1], r.train[: max_len + 1]
        if not any(train[1:]):
            dropped += 1
            continue
        out.append(data.shift(ids, train))
    return out, dropped


def loss(
    model: nn.Module, batch: Batch, prepared: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    lp = batch_logprobs(model, batch)
    return -(lp * batch["weights"]).sum(), {}


def describe(cfg: Config, tok: ChatTokenizer) -> list[str]:
    """The loss mask of the first example of each source (trained-on text in [[...]])."""
    return [
        mask_note(f"sft: loss mask of {src.path.name}", tok.show_mask(render(tok, chat)))
        for src, chat in data.first_examples(cfg.data, parse)
    ]


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    train, evals = data.load(cfg.data, cfg.training.seed, parse)
    items, dropped = encode(train, tok, cfg.data.max_seq_len)
    if not items:
        raise HaloError("data.train: no example has an assistant token within data.max_seq_len")
    eval_items, _ = encode(evals, tok, cfg.data.max_seq_len)
    notes = describe(cfg, tok)
    if dropped:
        notes.append(
            f"sft: dropped {dropped} examples with no assistant token within data.max_seq_len"
        )
    if eval_items:
        notes.append(f"sft: {len(eval_items)} eval examples")
    collate = data.pack if cfg.data.packing else (lambda seqs: data.pad(seqs, tok.pad_id))
    return Method(
        name="sft", items=items, collate=collate, loss=loss, eval_items=eval_items, notes=notes
    )
