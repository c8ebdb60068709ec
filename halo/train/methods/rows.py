"""Data sources read in one format whatever keys their rows have (no torch here).

A method that takes one kind of row reads every source whose format is ``auto`` in that
format: a row missing a column is then that column's error (``file:3: rejected: ...``), not a
guess at some other format.
"""

from __future__ import annotations

from halo.train.config import Data, Source


def in_format(d: Data, fmt: str) -> Data:
    def fix(sources: list[Source]) -> list[Source] | None:
        out = [s.model_copy(update={"format": fmt}) if s.format == "auto" else s for s in sources]
        return out or None

    return d.model_copy(update={"train": fix(d.sources("train")), "eval": fix(d.sources("eval"))})
