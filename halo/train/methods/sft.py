"""Supervised fine-tuning on chat data; the loss covers the assistant turns only.

Data: OpenAI messages, ShareGPT or prompt/completion rows (halo.train.data.formats), JSONL or
Parquet, one or several sources. The chat template renders each example and marks its
assistant spans (halo.train.methods.sft_data, no torch there: --dry-run shows it on a login
node); with ``data.packing`` each micro-batch is one padding-free row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from halo.errors import HaloError
from halo.train.config import Config
from halo.train.data import batching
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import sft_data
from halo.train.models.hf import batch_logprobs
from halo.train.state import Batch, Method


def loss(
    model: nn.Module, batch: Batch, prepared: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    lp = batch_logprobs(model, batch)
    return -(lp * batch["weights"]).sum(), {}


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    train, evals = batching.load(cfg.data, cfg.training.seed, sft_data.parse)
    items, dropped = sft_data.encode(train, tok, cfg.data.max_seq_len)
    if not items:
        raise HaloError("data.train: no example has an assistant token within data.max_seq_len")
    eval_items, _ = sft_data.encode(evals, tok, cfg.data.max_seq_len)
    notes = sft_data.describe(cfg, tok)
    if dropped:
        notes.append(
            f"sft: dropped {dropped} examples with no assistant token within data.max_seq_len"
        )
    if eval_items:
        notes.append(f"sft: {len(eval_items)} eval examples")
    collate = batching.pack if cfg.data.packing else (lambda seqs: batching.pad(seqs, tok.pad_id))
    return Method(
        name="sft", items=items, collate=collate, loss=loss, eval_items=eval_items, notes=notes
    )
