"""The training loop every method shares, in four pieces: setup (`start`, on halo.train.loop.setup),
one optimizer step (`step`), logging (`record`, `Metrics`) and checkpoints (`Checkpoints`, on
halo.train.loop.saving); `train` strings them together.

Data order, learning rate and model init are functions of (seed, step), so a resumed run
continues the uninterrupted run's curve. A non-finite loss or gradient stops the run with
exit 1 before anything is saved or pruned.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from halo.errors import HaloError, os_error
from halo.train.config import Config
from halo.train.data.batching import Schedule
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.loop import saving, setup
from halo.train.loop.setup import log
from halo.train.loop.stopping import StopFlag
from halo.train.observe.trackers import Trackers
from halo.train.observe.trackers import start as start_trackers
from halo.train.parallel import distributed, hooks
from halo.train.state import (
    Batch,
    DivergedError,
    Method,
    Result,
    StepStats,
    Trainer,
    TrainingError,
)


def micro_batches(items: list[Any], size: int | None) -> list[list[Any]]:
    size = size or len(items)
    return [items[i : i + size] for i in range(0, len(items), size)]


def _to(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _tokens(b: Batch) -> int:
    return int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()


def _grad_norm(tr: Trainer) -> float:
    clip = tr.cfg.optim.grad_clip or math.inf
    meshed = hooks.grad_norm(tr, clip)  # parameters on several meshes (tp, ep, FSDP2)
    if meshed is not None:
        return meshed
    norm = torch.nn.utils.clip_grad_norm_(tr.model.parameters(), clip)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def backward(
    tr: Trainer, batches: list[Batch], prepared: list[Any], count: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward/backward over the micro-batches, gradients accumulated, no update: the summed
    loss and extra metric sums (halo.train.measure.numerics compares exactly this across set-ups)."""
    ctx = tr.ctx
    tr.optim.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=ctx.device)
    extra_sum: dict[str, torch.Tensor] = {}
    for n, (b, prep) in enumerate(zip(batches, prepared, strict=True)):
        with distributed.no_sync(tr.model, last=n == len(batches) - 1), tr.autocast:
            hooks.begin(tr, b)
            s, extra = tr.method.loss(tr.model, b, prep)
            # DDP/FSDP average gradients over processes; scale so the result is the
            # gradient of (sum over all processes) / (global count).
            scaled = s * (ctx.world / count)
            router = hooks.router_loss(tr, len(batches))  # MoE: load balancing, z-loss
            (scaled if router is None else scaled + router).backward()
        loss_sum += s.detach().float()
        for k, v in extra.items():
            extra_sum[k] = extra_sum.get(k, torch.zeros((), device=ctx.device)) + v.detach().float()
    return loss_sum, extra_sum


def _pass(
    tr: Trainer, batches: list[Batch], prepared: list[Any], count: float
) -> tuple[float, dict[str, float]]:
    """One forward/backward over the micro-batches and one optimizer update."""
    ctx = tr.ctx
    loss_sum, extra_sum = backward(tr, batches, prepared, count)
    loss = (ctx.sum(loss_sum) / count).item()
    if not math.isfinite(loss):
        raise DivergedError(
            f"step {tr.step + 1}: loss is {loss}; stopping before any checkpoint is written"
        )
    norm = _grad_norm(tr)
    if not math.isfinite(norm):
        raise DivergedError(
            f"step {tr.step + 1}: gradient norm is {norm}; stopping before the update"
        )
    tr.optim.step()
    tr.scheduler.step()
    extras = {k: (ctx.sum(v) / count).item() for k, v in extra_sum.items()}
    extras.update(hooks.step_stats(tr))
    return loss, {**extras, "grad_norm": norm}  # before clipping, as clip_grad_norm_ returns it


def prepare(tr: Trainer, items: list[Any]) -> tuple[list[Batch], list[Any], float]:
    """A share of a batch as device micro-batches, what the method precomputes without
    gradients (reference log-probs), and the trained-on count over all processes."""
    ctx, method = tr.ctx, tr.method
    batches = [
        _to(method.collate(mb), ctx.device)
        for mb in micro_batches(items, tr.cfg.training.micro_batch_size)
    ]
    count = ctx.sum(torch.tensor([sum(method.count(b) for b in batches)], device=ctx.device)).item()
    if count <= 0:
        raise HaloError(f"step {tr.step + 1}: the global batch has no trained-on tokens")
    with torch.no_grad(), tr.autocast:
        prepared = (
            method.prepare(tr.model, tr.reference, batches)
            if method.prepare
            else [None] * len(batches)
        )
    return batches, prepared, count


