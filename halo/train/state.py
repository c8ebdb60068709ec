"""The shapes every piece of the trainer shares: a method, the trainer's state, a step's stats.

A method supplies items (one per unit of the global batch), how to collate them, and the
*sum* of its per-token (or per-example) losses; the trainer divides by the count summed
over all processes. That makes the loss and the gradients of N processes equal to one
process's over the same global batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from halo.errors import HaloError
from halo.train.config import Config
from halo.train.data.batching import share
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.parallel import distributed

Batch = dict[str, torch.Tensor]


class DivergedError(HaloError):
    """A non-finite loss, gradient or weight: stop before anything is saved or pruned."""

    exit_code = 1


class TrainingError(HaloError):
    """The environment failed the run after training began (a full disk, a file-size limit):
    exit 1, like a divergence; what was being written is removed (halo.atomic)."""

    exit_code = 1


def weights_count(b: Batch) -> float:
    return float(b["weights"].sum())


@dataclass
class Method:
    name: str
    items: list[Any]
    collate: Callable[[list[Any]], Batch]
    # (model, micro-batch, prepared) -> (sum of losses, extra metric sums)
    loss: Callable[[nn.Module, Batch, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    # (policy, reference, micro-batches) -> whatever loss() needs that must not take gradients
    prepare: Callable[[nn.Module, nn.Module | None, list[Batch]], list[Any]] | None = None
    needs_reference: bool = False
    updates_per_batch: int = 1
    # What the summed loss is divided by (over all processes): trained-on tokens by default.
    count: Callable[[Batch], float] = weights_count
    # A global batch's items -> this process's items. GRPO computes batch-wide advantages
    # here, before the batch is split.
    shard: Callable[[list[Any], int, int], list[Any]] = share
    eval_items: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # A model other than a causal LM (a classifier, an encoder): (model section, config,
    # attention backend, seed, device) -> module, as halo.train.models.hf.build; and the
    # transformers config it saves (config -> config).
    build_model: Callable[..., nn.Module] | None = None
    configure: Callable[[Any], Any] | None = None
    # Measures beside the eval loss, (trainer, eval items) -> {name: value}: accuracy, recall.
    eval_metrics: Callable[[Any, list[Any]], dict[str, float]] | None = None


@dataclass
class Trainer:
    """Everything one optimizer step needs; built by halo.train.loop.setup, saved by saving."""

    cfg: Config
    method: Method
    tok: ChatTokenizer
    ctx: distributed.Context
    model: nn.Module
    reference: nn.Module | None
    optim: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    # The model's transformers config (what checkpoints write as config.json).
    conf: Any
    mode: str
    autocast: Any
    step: int = 0
    lineage: int = 1
    # runtime.profile's window on this rank (halo.train.observe.profiling), None when off.
    profiler: Any = None


@dataclass(frozen=True)
class StepStats:
    loss: float
    # Averaged over all update passes of the batch.
    extras: dict[str, float]
    tokens: int
    seconds: float
    lr: float
    # CPU time of this process during the step: on a shared machine, wall time also counts
    # the neighbours' work; the benchmark compares this too.
    cpu_seconds: float = 0.0


@dataclass
class Result:
    steps: int
    losses: dict[int, float]
    tokens: int
    seconds: float
    stopped_by_signal: bool
    checkpoint: Path | None
    # Per step: (tokens, seconds), checkpoint writes excluded; the benchmark reads these.
    step_times: list[tuple[int, float]] = field(default_factory=list)
