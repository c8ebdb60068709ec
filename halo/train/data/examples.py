"""Data files in, examples out, with no torch: what training and the --dry-run view read.

Files are JSONL or Parquet; a method's ``parse`` turns each row into one example. A rendered,
tokenized example becomes a ``Sequence`` of plain lists (inputs, next-token targets, a loss
weight per target); halo.train.data.batching mixes them into a training set and makes the tensors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from halo import schema
from halo.errors import HaloError
from halo.train.config import Data, Source
from halo.train.data import formats, s3data

T = TypeVar("T")
# (row, format, source, "file:line") -> one example
Parse = Callable[[dict[str, Any], str, Source, str], T]


@dataclass(frozen=True)
class Row:
    data: dict[str, Any]
    where: str  # "file:line" or "file: row N", for error messages


def read_rows(path: Path | str) -> list[Row]:
    """Rows of a JSONL or Parquet file; a bad line or non-UTF-8 byte is one error line.

    An s3:// source (halo.train.data.s3data) is read from its verified cached copy, its shards in
    key order; errors name the object's URL, not the cache."""
    if s3data.is_s3(path):
        return [
            row for url, local in s3data.local_files(str(path)) for row in _read_file(local, url)
        ]
    return _read_file(Path(path), str(path))


def _read_file(path: Path, shown: str) -> list[Row]:
    if path.suffix == ".parquet":
        return _read_parquet(path, shown)
    rows = []
    for n, line in enumerate(schema.read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise HaloError(f"{shown}:{n}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise HaloError(f"{shown}:{n}: expected a JSON object per line")
        rows.append(Row(row, f"{shown}:{n}"))
    if not rows:
        raise HaloError(f"{shown}: no examples")
    return rows


def _read_parquet(path: Path, shown: str) -> list[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise HaloError(f"{shown}: not a readable Parquet file ({exc})") from None
    rows = [Row(r, f"{shown}: row {n}") for n, r in enumerate(table.to_pylist(), 1)]
    if not rows:
        raise HaloError(f"{shown}: no examples")
    return rows


def _format(src: Source, row: Row) -> str:
    if src.format != "auto":
        return src.format
    try:
        return formats.detect(row.data, src.columns)
    except HaloError as exc:
        raise HaloError(f"{row.where}: {exc.message}") from None


def source_examples(src: Source, parse: Parse[T], limit: int | None = None) -> list[T]:
    """Every row of one source (or the first ``limit``) through ``parse``."""
    rows = read_rows(src.path)[:limit]
    return [parse(row.data, _format(src, row), src, row.where) for row in rows]


def first_examples(data: Data, parse: Parse[T]) -> list[tuple[Source, T]]:
    """The first example of each training source: what the log and --dry-run show."""
    return [(s, source_examples(s, parse, limit=1)[0]) for s in data.sources()]


@dataclass(frozen=True)
class Sequence:
    """One training sequence: inputs and next-token targets, and a weight per target."""

    input_ids: list[int]
    targets: list[int]
    weights: list[float]


def shift(ids: list[int], train: list[bool]) -> Sequence:
    """Predict token t+1 from tokens <= t; the target's own mask says whether it is trained on."""
    return Sequence(ids[:-1], ids[1:], [1.0 if t else 0.0 for t in train[1:]])
