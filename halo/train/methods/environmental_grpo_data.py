"""environmental-grpo's rows with no torch: each row is what the environment's ``reset(row)``
reads, taken as it is; and the --dry-run view of the first episode's prompt."""

from __future__ import annotations

from typing import Any

from halo.train.config import Config, Data, Source
from halo.train.data import examples
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import environment, rows


def parse(row: dict[str, Any], fmt: str, src: Source, where: str) -> tuple[dict[str, Any], str]:
    return row, where


def sources(d: Data) -> Data:
    return rows.in_format(d, "raw")


def describe(cfg: Config, tok: ChatTokenizer) -> list[str]:
    """Each source's first row as its episode starts: the prompt the model is sent."""
    env = cfg.environment
    if env is None:
        return []
    factory = environment.load(env.path)
    out = []
    for src, (row, where) in examples.first_examples(sources(cfg.data), parse):
        limits = environment.Limits(env.max_turns, env.max_tokens or cfg.data.max_seq_len, 1)
        live = environment.start(factory, env.kwargs, row, where, tok, limits)
        shown = live.episode.error or repr(tok.decode(live.episode.ids))
        out.append(f"environmental-grpo: {src.path.name} row 1, the episode's prompt: {shown}")
    return out
