"""`halo clean` never removes a checkpoint, wherever it lies (held-out fault class: data loss).

A checkpoint is what it is, a folder holding the trainer's record (``meta.json`` with its
``files`` table), not a folder literally named ``checkpoints``: the audit lost
``build/ckpts/…`` and ``$HALO_SCRATCH/tmp/run/…``. Each case puts checkpoints somewhere
`halo clean` cleans, runs the real command (dry run first, then for real) and checks that
every checkpoint is byte for byte still there, that the dry run named exactly what the run
then removed, and that the rest of the caches went.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from support import halo

# Where checkpoints were put: (root, path below it). The first two are the audit's.
PLACES = (
    ("repo", "build/ckpts/sft/r1_epoch_0_step_4"),
    ("scratch", "tmp/run/grpo/r2_epoch_1_step_8"),
    ("repo", "dist/my-model"),  # any name: the record makes it a checkpoint
    ("scratch", "home/.cache/exp/final"),
    ("scratch", "export"),  # the cleaned folder itself is one
    ("scratch", "reports/job/.r1_epoch_0_step_6.bad"),  # set aside after failing its check
)
# Being written right now: the trainer's hidden temp folder has no record yet.
PARTIAL = ("scratch", "tmp/run/grpo/.r2_epoch_1_step_9.k3j2.tmp")
# A job folder a run holds (its lock), before its first checkpoint.
LIVE = ("scratch", "home/jobs/first-run")
# What must go: each is in a cleaned folder and holds no checkpoint.
DOOMED = (
    ("repo", ".pytest_cache/v/cache/nodeids"),
    ("repo", "halo/__pycache__/x.cpython-311.pyc"),
    ("repo", "build/lib/halo/x.py"),
    ("repo", "build/ckpts/sft/notes.txt"),
    ("repo", "dist/halo-0.whl"),
    ("scratch", "tmp/run/grpo/log.txt"),
    ("scratch", "tmp/other/x"),
    ("scratch", "home/.cache/pip/wheel"),
    ("scratch", "reports/cpu.xml"),
    # a meta.json that is not a checkpoint's record does not protect its folder
    ("scratch", "tmp/not-a-checkpoint/meta.json"),
)


def _checkpoint(folder: Path, step: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / "model.safetensors"
    weights.write_bytes(b"weights %d" % step)
    (folder / "trainer").mkdir(exist_ok=True)
    (folder / "trainer" / "optimizer.pt").write_bytes(b"state")
    files = {
        "model.safetensors": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "trainer/optimizer.pt": hashlib.sha256(b"state").hexdigest(),
    }
    record = {"step": step, "epoch": 0, "lineage": 1, "files": files}
    (folder / "meta.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    roots = {"repo": tmp_path / "repo", "scratch": tmp_path / "scratch"}
    (roots["repo"] / "pins").mkdir(parents=True)
    (roots["repo"] / "images").mkdir()
    (roots["repo"] / "images" / "images.yaml").write_text("images: {}\n")
    for step, (root, rel) in enumerate(PLACES, start=1):
        _checkpoint(roots[root] / rel, step)
    partial = roots[PARTIAL[0]] / PARTIAL[1]
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"half written")
    live = roots[LIVE[0]] / LIVE[1]
    live.mkdir(parents=True)
    (live / ".halo-run.lock").write_text('{"host": "n1", "pid": 1}\n')
    (live / "metrics.jsonl").write_text("{}\n")
    for root, rel in DOOMED:
        path = roots[root] / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"not": "a record"}\n' if path.name == "meta.json" else "x\n")
    # A link out of a cleaned folder to a checkpoint elsewhere: the link goes, never its target.
    _checkpoint(tmp_path / "elsewhere" / "ck", 9)
    (roots["scratch"] / "tmp" / "link-to-ck").symlink_to(tmp_path / "elsewhere" / "ck")
    return roots


def _clean(roots: dict[str, Path], *extra: str):  # type: ignore[no-untyped-def]
    env = {"HALO_REPO": str(roots["repo"]), "HALO_SCRATCH": str(roots["scratch"])}
    return halo("clean", *extra, cwd=roots["repo"], env={**os.environ, **env})


def test_clean_keeps_checkpoints_in_every_place_and_removes_the_rest(
    tree: dict[str, Path], tmp_path: Path
) -> None:
    protected = [tree[r] / rel for r, rel in (*PLACES, PARTIAL, LIVE)] + [tmp_path / "elsewhere"]
    before = {p: _snapshot(p) for p in protected}

    dry = _clean(tree, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    would = {
        line.removeprefix("would remove ")
        for line in dry.stdout.splitlines()
        if line.startswith("would remove ")
    }
    kept = {
        line.removeprefix("would keep ").removesuffix(" (a checkpoint)")
        for line in dry.stdout.splitlines()
        if line.startswith("would keep ")
    }
    assert kept == {str(tree[r] / rel) for r, rel in (*PLACES, PARTIAL, LIVE)}, dry.stdout
    for root, rel in DOOMED:  # each doomed file is named, or a folder above it is
        path = tree[root] / rel
        assert any(str(path) == w or str(path).startswith(w + "/") for w in would), (
            path,
            dry.stdout,
        )
    assert {p: _snapshot(p) for p in protected} == before, "the dry run changed something"
    assert all((tree[r] / rel).exists() for r, rel in DOOMED), "the dry run removed something"

    run = _clean(tree)
    assert run.returncode == 0, run.stderr
    removed = {
        line.removeprefix("removed ")
        for line in run.stdout.splitlines()
        if line.startswith("removed ")
    }
    assert removed == would, "the run removed other paths than the dry run listed"
    assert {p: _snapshot(p) for p in protected} == before, "a checkpoint was touched"
    for root, rel in DOOMED:
        assert not (tree[root] / rel).exists(), rel
    assert not (tree["scratch"] / "tmp" / "link-to-ck").is_symlink()
    assert "checkpoints are never removed" in run.stdout.splitlines()[-1]

    again = _clean(tree, "--dry-run")  # what is left is only checkpoints and the folders above
    assert not [line for line in again.stdout.splitlines() if line.startswith("would remove ")]
