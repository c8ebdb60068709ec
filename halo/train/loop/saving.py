"""Writing a Trainer to a checkpoint, and picking the checkpoint to resume from.

Resume takes the newest checkpoint that passes its check (sha256 of every file, finite
weights); one that fails is set aside with one line and the one before it is tried. A
checkpoint of another architecture is an error, never a partial load.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

from halo.errors import HaloError
from halo.train.checkpoints import checkpoint, export, joblock
from halo.train.loop.setup import log
from halo.train.models import hf
from halo.train.parallel import dcp, distributed
from halo.train.state import DivergedError, Trainer


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _finite(state: dict[str, torch.Tensor]) -> str | None:
    for key, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return key
    return None


def save(
    tr: Trainer,
    reason: str,
    epoch: int,
    extra_meta: dict[str, Any] | None = None,
    hook_sleep: float = 0.0,
) -> Path | None:
    """Write a checkpoint of ``tr`` (collective: every process calls it); prune its lineage."""
    ctx, cfg = tr.ctx, tr.cfg
    if dcp.enabled(tr):
        return _save_sharded(tr, reason, epoch, extra_meta, hook_sleep)
    msd = distributed.model_state(tr.model)
    osd = distributed.optimizer_state(tr.model, tr.optim)
    bad = ctx.broadcast(_finite(msd) if ctx.is_main else None)
    if bad:
        raise DivergedError(f"step {tr.step}: weight {bad} is not finite; no checkpoint written")
    path = None
    if ctx.is_main:
        dirname = checkpoint.name(tr.lineage, epoch, tr.step)
        log(ctx, f"checkpoint: writing {dirname} ({reason})")
        meta = _meta(tr, reason, epoch, extra_meta)
        state = {"optimizer": osd, "scheduler": tr.scheduler.state_dict(), "rng": rng_state()}
        path = checkpoint.write(
            cfg.job_dir,
            dirname,
            lambda folder: export.write_hf(folder, msd, tr.conf, tr.tok),
            state,
            meta,
            hook_sleep=hook_sleep,
        )
        for gone in checkpoint.prune(cfg.job_dir, tr.lineage, cfg.checkpoint.keep_last):
            log(ctx, f"checkpoint: pruned {gone.name}")
    ctx.barrier()
    return path


def _meta(
    tr: Trainer, reason: str, epoch: int, extra_meta: dict[str, Any] | None
) -> dict[str, Any]:
    """The checkpoint record's fields, the same whether the weights are one file or shards."""
    ctx, cfg = tr.ctx, tr.cfg
    return {
        "step": tr.step,
        "epoch": epoch,
        "lineage": tr.lineage,
        "method": tr.method.name,
        "job_name": cfg.runtime.job_name,
        "reason": reason,
        "global_batch_size": cfg.training.global_batch_size,
        "seed": cfg.training.seed,
        "world_size": ctx.world,
        **(extra_meta or {}),
    }


def _save_sharded(
    tr: Trainer, reason: str, epoch: int, extra_meta: dict[str, Any] | None, hook_sleep: float
) -> Path | None:
    """The DCP form of ``save`` (halo.train.parallel.dcp): every rank writes its shards."""
    ctx, cfg = tr.ctx, tr.cfg
    dirname = checkpoint.name(tr.lineage, epoch, tr.step)
    log(ctx, f"checkpoint: writing {dirname} ({reason}, sharded)")
    meta = _meta(tr, reason, epoch, extra_meta)
    state = {"scheduler": tr.scheduler.state_dict(), "rng": rng_state()}
    path = dcp.save(
        tr, dirname, state, meta, lambda f: export.write_hf_files(f, tr.conf, tr.tok), hook_sleep
    )
    if ctx.is_main:
        for gone in checkpoint.prune(cfg.job_dir, tr.lineage, cfg.checkpoint.keep_last):
            log(ctx, f"checkpoint: pruned {gone.name}")
    ctx.barrier()
    return path


