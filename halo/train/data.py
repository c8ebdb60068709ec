"""JSONL in, token sequences out; the batch order as a pure function of (seed, epoch, step).

Every process computes the same global batch and takes its contiguous share, so one process
and N processes see exactly the same global batches (the loss is normalised globally).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from halo.errors import HaloError


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise HaloError(f"{path}: cannot read data ({exc.strerror})") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise HaloError(f"{path}:{n}: not valid JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise HaloError(f"{path}:{n}: expected a JSON object per line")
        rows.append(row)
    if not rows:
        raise HaloError(f"{path}: no examples")
    return rows


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
    """Right-pad to the longest sequence: (B, T) input_ids, targets, weights."""
    t = max(len(s.input_ids) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    tgt = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    w = torch.zeros((len(seqs), t), dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        tgt[i, :n] = torch.tensor(s.targets)
        w[i, :n] = torch.tensor(s.weights)
    return {"input_ids": ids, "targets": tgt, "weights": w}


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

    def batch(self, step: int, rank: int = 0, world: int = 1) -> list[int]:
        """Item indices of 0-based ``step`` for process ``rank`` of ``world``."""
        epoch, i = divmod(step, self.steps_per_epoch)
        idx = self.order(epoch)[i * self.global_batch : (i + 1) * self.global_batch]
        share = self.global_batch // world
        return idx[rank * share : (rank + 1) * share]
