"""The training loop every method shares.

A method supplies items (one per unit of the global batch), how to collate them, and the
*sum* of its per-token losses; the loop divides by the token count summed over all processes.
That makes the loss and the gradients of N processes equal to one process's over the same
global batch. Data order, learning rate and model init are functions of (seed, step), so a
resumed run continues the uninterrupted run's curve.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from halo.errors import HaloError
from halo.train import attention, checkpoint, distributed
from halo.train.config import Config
from halo.train.data import Schedule
from halo.train.model import Decoder, ModelConfig
from halo.train.tokenizer import Tokenizer

Batch = dict[str, torch.Tensor]


@dataclass
class Method:
    name: str
    items: list[Any]
    collate: Callable[[list[Any]], Batch]
    # (model, micro-batch, prepared) -> (sum of per-token losses, extra metric sums)
    loss: Callable[[nn.Module, Batch, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    # (policy, reference, micro-batches) -> whatever loss() needs that must not take gradients
    prepare: Callable[[nn.Module, nn.Module | None, list[Batch]], list[Any]] | None = None
    needs_reference: bool = False
    updates_per_batch: int = 1
    # What the summed loss is divided by (over all processes): trained-on tokens by default;
    # a method with a per-example loss (DPO) counts examples instead.
    count: Callable[[Batch], float] = lambda b: float(b["weights"].sum())
    notes: list[str] = field(default_factory=list)


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


class StopFlag:
    """Set by SIGTERM; the loop finishes the batch, saves, and exits cleanly."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True


def log(ctx: distributed.Context, msg: str) -> None:
    if ctx.is_main:
        print(msg, flush=True)


def build_model(cfg: Config, tok: Tokenizer) -> tuple[Decoder, ModelConfig]:
    """A fresh model seeded from training.seed, or the weights in model.init_from."""
    m = cfg.model
    if m.init_from is not None:
        mcfg = ModelConfig.load(m.init_from / "config.json")
    else:
        # The config's model section holds every architecture field; the tokenizer sets the vocab.
        arch = {f.name: getattr(m, f.name) for f in fields(ModelConfig) if f.name != "vocab_size"}
        mcfg = ModelConfig(vocab_size=tok.vocab_size, **arch)
    if mcfg.vocab_size < tok.vocab_size:
        raise HaloError(
            f"model: vocab_size {mcfg.vocab_size} is smaller than the tokenizer's {tok.vocab_size}"
        )
    torch.manual_seed(cfg.training.seed)
    model = Decoder(mcfg)
    if m.init_from is not None:
        from safetensors.torch import load_file

        sd = load_file(str(m.init_from / "model.safetensors"))
        missing, unexpected = model.load_state_dict(sd, strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise HaloError(
                f"model.init_from: weights do not match config.json ({(missing + unexpected)[:3]})"
            )
    return model, mcfg


def load_tokenizer(cfg: Config) -> Tokenizer:
    if cfg.model.init_from is not None and (cfg.model.init_from / "tokenizer.json").is_file():
        return Tokenizer.load(cfg.model.init_from / "tokenizer.json")
    return Tokenizer()


def lr_lambda(cfg: Config, total_updates: int) -> Callable[[int], float]:
    o = cfg.optim

    def f(update: int) -> float:
        if o.warmup_steps and update < o.warmup_steps:
            return (update + 1) / o.warmup_steps
        if o.scheduler == "constant":
            return 1.0
        span = max(total_updates - o.warmup_steps, 1)
        frac = min(max(update - o.warmup_steps, 0) / span, 1.0)
        shape = 0.5 * (1 + math.cos(math.pi * frac)) if o.scheduler == "cosine" else 1 - frac
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * shape

    return f


def make_optimizer(cfg: Config, model: nn.Module) -> torch.optim.Optimizer:
    # No decay on norms (1-D weights): decaying them toward 0 fights the normalisation.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    o = cfg.optim
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=o.lr,
        betas=(o.betas[0], o.betas[1]),
        eps=o.eps,
    )