def export_model(tr: Trainer, out: Path) -> Path | None:
    """The current policy as a Hugging Face folder at ``out`` (collective; rank 0 writes it,
    complete or absent). What online GRPO serves after each update."""
    from halo.atomic import staged_dir

    msd = distributed.model_state(tr.model)
    if tr.ctx.is_main:
        with staged_dir(out) as tmp:
            export.write_hf(tmp, msd, tr.conf, tr.tok)
            tmp.chmod(0o755)
    tr.ctx.barrier()
    return out if tr.ctx.is_main else None


def pick(job_dir: Path, ctx: distributed.Context) -> checkpoint.Found | None:
    """The newest checkpoint that passes its check; the failing ones are set aside."""
    for found in reversed(checkpoint.named(job_dir)):
        problem = checkpoint.verify(found.path)
        if problem is None:
            return found
        moved = checkpoint.set_aside(found.path)
        log(ctx, f"checkpoint: skipping {found.path.name}: {problem} (moved to {moved.name})")
    return None


def check_compatible(tr: Trainer, path: Path, meta: dict[str, Any]) -> None:
    from transformers import AutoConfig

    t = tr.cfg.training
    if meta.get("global_batch_size") != t.global_batch_size or meta.get("seed") != t.seed:
        raise HaloError(
            f"{path}: saved with global_batch_size={meta.get('global_batch_size')} "
            f"seed={meta.get('seed')}; resuming needs the same (or set checkpoint.resume: false)"
        )
    try:
        saved_conf = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # any transformers error on a damaged config.json: one line
        raise HaloError(f"{path / 'config.json'}: not a model config ({exc})") from None
    saved = hf.architecture(saved_conf)
    want = hf.architecture(tr.conf)
    diff = sorted(k for k in saved.keys() | want.keys() if saved.get(k) != want.get(k))
    if diff:
        shown = ", ".join(f"{k} {saved.get(k)!r} -> {want.get(k)!r}" for k in diff[:4])
        raise HaloError(
            f"{path}: the model differs from this config ({shown}); resuming needs the same "
            "architecture (or set checkpoint.resume: false)"
        )


def resume(tr: Trainer) -> checkpoint.Found | None:
    """Load the checkpoint to continue from into ``tr``, or start a new lineage."""
    ctx, cfg = tr.ctx, tr.cfg
    job_dir = cfg.job_dir
    if ctx.is_main:
        # A partial write is removed only when its writer is known to be dead: this run holds
        # the job folder's lock, so no other run is writing (see halo.train.checkpoints.joblock).
        mine = joblock.owned(job_dir)
        for p in checkpoint.partials(job_dir):
            if not mine:
                log(ctx, f"checkpoint: ignoring partial write {p.name} (job lock not held)")
                continue
            log(ctx, f"checkpoint: ignoring and removing partial write {p.name}")
            shutil.rmtree(p, ignore_errors=True)
    found = None
    if cfg.checkpoint.resume and ctx.is_main:
        found = pick(job_dir, ctx)
    found = ctx.broadcast(found)
    if found is None:
        tr.lineage = ctx.broadcast(checkpoint.next_lineage(job_dir) if ctx.is_main else None)
        return None
    meta = checkpoint.read_meta(found.path)
    assert meta is not None  # verified above
    check_compatible(tr, found.path, meta)
    state = checkpoint.load_trainer_state(found.path)
    try:
        if dcp.is_dcp(meta):  # shards, cut to this run's mesh
            dcp.load(tr, found.path)
        else:
            distributed.load_states(
                tr.model, tr.optim, checkpoint.load_weights(found.path), state["optimizer"]
            )
        tr.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
        raise HaloError(
            f"{found.path}: its trainer state does not load ({' '.join(str(exc).split())[:200]}); "
            "set checkpoint.resume: false to start a new lineage"
        ) from None
    tr.step, tr.lineage = int(meta["step"]), int(meta["lineage"])
    log(ctx, f"resumed from {found.path} (step {tr.step})")
    return found
