"""Data files in, examples out; the batch order as a pure function of (seed, epoch, step).

Files are JSONL or Parquet; several sources are concatenated or interleaved by probability;
an eval set is a file of its own or a held-out fraction. Every process computes the same
global batch and takes its contiguous share, so one process and N processes see exactly the
same global batches (the loss is normalised globally).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from halo import schema
from halo.errors import HaloError
from halo.train import formats
from halo.train.config import Data, Source

T = TypeVar("T")
# (row, format, source, "file:line") -> one example
Parse = Callable[[dict[str, Any], str, Source, str], T]


@dataclass(frozen=True)
class Row:
    data: dict[str, Any]
    where: str  # "file:line" or "file: row N", for error messages


def read_rows(path: Path) -> list[Row]:
    """Rows of a JSONL or Parquet file; a bad line or non-UTF-8 byte is one error line."""
    if path.suffix == ".parquet":
        return _read_parquet(path)
    rows = []
    for n, line in enumerate(schema.read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise HaloError(f"{path}:{n}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise HaloError(f"{path}:{n}: expected a JSON object per line")
        rows.append(Row(row, f"{path}:{n}"))
    if not rows:
        raise HaloError(f"{path}: no examples")
    return rows


def _read_parquet(path: Path) -> list[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise HaloError(f"{path}: not a readable Parquet file ({exc})") from None
    rows = [Row(r, f"{path}: row {n}") for n, r in enumerate(table.to_pylist(), 1)]
    if not rows:
        raise HaloError(f"{path}: no examples")
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


def interleave(sources: list[list[T]], probs: list[float], seed: int) -> list[T]:
    """Draw the next example's source by probability until one source runs out."""
    rng = random.Random(seed)
    pos = [0] * len(sources)
    out: list[T] = []
    while True:
        k = rng.choices(range(len(sources)), weights=probs)[0]
        if pos[k] == len(sources[k]):
            return out
        out.append(sources[k][pos[k]])
        pos[k] += 1


def load(data: Data, seed: int, parse: Parse[T]) -> tuple[list[T], list[T]]:
    """(train, eval) examples for one method's ``parse``."""
    per_source = [source_examples(s, parse) for s in data.sources("train")]
    if data.mix == "interleave":
        train = interleave(per_source, [s.probability or 0.0 for s in data.sources()], seed)
    else:
        train = [x for ex in per_source for x in ex]
    evals = [x for s in data.sources("eval") for x in source_examples(s, parse)]
    if data.eval_fraction:
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
        held = set(order[: max(1, round(len(train) * data.eval_fraction))])
        evals = [x for i, x in enumerate(train) if i in held]
        train = [x for i, x in enumerate(train) if i not in held]
    return train, evals


@dataclass(frozen=True)
class Sequence:
    """One training sequence: inputs and next-token targets, and a weight per target."""

    input_ids: list[int]
    targets: list[int]
    weights: list[float]


def shift(ids: list[int], train: list[bool]) -> Sequence:
    """Predict token t+1 from tokens <= t; the target's own mask says whether it is trained on."""
    return Sequence(ids[:-1], ids[1:], [1.0 if t else 0.0 for t in train[1:]])


def pad(seqs: list[Sequence], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence: (B, T) input_ids, targets, weights, attention_mask."""
    t = max(len(s.input_ids) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    tgt = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    w = torch.zeros((len(seqs), t), dtype=torch.float32)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for i, s in enumerate(seqs):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        tgt[i, :n] = torch.tensor(s.targets)
        w[i, :n] = torch.tensor(s.weights)
        mask[i, :n] = 1
    return {"input_ids": ids, "targets": tgt, "weights": w, "attention_mask": mask}


def pack(seqs: list[Sequence]) -> dict[str, torch.Tensor]:
    """All sequences as one row, no padding; position_ids restart at each sequence.

    transformers reads the restarts as sequence borders (a block-diagonal causal mask for
    SDPA, varlen kernels for flash attention), so no token attends across examples.
    """
    ids = [t for s in seqs for t in s.input_ids]
    return {
        "input_ids": torch.tensor([ids]),
        "targets": torch.tensor([[t for s in seqs for t in s.targets]]),
        "weights": torch.tensor([[w for s in seqs for w in s.weights]]),
        "position_ids": torch.tensor([[p for s in seqs for p in range(len(s.input_ids))]]),
    }


@dataclass(frozen=True)
class Schedule:
    """Which items make up each global batch, and each process's share of it."""

    n_items: int
    global_batch: int
    seed: int
    epochs: int
    max_steps: int | None

    def __post_init__(self) -> None:
        if self.n_items < self.global_batch:
            raise HaloError(
                f"training.global_batch_size: {self.global_batch} is larger than the "
                f"{self.n_items} training examples"
            )

    @property
    def steps_per_epoch(self) -> int:
        # The last partial batch is dropped: every step has the same global batch size.
        return self.n_items // self.global_batch

    @property
    def total_steps(self) -> int:
        total = self.steps_per_epoch * self.epochs
        return min(total, self.max_steps) if self.max_steps else total

    def order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n_items, generator=g).tolist()

    def epoch_of(self, step: int) -> int:
        """Epoch of the 0-based step."""
        return step // self.steps_per_epoch

    def global_batch_of(self, step: int) -> list[int]:
        epoch, i = divmod(step, self.steps_per_epoch)
        return self.order(epoch)[i * self.global_batch : (i + 1) * self.global_batch]

    def batch(self, step: int, rank: int = 0, world: int = 1) -> list[int]:
        """Item indices of 0-based ``step`` for process ``rank`` of ``world``."""
        return share(self.global_batch_of(step), rank, world)


def share(items: list[T], rank: int, world: int) -> list[T]:
    """Process ``rank``'s contiguous share of a global batch."""
    n = len(items) // world
    return items[rank * n : (rank + 1) * n]
