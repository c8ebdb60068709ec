"""The preference family's examples (DPO, SimPO, SMPO) with no torch: preference rows parsed,
chosen and rejected rendered and tokenized (trained on: the response after the prompt) as plain
lists; and the --dry-run view."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from halo.errors import HaloError
from halo.train.config import Config, Data, Source
from halo.train.data import examples, formats
from halo.train.data.tokenizer import ChatTokenizer, Rendered, mask_note
from halo.train.methods import rows


@dataclass(frozen=True)
class Pair:
    chosen: examples.Sequence
    rejected: examples.Sequence


def parse(row: dict[str, Any], fmt: str, src: Source, where: str) -> tuple[formats.PairRow, str]:
    if fmt != "preference":
        raise HaloError(f"{where}: a preference method needs chosen/rejected rows, got {fmt}")
    return formats.pair(row, where), where


def renders(tok: ChatTokenizer, row: formats.PairRow, where: str) -> tuple[Rendered, Rendered]:
    try:
        return tuple(  # type: ignore[return-value]
            tok.render(row.prompt + answer, row.tools, train_from=len(row.prompt))
            for answer in (row.chosen, row.rejected)
        )
    except HaloError as exc:
        raise HaloError(f"{where}: {exc.message}") from None


def encode(
    rows: list[tuple[formats.PairRow, str]], tok: ChatTokenizer, max_len: int
) -> tuple[list[Pair], int]:
    pairs, dropped = [], 0
    for row, where in rows:
        c, r = renders(tok, row, where)
        if max(len(c.ids), len(r.ids)) > max_len + 1:
            dropped += 1
            continue
        pairs.append(Pair(examples.shift(c.ids, c.train), examples.shift(r.ids, r.train)))
    return pairs, dropped


def sources(d: Data) -> Data:
    """The run's sources, each read as preference rows."""
    return rows.in_format(d, "preference")


def describe(cfg: Config, tok: ChatTokenizer) -> list[str]:
    return [
        mask_note(
            f"preference: chosen of {src.path.name}", tok.show_mask(renders(tok, row, where)[0])
        )
        for src, (row, where) in examples.first_examples(sources(cfg.data), parse)
    ]
