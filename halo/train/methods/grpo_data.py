"""GRPO's examples with no torch: groups parsed, each completion rendered after its prompt and
tokenized (trained on: the completion) as plain lists; and the --dry-run view of that mask.

Online GRPO's rollouts come back as the same ``Group``s (halo.train.methods.online_grpo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from halo.errors import HaloError
from halo.train.config import Config, Source
from halo.train.data import examples, formats
from halo.train.data.tokenizer import ChatTokenizer, Rendered, mask_note


@dataclass(frozen=True)
class Group:
    seqs: tuple[examples.Sequence, ...]
    rewards: tuple[float, ...]


def parse(row: dict[str, Any], fmt: str, src: Source, where: str) -> tuple[formats.GroupRow, str]:
    if fmt != "grpo":
        raise HaloError(f"{where}: offline-grpo needs prompt/completions rows, got {fmt}")
    return formats.group(row, where), where


def render(tok: ChatTokenizer, row: formats.GroupRow, text: str, where: str = "") -> Rendered:
    """The prompt and one completion; trained on: the completion's assistant span."""
    msgs = [*row.prompt, {"role": "assistant", "content": text}]
    try:
        return tok.render(msgs, row.tools, train_from=len(row.prompt))
    except HaloError as exc:
        raise HaloError(f"{where}: {exc.message}" if where else exc.message) from None


def encode_group(
    row: formats.GroupRow, tok: ChatTokenizer, max_len: int, where: str = ""
) -> Group | None:
    """Token sequences of a group (None when the prompt alone fills max_len)."""
    seqs = []
    for text in row.completions:
        r = render(tok, row, text, where)
        if not any(r.train[1 : max_len + 1]):
            return None
        seqs.append(examples.shift(r.ids[: max_len + 1], r.train[: max_len + 1]))
    return Group(tuple(seqs), tuple(row.rewards))


def encode_all(
    rows: list[tuple[formats.GroupRow, str]], tok: ChatTokenizer, max_len: int
) -> tuple[list[Group], int]:
    groups = [encode_group(row, tok, max_len, where) for row, where in rows]
    kept = [x for x in groups if x is not None]
    return kept, len(groups) - len(kept)


def describe(cfg: Config, tok: ChatTokenizer) -> list[str]:
    return [
        mask_note(
            f"offline-grpo: completion 1 of {src.path.name}",
            tok.show_mask(render(tok, row, row.completions[0], where)),
        )
        for src, (row, where) in examples.first_examples(cfg.data, parse)
    ]
