"""SFT's examples with no torch: chats parsed, rendered by the chat template, tokenized with
their loss mask (the assistant turns) as plain lists; and the --dry-run view of that mask."""

from __future__ import annotations

from typing import Any

from halo.errors import HaloError
from halo.train.config import Config, Source
from halo.train.data import examples, formats
from halo.train.data.tokenizer import ChatTokenizer, Rendered, mask_note


def parse(row: dict[str, Any], fmt: str, src: Source, where: str) -> formats.Chat:
    return formats.chat(row, fmt, where, src.columns, src.tags)


def render(tok: ChatTokenizer, chat: formats.Chat) -> Rendered:
    try:
        return tok.render(chat.messages, chat.tools, chat.train_from)
    except HaloError as exc:
        raise HaloError(f"{chat.where}: {exc.message}") from None


def encode(
    chats: list[formats.Chat], tok: ChatTokenizer, max_len: int
) -> tuple[list[examples.Sequence], int]:
    """Sequences to train on and how many were dropped (no assistant token within max_len)."""
    out, dropped = [], 0
    for chat in chats:
        r = render(tok, chat)
        ids, train = r.ids[: max_len + 1], r.train[: max_len + 1]
        if not any(train[1:]):
            dropped += 1
            continue
        out.append(examples.shift(ids, train))
    return out, dropped


def describe(cfg: Config, tok: ChatTokenizer) -> list[str]:
    """The loss mask of the first example of each source (trained-on text in [[...]])."""
    return [
        mask_note(f"sft: loss mask of {src.path.name}", tok.show_mask(render(tok, chat)))
        for src, chat in examples.first_examples(cfg.data, parse)
    ]
