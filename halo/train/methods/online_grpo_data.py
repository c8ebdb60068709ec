"""Online GRPO's prompts with no torch: rows parsed, each prompt rendered as the rollout server
is sent it; and the --dry-run view of the first one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from halo.errors import HaloError
from halo.train.config import Config, Source
from halo.train.data import examples, formats
from halo.train.data.tokenizer import ChatTokenizer, Message


@dataclass(frozen=True)
class Prompt:
    messages: list[Message]
    row: dict[str, Any]
    where: str


def parse(row: dict[str, Any], fmt: str, src: Source, where: str) -> Prompt:
    if "prompt" not in row:
        raise HaloError(f"{where}: online-grpo needs a 'prompt' (a string or messages) per row")
    return Prompt(formats.prompt_messages(row["prompt"], f"{where}: prompt"), row, where)


def text(tok: ChatTokenizer, p: Prompt) -> str:
    """The prompt as the server is sent it: the chat template's rendering, ready to generate."""
    return tok.text(p.messages, gen=True)


def describe(cfg: Config, tok: ChatTokenizer) -> list[str]:
    """What --dry-run shows: each source's first prompt as the server will be sent it."""
    return [
        f"online-grpo: prompt 1 of {src.path.name}: {text(tok, p)!r}"
        for src, p in examples.first_examples(cfg.data, parse)
    ]
