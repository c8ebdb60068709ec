"""Checkpoints that are complete, verified, or not used at all.

``<checkpoints>/<job>/r<L>_epoch_<E>_step_<S>/`` is a Hugging Face model folder (safetensors,
config.json, generation_config.json, tokenizer) plus ``trainer/`` (optimizer, scheduler, RNG)
and ``meta.json``, written last, holding the sha256 and size of every other file: the record.
A checkpoint is exactly its record: an unlisted file, a missing one, a symlink anywhere or an
empty record fails verification, and only listed files are ever loaded or exported. It is written into
a hidden temp sibling and renamed into place. ``L`` is the run lineage: a run that resumes
keeps its checkpoint's lineage; ``checkpoint.resume: false`` starts the next one. Pruning
only ever removes older checkpoints of the current lineage; the newest one always stays.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
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
TEST_HOOK_GATE_ENV = "HALO_TEST_HOOK_CHECKPOINT_GATE"  # ends the pause early once it exists


def _hook_pause(seconds: float, gate: str | None) -> None:
    """The test hook's pause: ``seconds``, or until the gate file appears (a test that must
    act while the write is open, on a machine of any speed, opens the gate when done)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gate and Path(gate).exists():
            return
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


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
    # A symlink is never a checkpoint: pruning or setting it aside would act on another folder.
    m = NAME.fullmatch(p.name)
    ok = m and p.is_dir() and not p.is_symlink()
    return Found(p, int(m[1]), int(m[2]), int(m[3])) if m and ok else None


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


# What a record's fields must be (a wrong type is damage, not a traceback later on resume).
META_TYPES: dict[str, type | tuple[type, ...]] = {
    "step": int,
    "epoch": int,
    "lineage": int,
    "global_batch_size": int,
    "seed": int,
    "world_size": int,
    "method": str,
    "job_name": str,
    "reason": str,
    "loss": (int, float, type(None)),
}


def confined(rel: str) -> bool:
    """A record's file name names a file inside the checkpoint (halo.confine's rule), in one
    spelling per file: no empty or ``.`` parts either."""
    from halo.confine import name_problem

    return name_problem(rel) is None and all(p not in ("", ".") for p in rel.split("/"))


def _entry(value: Any) -> tuple[str, int | None] | None:
    """(sha256, size) of a record entry: {"sha256", "size"}, or a bare sha256 (older records)."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, dict) and isinstance(value.get("sha256"), str):
        size = value.get("size")
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            return value["sha256"], size
    return None


def listed(path: Path) -> list[str]:
    """The record's file names (call after ``verify``; [] without a record)."""
    meta = read_meta(path)
    return sorted(meta["files"]) if meta else []


def _walk(path: Path) -> tuple[set[str], str | None]:
    """Every regular file under ``path`` (relative names), or why the tree is not plain:
    a symlink or special file anywhere, the folder itself included."""
    if path.is_symlink() or not path.is_dir():
        return set(), f"{path.name} is a symbolic link or not a folder"
    found: set[str] = set()
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            full = Path(root, n)
            rel = str(full.relative_to(path))
            mode = full.lstat().st_mode
            if stat.S_ISLNK(mode):
                return found, f"{rel} is a symbolic link"
            if stat.S_ISREG(mode):
                found.add(rel)
            elif not stat.S_ISDIR(mode):
                return found, f"{rel} is not a regular file"
    found.discard("meta.json")
    return found, None


def _meta_problem(meta: dict[str, Any]) -> str | None:
    for key, want in META_TYPES.items():
        value = meta.get(key)
        if key not in meta and key == "loss":
            continue
        if isinstance(value, bool) or not isinstance(value, want):
            names = want.__name__ if isinstance(want, type) else "a number"
            return f"meta.json: {key} is {value!r}, expected {names}"
    if meta["step"] < 0 or meta["lineage"] < 1 or meta["epoch"] < 0:
        return "meta.json: step, epoch or lineage out of range"
    return None


