"""Checkpoints that are complete or absent.

``<checkpoints>/<job>/epoch_<E>_step_<S>/`` holds meta.json, config.json (the model's
architecture), model.safetensors, optimizer.pt, scheduler.pt (and tokenizer.json). It is
written into a hidden temp sibling and renamed into place, meta.json last; a directory
without all of them (a crash mid-write) is never resumed from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from halo.atomic import staged_dir

REQUIRED = ("meta.json", "config.json", "model.safetensors", "optimizer.pt", "scheduler.pt")
NAME = re.compile(r"epoch_(\d+)_step_(\d+)")
# A test hook: "STEP:SECONDS" sleeps in the middle of writing the checkpoint of STEP (after
# model.safetensors), so a test can SIGKILL a trainer with a half-written checkpoint on disk.
# Unset in real runs.
TEST_HOOK_SLEEP_ENV = "HALO_TEST_HOOK_CHECKPOINT_SLEEP"


def test_hook_sleep(value: str | None) -> tuple[int, float] | None:
    if not value:
        return None
    step, _, seconds = value.partition(":")
    return int(step), float(seconds)


@dataclass(frozen=True)
class Found:
    path: Path
    epoch: int
    step: int


def name(epoch: int, step: int) -> str:
    return f"epoch_{epoch}_step_{step}"


def is_complete(path: Path) -> bool:
    if not (NAME.fullmatch(path.name) and path.is_dir()):
        return False
    if not all((path / f).is_file() for f in REQUIRED):
        return False
    try:
        json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def complete(job_dir: Path) -> list[Found]:
    """Complete checkpoints of a job, oldest first."""
    if not job_dir.is_dir():
        return []
    out = []
    for p in job_dir.iterdir():
        m = NAME.fullmatch(p.name)
        if m and is_complete(p):
            out.append(Found(p, int(m[1]), int(m[2])))
    return sorted(out, key=lambda f: f.step)


def latest(job_dir: Path) -> Found | None:
    found = complete(job_dir)
    return found[-1] if found else None


def partials(job_dir: Path) -> list[Path]:
    """Leftovers of interrupted writes: hidden temp dirs and named dirs missing files."""
    if not job_dir.is_dir():
        return []
    return sorted(
        p
        for p in job_dir.iterdir()
        if p.is_dir()
        and (
            (p.name.startswith(".epoch_") and p.name.endswith(".tmp"))
            or (NAME.fullmatch(p.name) and not is_complete(p))
        )
    )


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(
    job_dir: Path,
    epoch: int,
    step: int,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    scheduler_state: dict[str, Any],
    meta: dict[str, Any],
    model_config_json: str,
    tokenizer_json: str,
    hook_sleep: float = 0.0,
) -> Path:
    final = job_dir / name(epoch, step)
    with staged_dir(final) as tmp:
        save_file(
            {k: v.contiguous() for k, v in model_state.items()}, str(tmp / "model.safetensors")
        )
        if hook_sleep:
            print(f"test hook: sleeping {hook_sleep}s inside checkpoint write {tmp}", flush=True)
            time.sleep(hook_sleep)
        (tmp / "config.json").write_text(model_config_json)
        (tmp / "tokenizer.json").write_text(tokenizer_json)
        torch.save(optimizer_state, tmp / "optimizer.pt")
        torch.save(scheduler_state, tmp / "scheduler.pt")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)
            _fsync(f)
        # mkdtemp makes the directory private; checkpoints are meant to be shared.
        tmp.chmod(0o755)
    _fsync(job_dir)
    return final


def load(
    path: Path,
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any], dict[str, Any]]:
    model_state = load_file(str(path / "model.safetensors"))
    optimizer_state = torch.load(path / "optimizer.pt", weights_only=True)
    scheduler_state = torch.load(path / "scheduler.pt", weights_only=True)
    meta = json.loads((path / "meta.json").read_text())
    return model_state, optimizer_state, scheduler_state, meta


def prune(job_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints (0 keeps all)."""
    found = complete(job_dir)
    if keep_last <= 0 or len(found) <= keep_last:
        return []
    doomed = [f.path for f in found[:-keep_last]]
    for p in doomed:
        shutil.rmtree(p)
    return doomed