def step(tr: Trainer, items: list[Any]) -> StepStats:
    """One optimizer step (``updates_per_batch`` passes) on this process's share of a batch."""
    if tr.profiler is not None:
        tr.profiler.before(tr.step + 1)
    t0, c0 = time.monotonic(), time.process_time()
    ctx, method = tr.ctx, tr.method
    batches, prepared, count = prepare(tr, items)
    losses, extras = [], []
    for _ in range(method.updates_per_batch):
        loss, extra = _pass(tr, batches, prepared, count)
        losses.append(loss)
        extras.append(extra)
    tr.step += 1
    tokens = int(
        ctx.sum(torch.tensor([sum(_tokens(b) for b in batches)], device=ctx.device)).item()
    ) // hooks.replicas(tr)  # tp ranks compute the same tokens: count them once
    mean = {k: sum(e[k] for e in extras) / len(extras) for k in extras[0]}
    lr = tr.scheduler.get_last_lr()[0]
    loss = sum(losses) / len(losses)
    stats = StepStats(loss, mean, tokens, time.monotonic() - t0, lr, time.process_time() - c0)
    if tr.profiler is not None:
        tr.profiler.after(tr.step)
    return stats


def evaluate(tr: Trainer, items: list[Any]) -> float:
    """The method's loss over ``items`` (spread over processes), without gradients."""
    ctx, method = tr.ctx, tr.method
    index, ranks = ctx.data_shard()  # tp and cp ranks evaluate the same items
    mine = method.shard(items, 0, 1)[index::ranks]
    loss = torch.zeros((), device=ctx.device)
    count = torch.zeros((), device=ctx.device)
    size = tr.cfg.training.micro_batch_size or tr.cfg.training.global_batch_size
    tr.model.eval()
    with torch.no_grad(), tr.autocast:
        for mb, counted in hooks.eval_batches(tr, mine, items, size):
            b = _to(method.collate(mb), ctx.device)
            prepared = method.prepare(tr.model, tr.reference, [b])[0] if method.prepare else None
            s, _ = method.loss(tr.model, b, prepared)
            if counted:  # an uncounted forward only keeps the mesh's collectives in step
                loss += s.float()
                count += method.count(b)
    tr.model.train()
    return (ctx.sum(loss) / ctx.sum(count).clamp(min=1e-9)).item()


class Metrics:
    """Progress lines on stdout and metrics.jsonl rows, from the main process only; each row,
    once written, also goes to the trackers (halo.train.observe.trackers), which can never stop it."""

    def __init__(
        self,
        log_dir: Path,
        ctx: distributed.Context,
        every: int,
        trackers: Trackers | None = None,
    ) -> None:
        self.ctx, self.every, self.fh = ctx, every, None
        self.trackers = trackers or Trackers()
        if ctx.is_main:
            log_dir.mkdir(parents=True, exist_ok=True)
            self.fh = (log_dir / "metrics.jsonl").open("a")

    def _row(self, row: dict[str, Any]) -> None:
        if self.fh:
            self.fh.write(json.dumps(row) + "\n")
            self.fh.flush()
        self.trackers.log(row)

    def step(self, n: int, total: int, epoch: int, st: StepStats) -> None:
        if not (n % self.every == 0 or n == total):
            return
        extras = "".join(f" {k} {v:.4f}" for k, v in st.extras.items())
        log(
            self.ctx,
            f"step {n}/{total} epoch {epoch} loss {st.loss:.6f} lr {st.lr:.3e}{extras} tok/s {st.tokens / st.seconds:.0f}",
        )
        rate = st.tokens / st.seconds
        self._row(
            {
                "step": n,
                "loss": st.loss,
                "lr": st.lr,
                **st.extras,
                "tokens_per_s": rate,
                "tokens": st.tokens,
                "seconds": st.seconds,
                "cpu_seconds": st.cpu_seconds,
            }
        )

    def eval(self, n: int, value: float, key: str = "eval_loss") -> None:
        """An evaluation at step ``n``: eval loss, or another measure named by ``key``."""
        log(self.ctx, f"eval step {n}: {key} {value:.6f}")
        self._row({"step": n, key: value})

    def close(self) -> None:
        if self.fh:
            self.fh.close()
        self.trackers.close()


def open_metrics(cfg: Config, ctx: distributed.Context, tr: Trainer, resumed: bool) -> Metrics:
    """metrics.jsonl and the trackers of runtime.report_to, for a run at ``tr``'s step."""
    from halo.train import config as configs

    shown = {**configs.shown(cfg), "method": tr.method.name}
    trackers = start_trackers(
        cfg.runtime.report_to,
        cfg.log_dir,
        cfg.runtime.job_name,
        shown,
        ctx.is_main,
        resumed_at=tr.step if resumed else None,
        lineage=tr.lineage,
    )
    return Metrics(cfg.log_dir, ctx, cfg.logging.every_steps, trackers)


def _eval_due(cfg: Config, method: Method, n: int, total: int) -> bool:
    every = cfg.training.eval_every_steps
    return bool(method.eval_items) and (n == total or (every > 0 and n % every == 0))


def _batches(tr: Trainer, sched: Schedule) -> Iterator[list[Any]]:
    while tr.step < sched.total_steps:
        items = [tr.method.items[i] for i in sched.global_batch_of(tr.step)]
        yield tr.method.shard(items, *tr.ctx.data_shard())