def verify(path: Path) -> str | None:
    """None when the folder holds exactly the record's files, each matching its sha256 and
    size, the record's fields have their types, config.json loads and every weight is
    finite; else why."""
    meta = read_meta(path)
    if meta is None:
        return "meta.json is missing or not a checkpoint record"
    files: dict[str, Any] = meta["files"]
    if not files:
        return "meta.json lists no files"
    if problem := _meta_problem(meta):
        return problem
    if bad := sorted(rel for rel in files if not isinstance(rel, str) or not confined(rel)):
        return f"meta.json: {bad[0]!r} is not a file name inside the checkpoint"
    on_disk, problem = _walk(path)
    if problem:
        return problem
    if missing := sorted(set(files) - on_disk):
        return f"missing {missing[0]}"
    if extra := sorted(on_disk - set(files)):
        return f"{extra[0]} is not listed in meta.json"
    for rel, value in sorted(files.items()):
        entry = _entry(value)
        if entry is None:
            return f"meta.json: the entry of {rel} is not a sha256 and size"
        digest, size = entry
        actual = (path / rel).lstat().st_size
        if size is not None and actual != size:
            # Said the same way as a hash mismatch (the size is the cheap half of that check).
            return f"{rel} does not match its sha256 in meta.json ({actual} bytes, not {size})"
        if sha256_file(path / rel) != digest:
            return f"{rel} does not match its sha256 in meta.json"
    return _content_problem(path, sorted(files))


def _content_problem(path: Path, files: list[str]) -> str | None:
    """What a matching hash cannot prove: the files load, and the weights are finite."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if "config.json" in files:
        try:
            conf = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            return f"config.json is not JSON ({exc})"
        if not isinstance(conf, dict) or not isinstance(conf.get("model_type"), str):
            return "config.json is not a model config (no model_type)"
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:  # any transformers error: the file is damage, one line
            return f"config.json is not a usable model config ({' '.join(str(exc).split())[:120]})"
    for rel in (f for f in files if f.endswith(".safetensors")):
        try:
            weights = load_file(str(path / rel))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            return f"{rel} is not a safetensors file ({' '.join(str(exc).split())[:120]})"
        for key, t in weights.items():
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
    final = job_dir / dirname
    from safetensors import SafetensorError

    try:
        return _write(final, write_model, trainer_state, meta, hook_sleep)
    except (SafetensorError, RuntimeError) as exc:
        # safetensors and torch.save wrap the OS's error (a full disk, a file-size limit) in
        # their own types: give it back as the OSError it is, naming the checkpoint.
        text = " ".join(str(exc).split())
        m = re.search(r"os error (\d+)", text)
        if m:
            raise OSError(int(m[1]), os.strerror(int(m[1])), str(final)) from None
        import resource

        # torch.save names no errno ("unexpected pos ..."): name the likely cause when set.
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        hint = f"; the file-size limit (ulimit -f) is {limit} bytes" if limit >= 0 else ""
        raise OSError(
            errno.EIO, f"cannot write the checkpoint ({text[:160]}){hint}", str(final)
        ) from None


def _write(
    final: Path,
    write_model: Any,
    trainer_state: dict[str, Any],
    meta: dict[str, Any],
    hook_sleep: float,
) -> Path:
    import torch

    job_dir = final.parent
    with staged_dir(final) as tmp:
        write_model(tmp)
        if hook_sleep:
            print(f"test hook: sleeping {hook_sleep}s inside checkpoint write {tmp}", flush=True)
            _hook_pause(hook_sleep, os.environ.get(TEST_HOOK_GATE_ENV))
        (tmp / TRAINER).mkdir()
        for key, value in trainer_state.items():
            torch.save(value, tmp / TRAINER / f"{key}.pt")
        files = {
            str(p.relative_to(tmp)): {"sha256": sha256_file(p), "size": p.stat().st_size}
            for p in _files(tmp)
        }
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
    """The listed trainer/*.pt files (only what the record holds is ever loaded)."""
    import torch

    names = [r for r in listed(path) if r.startswith(f"{TRAINER}/") and r.endswith(".pt")]
    return {
        Path(r).stem: _load(path / r, lambda p: torch.load(p, weights_only=True)) for r in names
    }


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The listed top-level *.safetensors files, merged."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for rel in (r for r in listed(path) if "/" not in r and r.endswith(".safetensors")):
        state.update(_load(path / rel, lambda p: load_file(str(p))))
    return state


def _load(p: Path, load: Any) -> Any:
    from halo.errors import HaloError

    try:
        return load(p)
    except OSError:
        raise
    except Exception as exc:  # any loader error is this file's damage: one line
        raise HaloError(f"{p}: cannot load ({' '.join(str(exc).split())[:200]})") from None


def set_aside(path: Path) -> Path:
    """Move a checkpoint that failed its check out of the way (kept, never resumed; an older
    set-aside copy of the same name is kept too)."""
    dest = path.with_name(f".{path.name}.bad")
    n = 1
    while dest.exists() or dest.is_symlink():
        dest, n = path.with_name(f".{path.name}.bad{n}"), n + 1
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
        if p.is_symlink():  # never follow one out of the job folder (named() skips them)
            continue
        shutil.rmtree(p)
    return doomed