def micro_batches(items: list[Any], size: int | None) -> list[list[Any]]:
    size = size or len(items)
    return [items[i : i + size] for i in range(0, len(items), size)]


def _to(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def train(
    cfg: Config,
    method: Method,
    tok: Tokenizer,
    ctx: distributed.Context,
    stop: StopFlag | None = None,
    checkpoint_hook_sleep: tuple[int, float] | None = None,
    save_final: bool = True,
) -> Result:
    t = cfg.training
    if t.global_batch_size % ctx.world:
        raise HaloError(
            f"training.global_batch_size: {t.global_batch_size} does not divide over {ctx.world} processes"
        )
    stop = stop or StopFlag()
    sched = Schedule(len(method.items), t.global_batch_size, t.seed, t.epochs, t.max_steps)
    total = sched.total_steps
    mode = distributed.resolve_mode(cfg.runtime.parallel_mode, ctx.world, ctx.device.type == "cuda")
    bf16 = t.precision == "bf16"

    model, mcfg = build_model(cfg, tok)
    reference = None
    if method.needs_reference:
        reference = copy.deepcopy(model).requires_grad_(False).eval().to(ctx.device)
    cap = torch.cuda.get_device_capability(ctx.device) if ctx.device.type == "cuda" else None
    choice = attention.select(
        cfg.model.attention, cap, attention.module_importable, half_precision=bf16
    )
    log(ctx, f"attention: {choice.backend} ({choice.reason})")
    kernel = attention.kernel(choice.backend)
    model.set_attention(kernel)
    if reference is not None:
        reference.set_attention(kernel)
    model.to(ctx.device)
    model = distributed.wrap(model, mode, ctx, bf16)
    optim = make_optimizer(cfg, model)
    updates = method.updates_per_batch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(cfg, total * updates))

    job_dir, log_dir = cfg.job_dir, cfg.log_dir
    step = 0
    if ctx.is_main:
        for p in checkpoint.partials(job_dir):
            log(ctx, f"checkpoint: ignoring and removing partial write {p.name}")
            shutil.rmtree(p, ignore_errors=True)
    ctx.barrier()
    found = checkpoint.latest(job_dir) if cfg.checkpoint.resume else None
    if found is not None:
        model_sd, optim_sd, sched_sd, meta = checkpoint.load(found.path)
        if meta.get("global_batch_size") != t.global_batch_size or meta.get("seed") != t.seed:
            raise HaloError(
                f"{found.path}: saved with global_batch_size={meta.get('global_batch_size')} "
                f"seed={meta.get('seed')}; resuming needs the same (or set checkpoint.resume: false)"
            )
        distributed.load_states(model, optim, model_sd, optim_sd)
        scheduler.load_state_dict(sched_sd)
        step = int(meta["step"])
        log(ctx, f"resumed from {found.path} (step {step})")
    log(
        ctx,
        f"{method.name}: {len(method.items)} items, {sched.steps_per_epoch} steps/epoch, "
        f"{total} steps, world {ctx.world} ({mode}), device {ctx.device}",
    )
    for note in method.notes:
        log(ctx, note)

    if ctx.is_main:
        log_dir.mkdir(parents=True, exist_ok=True)
    metrics = (log_dir / "metrics.jsonl").open("a") if ctx.is_main else None
    autocast = torch.autocast(
        ctx.device.type, dtype=torch.bfloat16, enabled=bf16 and mode != "fsdp"
    )
    tied = mcfg.tie_embeddings

    def save(reason: str) -> Path | None:
        msd = distributed.model_state(model)
        osd = distributed.optimizer_state(model, optim)
        path = None
        if ctx.is_main:
            if tied:
                msd = {k: v for k, v in msd.items() if k != "lm_head.weight"}
            epoch = sched.epoch_of(max(step - 1, 0))
            log(ctx, f"checkpoint: writing {checkpoint.name(epoch, step)} ({reason})")
            meta = {
                "step": step,
                "epoch": epoch,
                "method": method.name,
                "job_name": cfg.runtime.job_name,
                "reason": reason,
                "global_batch_size": t.global_batch_size,
                "seed": t.seed,
                "world_size": ctx.world,
                "loss": losses.get(step),
            }
            hook = checkpoint_hook_sleep
            sleep = hook[1] if hook and hook[0] == step else 0.0
            path = checkpoint.write(
                job_dir,
                epoch,
                step,
                msd,
                osd,
                scheduler.state_dict(),
                meta,
                mcfg.to_json(),
                tok.to_json(),
                hook_sleep=sleep,
            )
            for gone in checkpoint.prune(job_dir, cfg.checkpoint.keep_last):
                log(ctx, f"checkpoint: pruned {gone.name}")
        ctx.barrier()
        return path

    losses: dict[int, float] = {}
    tokens_done, started, last_ckpt = 0, time.monotonic(), None
    saved_at = step if found is not None else -1
    stopped = False
    step_times: list[tuple[int, float]] = []
    model.train()
    while step < total:
        t0 = time.monotonic()
        mine = [method.items[i] for i in sched.batch(step, ctx.rank, ctx.world)]
        batches = [
            _to(method.collate(mb), ctx.device) for mb in micro_batches(mine, t.micro_batch_size)
        ]
        local = torch.tensor([sum(method.count(b) for b in batches)], device=ctx.device)
        count = ctx.sum(local).item()
        if count <= 0:
            raise HaloError(f"step {step + 1}: the global batch has no trained-on tokens")
        with torch.no_grad(), autocast:
            prepared = (
                method.prepare(model, reference, batches)
                if method.prepare
                else [None] * len(batches)
            )
        first_loss = None
        for _ in range(updates):
            optim.zero_grad(set_to_none=True)
            loss_sum = torch.zeros((), device=ctx.device)
            extra_sum: dict[str, torch.Tensor] = {}
            for n, (b, prep) in enumerate(zip(batches, prepared, strict=True)):
                with distributed.no_sync(model, last=n == len(batches) - 1), autocast:
                    s, extra = method.loss(model, b, prep)
                    # DDP/FSDP average gradients over processes; scale so the result is the
                    # gradient of (sum over all processes) / (global token count).
                    (s * (ctx.world / count)).backward()
                loss_sum += s.detach().float()
                for k, v in extra.items():
                    extra_sum[k] = extra_sum.get(k, 0) + v.detach().float()
            if first_loss is None:
                first_loss = (ctx.sum(loss_sum) / count).item()
                first_extra = {k: (ctx.sum(v) / count).item() for k, v in extra_sum.items()}
            if cfg.optim.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            optim.step()
            scheduler.step()
        step += 1
        local_tok = sum(int((b["targets"] != tok.pad_id).sum()) for b in batches)
        n_tok = int(ctx.sum(torch.tensor([local_tok], device=ctx.device)).item())
        tokens_done += n_tok
        losses[step] = first_loss
        dt = time.monotonic() - t0
        if ctx.is_main and (step % cfg.logging.every_steps == 0 or step == total):
            lr = scheduler.get_last_lr()[0]
            extras = "".join(f" {k} {v:.4f}" for k, v in first_extra.items())
            log(
                ctx,
                f"step {step}/{total} epoch {sched.epoch_of(step - 1)} loss {first_loss:.6f} "
                f"lr {lr:.3e}{extras} tok/s {n_tok / dt:.0f}",
            )
            row = {
                "step": step,
                "loss": first_loss,
                "lr": lr,
                **first_extra,
                "tokens_per_s": n_tok / dt,
            }
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
        stop_now = ctx.any(stop.requested)
        step_times.append((n_tok, time.monotonic() - t0))
        if stop_now:
            log(ctx, f"SIGTERM: batch {step} finished, writing an emergency checkpoint")
            last_ckpt = save("sigterm")
            saved_at, stopped = step, True
            break
        if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
            last_ckpt = save("periodic")
            saved_at = step
    if save_final and not stopped and saved_at != step:
        last_ckpt = save("final")
    if metrics:
        metrics.close()
    seconds = time.monotonic() - started
    return Result(step, losses, tokens_done, seconds, stopped, last_ckpt, step_times)