def start(
    cfg: Config, method: Method, tok: ChatTokenizer, ctx: distributed.Context
) -> tuple[Trainer, Schedule, bool]:
    """Setup: the schedule, the trainer at the newest verified checkpoint, and a line about both.

    Returns (trainer, schedule, whether a checkpoint was resumed).
    """
    t = cfg.training
    sched = Schedule(len(method.items), t.global_batch_size, t.seed, t.epochs, t.max_steps)
    tr = setup.setup(cfg, method, tok, ctx, sched.total_steps)
    found = saving.resume(tr)
    if cfg.runtime.profile is not None:
        from halo.train.observe import profiling

        tr.profiler = profiling.window(cfg, ctx.rank, sched.total_steps)
    log(
        ctx,
        f"{method.name}: {len(method.items)} items, {sched.steps_per_epoch} steps/epoch, {sched.total_steps} steps, world {ctx.world} ({tr.mode}), device {ctx.device}",
    )
    for note in method.notes:
        log(ctx, note)
    return tr, sched, found is not None


def record(tr: Trainer, sched: Schedule, metrics: Metrics, result: Result, st: StepStats) -> None:
    """Logging: a finished step into the result, the progress line and metrics.jsonl, and the
    eval loss when one is due."""
    result.losses[tr.step] = st.loss
    result.tokens += st.tokens
    result.step_times.append((st.tokens, st.seconds))
    metrics.step(tr.step, sched.total_steps, sched.epoch_of(tr.step - 1), st)
    if _eval_due(tr.cfg, tr.method, tr.step, sched.total_steps):
        metrics.eval(tr.step, evaluate(tr, tr.method.eval_items))
        if tr.method.eval_metrics is not None:  # accuracy, recall: every process computes them
            for key, value in tr.method.eval_metrics(tr, tr.method.eval_items).items():
                metrics.eval(tr.step, value, key)


class Checkpoints:
    """Checkpoints: when the loop saves (periodic, on a signal, final) and never twice for one
    step. The writing itself is halo.train.loop.saving's."""

    def __init__(
        self,
        tr: Trainer,
        sched: Schedule,
        result: Result,
        resumed: bool,
        hook_sleep: tuple[int, float] | None = None,
    ) -> None:
        self.tr, self.sched, self.result, self.hook_sleep = tr, sched, result, hook_sleep
        self.saved_at = tr.step if resumed else -1

    def save(self, reason: str) -> None:
        tr, hook = self.tr, self.hook_sleep
        # A test hook: a pause inside the write at that step, to be killed mid-checkpoint.
        sleep = hook[1] if hook and hook[0] == tr.step else 0.0
        epoch = self.sched.epoch_of(max(tr.step - 1, 0))
        self.result.checkpoint = saving.save(
            tr, reason, epoch, {"loss": self.result.losses.get(tr.step)}, sleep
        )
        self.saved_at = tr.step

    def on_signal(self, stop: StopFlag) -> bool:
        """After a batch: when any process was asked to stop, one emergency checkpoint; True."""
        if not self.tr.ctx.any(stop.requested):
            return False
        log(
            self.tr.ctx,
            f"{stop.name if stop.requested else 'signal'}: batch {self.tr.step} finished, writing an emergency checkpoint",
        )
        self.save("signal")
        self.result.stopped_by_signal = True
        return True

    def periodic(self) -> None:
        every = self.tr.cfg.checkpoint.every_steps
        if every and self.tr.step % every == 0:
            self.save("periodic")

    def final(self) -> None:
        if self.saved_at != self.tr.step:
            self.save("final")


def train(
    cfg: Config,
    method: Method,
    tok: ChatTokenizer,
    ctx: distributed.Context,
    stop: StopFlag | None = None,
    checkpoint_hook_sleep: tuple[int, float] | None = None,
    save_final: bool = True,
) -> Result:
    """The loop: setup (`start`), then per batch a `step`, its `record`, and `Checkpoints`."""
    stop = stop or StopFlag()
    tr, sched, resumed = start(cfg, method, tok, ctx)
    metrics = open_metrics(cfg, ctx, tr, resumed)
    result = Result(tr.step, {}, 0, 0.0, False, None)
    checkpoints = Checkpoints(tr, sched, result, resumed, checkpoint_hook_sleep)
    started = time.monotonic()
    try:
        for items in _batches(tr, sched):
            record(tr, sched, metrics, result, step(tr, items))
            if checkpoints.on_signal(stop):
                break
            checkpoints.periodic()
        if save_final and not result.stopped_by_signal:
            checkpoints.final()
    except OSError as exc:
        raise TrainingError(f"step {tr.step}: {os_error(exc).message}") from None
    except OverflowError as exc:
        raise TrainingError(f"step {tr.step}: a number overflowed ({exc})") from None
    finally:
        metrics.close()
        if tr.profiler is not None:
            tr.profiler.close()  # a run stopped inside the window still writes its trace
    result.steps = tr.step
    result.seconds = time.monotonic() - started
    return result
