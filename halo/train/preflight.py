"""Checks before any training starts: paths, writability, base model, devices, free disk.

Each check is data in, a row out; `run()` gathers them and fails with every problem at once.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.report import human_bytes
from halo.train.config import Config


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _existing_ancestor(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path("/")


def writable(key: str, path: Path) -> Check:
    """Writable without creating anything: the path, or the nearest existing parent."""
    base = _existing_ancestor(path)
    if not base.is_dir():
        return Check(key, False, f"{base} exists and is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        return Check(key, False, f"{path}: not writable ({base} is read-only for this user)")
    return Check(key, True, f"{path} (writable)")


def base_model(cfg: Config) -> Check:
    src = cfg.model.init_from
    if src is None:
        return Check("model.init_from", True, "unset: a fresh model built from the model section")
    missing = [f for f in ("config.json", "model.safetensors") if not (src / f).is_file()]
    if missing:
        return Check("model.init_from", False, f"{src}: missing {', '.join(missing)}")
    try:
        arch = json.loads((src / "config.json").read_text()).get("architecture")
    except (OSError, ValueError) as exc:
        return Check("model.init_from", False, f"{src / 'config.json'}: unreadable ({exc})")
    if arch != "halo-decoder":
        return Check(
            "model.init_from",
            False,
            f"{src / 'config.json'}: architecture {arch!r}, expected 'halo-decoder'",
        )
    return Check("model.init_from", True, f"{src} (config.json, model.safetensors)")


def devices(cfg: Config, gpu_count: int, nproc: int) -> Check:
    req = cfg.runtime.devices
    if req == "all":
        if gpu_count == 0:
            return Check("runtime.devices", True, "all: no GPU here, training on the CPU")
        if nproc > gpu_count:
            return Check("runtime.devices", False, f"--nproc {nproc} exceeds the {gpu_count} GPUs")
        return Check("runtime.devices", True, f"all: {gpu_count} GPU(s)")
    bad = [d for d in req if d >= gpu_count or d < 0]
    if bad:
        return Check("runtime.devices", False, f"GPUs {bad} requested, {gpu_count} present")
    if nproc > len(req):
        return Check(
            "runtime.devices", False, f"--nproc {nproc} exceeds the {len(req)} GPUs listed"
        )
    return Check("runtime.devices", True, f"GPUs {req}")


def checkpoint_bytes(cfg: Config, n_params: int) -> int:
    # fp32 weights + AdamW's two moments, per kept checkpoint, plus one being written.
    per = n_params * 4 * 3
    keep = cfg.checkpoint.keep_last or 10
    return per * (keep + 1)


def disk(cfg: Config, need: int) -> Check:
    base = _existing_ancestor(cfg.runtime.paths.checkpoints)
    free = shutil.disk_usage(base).free
    detail = f"{human_bytes(free)} free at {base}, checkpoints need about {human_bytes(need)}"
    return Check("disk", free >= need, detail)


def parallelism(cfg: Config, nproc: int, cuda: bool) -> Check:
    mode = cfg.runtime.parallel_mode
    if nproc > 1 and mode == "none":
        return Check("runtime.parallel_mode", False, f"none cannot run --nproc {nproc}")
    if cfg.training.global_batch_size % nproc:
        return Check(
            "training.global_batch_size",
            False,
            f"{cfg.training.global_batch_size} does not divide over --nproc {nproc}",
        )
    if cfg.training.precision == "bf16" and not cuda:
        return Check("training.precision", True, "bf16 on the CPU works but is slow")
    return Check("runtime.parallel_mode", True, f"{mode} with {nproc} process(es)")


def n_params(cfg: Config, vocab: int) -> int:
    m = cfg.model
    hd = m.hidden_size // m.num_heads
    attn = m.hidden_size * hd * (2 * m.num_heads + 2 * m.num_kv_heads)
    mlp = 3 * m.hidden_size * m.intermediate_size
    emb = vocab * m.hidden_size * (1 if m.tie_embeddings else 2)
    return m.num_layers * (attn + mlp + 2 * m.hidden_size) + emb + m.hidden_size


def gather(cfg: Config, nproc: int, gpu_count: int, vocab: int) -> list[Check]:
    return [
        Check("data.train", cfg.data.train.is_file(), str(cfg.data.train)),
        writable("runtime.paths.checkpoints", cfg.runtime.paths.checkpoints),
        writable("runtime.paths.logs", cfg.runtime.paths.logs),
        base_model(cfg),
        devices(cfg, gpu_count, nproc),
        parallelism(cfg, nproc, gpu_count > 0),
        disk(cfg, checkpoint_bytes(cfg, n_params(cfg, vocab))),
    ]


def failures(checks: list[Check]) -> None:
    bad = [c for c in checks if not c.ok]
    if bad:
        raise HaloError("preflight failed:\n  " + "\n  ".join(f"{c.name}: {c.detail}" for c in bad))


def gpu_count() -> int:
    """GPUs visible to torch, or 0 where torch is absent (the edge of this module)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
