"""Checkpoints that are complete, verified, or not used at all.

``<checkpoints>/<job>/r<L>_epoch_<E>_step_<S>/`` is a Hugging Face model folder (safetensors,
config.json, generation_config.json, tokenizer) plus ``trainer/`` (optimizer, scheduler, RNG)
and ``meta.json``, written last, holding the sha256 of every other file. It is written into
a hidden temp sibling and renamed into place. ``L`` is the run lineage: a run that resumes
keeps its checkpoint's lineage; ``checkpoint.resume: false`` starts the next one. Pruning
only ever removes older checkpoints of the current lineage; the newest one always stays.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: `halo job clean` lists checkpoints without torch
    import torch

from halo.atomic import staged_dir
from halo.hashing import sha256_file

NAME = re.compile(r"r(\d+)_epoch_(\d+)_step_(\d+)")
TRAINER = "trainer"
# A test hook: "STEP:SECONDS" sleeps in the middle of writing the checkpoint of STEP (after
# the weights), so a test can SIGKILL a trainer with a half-written checkpoint on disk.
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
    lineage: int
    epoch: int
    step: int


def name(lineage: int, epoch: int, step: int) -> str:
    return f"r{lineage}_epoch_{epoch}_step_{step}"


def read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and isinstance(meta.get("files"), dict) else None


def _found(p: Path) -> Found | None:
    m = NAME.fullmatch(p.name)
    return Found(p, int(m[1]), int(m[2]), int(m[3])) if m and p.is_dir() else None


def complete(job_dir: Path) -> list[Found]:
    """Checkpoints whose meta.json was written, oldest first (by lineage, then step)."""
    return [f for f in named(job_dir) if read_meta(f.path) is not None]


def latest(job_dir: Path) -> Found | None:
    found = complete(job_dir)
    return found[-1] if found else None


def partials(job_dir: Path) -> list[Path]:
    """Leftovers of interrupted writes: the hidden temp folders a write renames into place."""
    if not job_dir.is_dir():
        return []
    return sorted(
        p
        for p in job_dir.iterdir()
        if p.is_dir() and p.name.startswith(".r") and p.name.endswith(".tmp")
    )


def named(job_dir: Path) -> list[Found]:
    """Every checkpoint-named folder, complete or not, oldest first."""
    if not job_dir.is_dir():
        return []
    return sorted(
        (f for f in map(_found, job_dir.iterdir()) if f), key=lambda f: (f.lineage, f.step)
    )


def next_lineage(job_dir: Path) -> int:
    """One more than any lineage in the folder, set aside ones included."""
    if not job_dir.is_dir():
        return 1
    seen = [int(m[1]) for p in job_dir.iterdir() if (m := NAME.search(p.name))]
    return max(seen, default=0) + 1


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "meta.json")


def verify(path: Path) -> str | None:
    """None when every file matches meta.json's sha256 and every weight is finite; else why."""
    meta = read_meta(path)
    if meta is None:
        return "meta.json is missing or not a checkpoint record"
    files: dict[str, str] = meta["files"]
    on_disk = {str(p.relative_to(path)) for p in _files(path)}
    if missing := sorted(set(files) - on_disk):
        return f"missing {missing[0]}"
    for rel, digest in sorted(files.items()):
        if sha256_file(path / rel) != digest:
            return f"{rel} does not match its sha256 in meta.json"
    import torch
    from safetensors.torch import load_file

    for rel in sorted(f for f in files if f.endswith(".safetensors")):
        for key, t in load_file(str(path / rel)).items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"{rel}: {key} holds non-finite values"
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(
    job_dir: Path,
    dirname: str,
    write_model: Any,
    trainer_state: dict[str, Any],
    meta: dict[str, Any],
    hook_sleep: float = 0.0,
) -> Path:
    """``write_model(folder)`` writes the Hugging Face part; then trainer state and meta.json."""
    import torch

    final = job_dir / dirname
    with staged_dir(final) as tmp:
        write_model(tmp)
        if hook_sleep:
            print(f"test hook: sleeping {hook_sleep}s inside checkpoint write {tmp}", flush=True)
            time.sleep(hook_sleep)
        (tmp / TRAINER).mkdir()
        for key, value in trainer_state.items():
            torch.save(value, tmp / TRAINER / f"{key}.pt")
        files = {str(p.relative_to(tmp)): sha256_file(p) for p in _files(tmp)}
        record = {**meta, "files": files}
        (tmp / "meta.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        for p in tmp.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
            _fsync(p)
        # mkdtemp makes the directory private; checkpoints are meant to be shared.
        tmp.chmod(0o755)
    _fsync(job_dir)
    return final


def load_trainer_state(path: Path) -> dict[str, Any]:
    import torch

    return {p.stem: torch.load(p, weights_only=True) for p in sorted((path / TRAINER).glob("*.pt"))}


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def set_aside(path: Path) -> Path:
    """Move a checkpoint that failed its check out of the way (kept, never resumed)."""
    dest = path.with_name(f".{path.name}.bad")
    shutil.rmtree(dest, ignore_errors=True)
    path.rename(dest)
    return dest


def prune(job_dir: Path, lineage: int, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints of ``lineage`` (0 keeps all).

    Other lineages are never touched, and the newest checkpoint of this one always stays.
    """
    mine = [f for f in complete(job_dir) if f.lineage == lineage]
    if keep_last <= 0 or len(mine) <= keep_last:
        return []
    doomed = [f.path for f in mine[: -max(keep_last, 1)]]
    for p in doomed:
        shutil.rmtree(p)
    return doomed
