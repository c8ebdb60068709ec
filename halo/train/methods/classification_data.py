"""Classification's examples with no torch: (text, label) rows, the label set, the token ids;
and the --dry-run view.

Rows: ``{"text": ..., "label": ...}`` (the columns are ``classification.text_column`` and
``label_column``). A label is a name or an integer id. The label set is
``classification.labels`` (names in id order), or ``classification.num_labels`` integer ids,
or else every label the training data holds, sorted. The text is tokenized as the tokenizer
does by default (``add_special_tokens``), which is what transformers'
``pipeline("text-classification")`` does with the exported model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from halo.errors import HaloError
from halo.train.config import Classification, Config, Data, Source
from halo.train.data import examples
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import rows


@dataclass(frozen=True)
class Row:
    text: str
    label: str | int
    where: str


@dataclass(frozen=True)
class Item:
    input_ids: list[int]
    label: int


def parser(c: Classification) -> examples.Parse[Row]:
    def parse(row: dict[str, Any], fmt: str, src: Source, where: str) -> Row:
        text, label = row.get(c.text_column), row.get(c.label_column)
        if not isinstance(text, str) or not text:
            raise HaloError(f"{where}: {c.text_column}: expected a non-empty string")
        if not isinstance(label, str | int) or isinstance(label, bool):
            raise HaloError(f"{where}: {c.label_column}: expected a label name or integer id")
        return Row(text, label, where)

    return parse


def sources(d: Data) -> Data:
    return rows.in_format(d, "raw")


@dataclass(frozen=True)
class Labels:
    names: list[str]  # in id order: what the exported config's id2label says
    ids: dict[str | int, int]  # a label as the data writes it -> its id

    def id_of(self, row: Row, column: str) -> int:
        if row.label in self.ids:
            return self.ids[row.label]
        shown = ", ".join(self.names[:8]) + (", ..." if len(self.names) > 8 else "")
        raise HaloError(f"{row.where}: {column}: {row.label!r} is not one of the labels ({shown})")


def labels(c: Classification, train: list[Row]) -> Labels:
    """The label set: the config's names or count, or else every label of the training data."""
    if c.labels is not None or c.num_labels is not None:
        names = (
            list(c.labels)
            if c.labels is not None
            else [f"LABEL_{i}" for i in range(c.num_labels or 0)]
        )
        if len(set(names)) != len(names):
            raise HaloError("classification.labels: the names must differ")
        ids: dict[str | int, int] = {i: i for i in range(len(names))}
        return Labels(names, {**ids, **{n: i for i, n in enumerate(names)}})
    found = sorted({r.label for r in train}, key=lambda x: (isinstance(x, str), x))
    if len(found) < 2:
        raise HaloError(
            f"data.train: every row has the label {found[0]!r} in column "
            f"'{c.label_column}': classification needs at least 2 labels"
        )
    plain = found == list(range(len(found)))  # ids already: named as transformers names them
    names = [f"LABEL_{v}" if plain else str(v) for v in found]
    return Labels(names, {v: i for i, v in enumerate(found)})


def token_ids(tok: ChatTokenizer, text: str, max_len: int) -> list[int]:
    return list(tok.hf(text)["input_ids"])[:max_len]


def encode(
    data: list[Row], c: Classification, known: Labels, tok: ChatTokenizer, max_len: int
) -> list[Item]:
    return [Item(token_ids(tok, r.text, max_len), known.id_of(r, c.label_column)) for r in data]


def describe(cfg: Config, tok: ChatTokenizer) -> list[str]:
    """Each source's first example: its tokens as the classifier reads them, and its label."""
    c = cfg.classification or Classification()
    out = []
    for src, row in examples.first_examples(sources(cfg.data), parser(c)):
        ids = token_ids(tok, row.text, cfg.data.max_seq_len)
        out.append(
            f"classification: {src.path.name} example 1 (pooled at its last token, "
            f"{tok.decode(ids[-1:])!r}): {tok.decode(ids)!r} -> {row.label!r}"
        )
    return out
