"""`halo clean`: drop caches, test scratch and trackers' local files; never a checkpoint.

Removed: the checkout's tool caches (`__pycache__`, `.pytest_cache`, `.ruff_cache`, `build/`,
`dist/`, `*.egg-info`) and, under $HALO_SCRATCH, what tiers and tests leave (`reports/`,
`tmp/`, `home/`, `export/`). Then the trackers' local files, anywhere in the checkout (`runs/`
included) and in scratch, outside checkpoints: W&B's `wandb/` folders (recognised by what
wandb writes there: `latest-run`, `debug.log`, `run-…`/`offline-run-…` folders; a Python
package named wandb is not one) and TensorBoard's event files (`events.out.tfevents.*`; the
folder holding them when it holds nothing else, else the files alone, so that a run's
`metrics.jsonl` beside them stays). Kept, always: every checkpoint inside those, recognised by
what it is, not by where it lies (a folder holding a trainer's checkpoint record, `meta.json`;
one being written or set aside, named as the trainer names them; a job folder a run holds the
lock of; a folder named `checkpoints`),
with the folders above it; the seeded Hugging Face cache (`hf/`), the rest of `runs/`, and the
nox environments (`.nox/`: slow to rebuild; delete it by hand if you mean to). The dry run
lists exactly what a run removes and what it keeps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO_CACHES = (".pytest_cache", ".ruff_cache", "build", "dist")
SCRATCH_CACHES = ("reports", "tmp", "home", "export")
PROTECTED = "checkpoints"
_SKIP_WALK = {".git", ".nox", ".venv", "runs", "node_modules"}
# The trainer's names (halo.train.checkpoints.checkpoint.NAME): a checkpoint, the hidden temp folder it is
# written into (``.r1_epoch_0_step_5.<random>.tmp``, no record yet), one set aside (``.bad``).
_CHECKPOINT_NAME = re.compile(r"\.?r\d+_epoch_\d+_step_\d+(\..+)?")
RECORD = "meta.json"
# A job folder a run is using holds the run's lock (halo.train.checkpoints.joblock.LOCK_NAME): all of it
# stays, the checkpoint being written and the lock included.
JOB_LOCK = ".halo-run.lock"
# The trackers' local files. wandb's folder holds these (wandb/sdk/lib/filenames and its run
# folder names); TensorBoard's SummaryWriter names every event file so.
WANDB = "wandb"
_WANDB_ENTRY = re.compile(r"latest-run|debug(-internal)?\.log|(offline-)?run-\d{8}_\d{6}-\w+")
_TFEVENTS = re.compile(r"events\.out\.tfevents\..+")
# Not searched for trackers' files: version control, environments, and in scratch the seeded
# caches and the stacks' venvs (large, and a venv's site-packages/wandb is a package).
_SKIP_TRACKERS = {".git", ".nox", ".venv", "node_modules", "hf", "stacks"}


def has_checkpoint_record(folder: Path) -> bool:
    """A trainer checkpoint's record: ``meta.json``, an object with a ``files`` table.

    The same test as halo.train.checkpoints.checkpoint.read_meta (which needs torch to import), kept
    lenient on purpose: a damaged record is still a checkpoint someone may want back.
    """
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and isinstance(record.get("files"), dict)


def is_checkpoint(folder: Path) -> bool:
    """A checkpoint, one being written or set aside, or a job folder a run holds."""
    if folder.name == PROTECTED or _CHECKPOINT_NAME.fullmatch(folder.name):
        return True
    return os.path.lexists(folder / JOB_LOCK) or has_checkpoint_record(folder)


@dataclass(frozen=True)
class Removal:
    path: Path  # the cache or scratch folder cleaned
    removed: tuple[Path, ...]  # what goes: ``(path,)`` unless it holds checkpoints
    kept: tuple[Path, ...]  # checkpoint folders found inside and left in place


def _checkpoints_in(path: Path) -> list[Path]:
    """Every checkpoint at or below ``path`` (links are not followed: removing one is safe)."""
    if path.is_symlink() or not path.is_dir():
        return []
    if is_checkpoint(path):
        return [path]
    found = []
    for dirpath, dirnames, _ in os.walk(path):
        here = Path(dirpath)
        for name in list(dirnames):
            sub = here / name
            if not sub.is_symlink() and is_checkpoint(sub):
                found.append(sub)
                dirnames.remove(name)  # nothing inside a checkpoint is ours to judge
    return sorted(found)


def _plan(path: Path, keep: list[Path]) -> list[Path]:
    """What to remove of ``path`` so that every folder in ``keep`` (and those above it) stays."""
    if not keep:
        return [path]
    if path in keep:
        return []
    out: list[Path] = []
    for child in sorted(path.iterdir()):
        inner = [k for k in keep if k == child or child in k.parents]
        out += _plan(child, inner) if inner else [child]
    return out


def plan(path: Path) -> Removal:
    keep = _checkpoints_in(path)
    return Removal(path, tuple(_plan(path, keep)), tuple(keep))


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def is_wandb_folder(folder: Path) -> bool:
    """A folder wandb wrote (its run folders, logs, latest-run link), not a package named so."""
    if folder.name != WANDB or (folder / "__init__.py").exists():
        return False
    return any(_WANDB_ENTRY.fullmatch(child.name) for child in folder.iterdir())


def _only_events(folder: Path) -> bool:
    """TensorBoard's folder: event files, and nothing else but folders of the same kind (a
    writer's log_dir with its eval/ beside); a folder that only holds such folders is not
    one (it is where someone keeps them)."""
    found = False
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            if not _only_events(child):
                return False
        elif _TFEVENTS.fullmatch(child.name) and not child.is_symlink():
            found = True
        else:
            return False
    return found


def tracker_files(roots: list[Path]) -> list[Path]:
    """wandb folders and TensorBoard event folders (or files) under ``roots``, none inside a
    checkpoint, a Python environment or a folder in _SKIP_TRACKERS."""
    found: list[Path] = []
    stack = [r for r in roots if r.is_dir() and not r.is_symlink()]
    while stack:
        folder = stack.pop()
        events = []
        for child in sorted(folder.iterdir()):
            if child.is_symlink():
                continue
            if child.is_dir():
                if child.name in _SKIP_TRACKERS or (child / "pyvenv.cfg").exists():
                    continue
                if is_checkpoint(child):
                    continue  # nothing inside a checkpoint is ours to judge
                if is_wandb_folder(child) or _only_events(child):
                    found.append(child)
                else:
                    stack.append(child)
            elif _TFEVENTS.fullmatch(child.name):
                events.append(child)
        found += events  # beside other files (a run's metrics.jsonl): the event files alone
    return sorted(found)


def targets(repo: Path, scratch: Path) -> list[Path]:
    found = [repo / name for name in REPO_CACHES if os.path.lexists(repo / name)]
    stack = [repo]
    while stack:
        folder = stack.pop()
        for child in folder.iterdir():
            if not child.is_dir() or child.is_symlink() or child.name in _SKIP_WALK:
                continue
            if child.name == "__pycache__" or child.name.endswith(".egg-info"):
                found.append(child)
            elif child not in found:
                stack.append(child)
    found += [scratch / name for name in SCRATCH_CACHES if os.path.lexists(scratch / name)]
    # Trackers' files not already inside a cache that goes whole.
    for path in tracker_files([repo, scratch]):
        if path not in found and not any(f in path.parents for f in found):
            found.append(path)
    return sorted(found)


def clean(repo: Path, scratch: Path, dry_run: bool = False) -> list[Removal]:
    """Remove the caches (or, with ``dry_run``, only say what would go); checkpoints stay."""
    plans = [plan(p) for p in targets(repo, scratch)]
    if not dry_run:
        for p in plans:
            for path in p.removed:
                _delete(path)
    return plans
