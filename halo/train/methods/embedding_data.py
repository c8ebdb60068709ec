"""Embedding's examples with no torch: (query, positive, hard negatives) rows as token ids;
and the --dry-run view.

Rows: ``{"query": ..., "positive": ..., "negatives": [...]}`` (the columns are
``embedding.query_column``, ``positive_column`` and ``negatives_column``; negatives are
optional). Each text is tokenized as the tokenizer does by default and ends with the
end-of-text token, where ``pooling: last`` reads the embedding; longer texts are cut before it.
``embedding.hard_negatives`` of each row's negatives are used (unset: as many as every
training row has).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from halo.errors import HaloError
from halo.train.config import Config, Data, Embedding, Source
from halo.train.data import examples
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import rows


@dataclass(frozen=True)
class Row:
    query: str
    positive: str
    negatives: tuple[str, ...]
    where: str


@dataclass(frozen=True)
class Item:
    query: list[int]
    positive: list[int]
    negatives: tuple[list[int], ...]


def _text(row: dict[str, Any], column: str, where: str) -> str:
    value = row.get(column)
    if not isinstance(value, str) or not value:
        raise HaloError(f"{where}: {column}: expected a non-empty string")
    return value


def parser(e: Embedding) -> examples.Parse[Row]:
    def parse(row: dict[str, Any], fmt: str, src: Source, where: str) -> Row:
        negatives = row.get(e.negatives_column) or []
        if not isinstance(negatives, list) or not all(isinstance(x, str) and x for x in negatives):
            raise HaloError(f"{where}: {e.negatives_column}: expected a list of non-empty strings")
        return Row(
            _text(row, e.query_column, where),
            _text(row, e.positive_column, where),
            tuple(negatives),
            where,
        )

    return parse


def sources(d: Data) -> Data:
    return rows.in_format(d, "raw")


def hard_negatives(e: Embedding, train: list[Row]) -> int:
    if e.hard_negatives is None:
        return min(len(r.negatives) for r in train)
    short = next((r for r in train if len(r.negatives) < e.hard_negatives), None)
    if short is not None:
        raise HaloError(
            f"{short.where}: {e.negatives_column}: {len(short.negatives)} negatives, "
            f"embedding.hard_negatives asks for {e.hard_negatives}"
        )
    return e.hard_negatives


def token_ids(tok: ChatTokenizer, text: str, max_len: int) -> list[int]:
    return [*list(tok.hf(text)["input_ids"])[: max_len - 1], tok.eos_id]


def encode(data: list[Row], k: int, tok: ChatTokenizer, max_len: int) -> list[Item]:
    return [
        Item(
            token_ids(tok, r.query, max_len),
            token_ids(tok, r.positive, max_len),
            tuple(token_ids(tok, x, max_len) for x in r.negatives[:k]),
        )
        for r in data
    ]


def describe(cfg: Config, tok: ChatTokenizer) -> list[str]:
    e = cfg.embedding or Embedding()
    out = []
    for src, row in examples.first_examples(sources(cfg.data), parser(e)):
        shown = [
            tok.decode(token_ids(tok, t, cfg.data.max_seq_len)) for t in (row.query, row.positive)
        ]
        out.append(
            f"embedding: {src.path.name} example 1 ({e.pooling} pooling): query {shown[0]!r}, "
            f"positive {shown[1]!r}, {len(row.negatives)} negatives"
        )
    return out
