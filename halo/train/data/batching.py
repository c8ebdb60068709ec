"""The training set and its batches; the batch order as a pure function of (seed, epoch, step).

Examples come from halo.train.data.examples (no torch there); here several sources are
concatenated or interleaved by probability, an eval set is a file of its own or a held-out
fraction, and sequences become tensors, padded or packed. Every process computes the same
global batch and takes its contiguous share, so one process and N processes see exactly the
same global batches (the loss is normalised globally).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TypeVar

import torch

from halo.errors import HaloError
from halo.train.config import Data
from halo.train.data.examples import Parse, Sequence, source_examples

T = TypeVar("T")


def interleave(
    sources: list[list[T]], probs: list[float], seed: int, oversample: bool = False
) -> list[T]:
    """Draw each next example's source by probability (LLaMA-Factory's interleave_under and
    interleave_over, as datasets' interleave_datasets stopping strategies).

    Undersampling stops as soon as one source is exhausted (its last example taken).
    Oversampling starts a source that ran out again from its beginning and stops once every
    source has been exhausted at least once, so no example is left out.
    """
    rng = random.Random(seed)
    pos = [0] * len(sources)
    exhausted = [False] * len(sources)
    out: list[T] = []
    while True:
        k = rng.choices(range(len(sources)), weights=probs)[0]
        out.append(sources[k][pos[k] % len(sources[k])])
        pos[k] += 1
        if pos[k] % len(sources[k]) == 0:
            exhausted[k] = True
        if all(exhausted) if oversample else exhausted[k]:
            return out


def load(data: Data, seed: int, parse: Parse[T]) -> tuple[list[T], list[T]]:
    """(train, eval) examples for one method's ``parse``."""
    per_source = [source_examples(s, parse) for s in data.sources("train")]
    if data.mix != "concat":
        probs = [s.probability or 0.0 for s in data.sources()]
        train = interleave(per_source, probs, seed, oversample=data.mix == "interleave_over")
    else:
        train = [x for ex in per_source for x in ex]
    evals = [x for s in data.sources("eval") for x in source_examples(s, parse)]
    if data.eval_fraction:
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
        held = set(order[: max(1, round(len(train) * data.eval_fraction))])
        evals = [x for i, x in enumerate(train) if i in held]
        train = [x for i, x in enumerate(train) if i not in held]
    return train, evals


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
