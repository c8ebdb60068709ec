"""The trainer under faults: one line, the right exit code, no traceback, nothing half-written.

Fault classes, as in tests/toolchain/test_bad_input.py: two runs on one job folder (and a
dead run's lock); a checkpoint that is not exactly its record (an unlisted file, a symlink,
an empty or escaping record, wrong types, a corrupt file whose hash matches); what the run
writes (a file in the way, a name too long, a file-size limit); what it loads (a tokenizer
that is JSON but not a tokenizer, a model config its class rejects or whose model fails its
first forward); numbers out of range.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halo.train.checkpoints import checkpoint, joblock

from .conftest import EXAMPLES, REPO, TOKENIZER, halo_env, outputs, run_halo, train_here

pytestmark = pytest.mark.cpu

SFT = EXAMPLES / "sft" / "config.yaml"
TWO = ["--training.max_steps=2", "--checkpoint.every_steps=1", "--checkpoint.keep_last=0"]


def job(tmp: Path) -> Path:
    return tmp / "ck" / "tiny-sft"


def trainer_cmd(tmp: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "halo.train.run", "--method", "sft", "--config", str(SFT),
        *outputs(tmp), *extra,
    ]  # fmt: skip


def main_here(tmp: Path, *extra: str) -> tuple[int, str]:
    """``python -m halo.train.run``'s main in this process (no interpreter start, which costs
    more than the case): (exit code, stderr). Its signal handling is put back afterwards."""
    import contextlib
    import io
    import signal

    from halo.train import run

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            argv = ["--method", "sft", "--config", str(SFT), *outputs(tmp), *extra]
            rc = run.main(argv)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    return rc, err.getvalue()


def trainer(tmp: Path, *extra: str, prefix: str = "") -> subprocess.CompletedProcess[str]:
    """`python -m halo.train.run` as the launcher starts it (``prefix``: shell before exec)."""
    cmd = " ".join(f"'{a}'" for a in trainer_cmd(tmp, *extra))
    return subprocess.run(
        ["bash", "-c", f"{prefix}exec {cmd}"],
        env=halo_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [x for x in stderr.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("halo: error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


def no_partials(tmp: Path) -> None:
    """Nothing half-written: no staging folder and no checkpoint without its record."""
    d = job(tmp)
    if not d.is_dir():
        return
    left = [p.name for p in d.iterdir() if p.name.endswith(".tmp")]
    assert not left, left
    for f in checkpoint.named(d):
        assert checkpoint.verify(f.path) is None, f.path


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job folder with r1 step 1 and r1 step 2."""
    tmp = tmp_path_factory.mktemp("two")
    rc, out = train_here("sft", SFT, tmp, *TWO)
    assert rc == 0, out
    return tmp


def copy_of(src: Path, tmp: Path) -> Path:
    shutil.copytree(src / "ck", tmp / "ck", symlinks=True)
    return tmp


def newest(tmp: Path) -> Path:
    return job(tmp) / "r1_epoch_0_step_2"


def rewrite_meta(path: Path, **changes: object) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta.update(changes)
    (path / "meta.json").write_text(json.dumps(meta))


# --- two runs, one job folder ----------------------------------------------------------


def test_a_second_trainer_on_a_busy_job_folder_is_refused_and_the_first_finishes(
    tmp_path: Path,
) -> None:
    # The first run pauses inside its step-1 checkpoint write (its .tmp folder on disk) until
    # the second has been refused: the gate, not a guess of how fast this machine is.
    gate = tmp_path / "gate"
    env = halo_env(
        **{checkpoint.TEST_HOOK_SLEEP_ENV: "1:600", checkpoint.TEST_HOOK_GATE_ENV: str(gate)}
    )
    first = subprocess.Popen(
        trainer_cmd(tmp_path, *TWO), env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("test hook: sleeping"):
            break
    else:
        pytest.fail(f"the first trainer never reached its checkpoint: {first.communicate()}")
    before = sorted(p.name for p in job(tmp_path).iterdir())
    assert any(n.endswith(".tmp") for n in before), before
    try:
        second = trainer(tmp_path, *TWO)
    finally:
        gate.touch()
    line = one_error_line(second.stderr)
    assert second.returncode == 2, second.stderr
    assert "in use by another run" in line and f"pid {first.pid}" in line, line
    assert f"host {socket.gethostname()}" in line, line
    assert sorted(p.name for p in job(tmp_path).iterdir()) == before  # touched nothing
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    names = [f.path.name for f in checkpoint.named(job(tmp_path))]
    assert names == ["r1_epoch_0_step_1", "r1_epoch_0_step_2"], names
    assert all(checkpoint.verify(job(tmp_path) / n) is None for n in names)
    assert not (job(tmp_path) / joblock.LOCK_NAME).exists()  # released at the end


def test_a_lock_from_a_dead_process_is_taken_over_and_its_partial_removed(
    tmp_path: Path,
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is free now
    d = job(tmp_path)
    d.mkdir(parents=True)
    owner = {"host": socket.gethostname(), "pid": dead.pid, "boot_id": "", "start_time": ""}
    (d / joblock.LOCK_NAME).write_text(json.dumps(owner))
    (d / ".r1_epoch_0_step_1.abcd1234.tmp").mkdir()  # the dead run's partial write
    rc, out = train_here("sft", SFT, tmp_path, "--training.max_steps=1")
    assert rc == 0, out
    assert f"job lock: took over {d / joblock.LOCK_NAME} from a dead run" in out, out
    assert f"pid {dead.pid}) is gone" in out
    assert "removing partial write .r1_epoch_0_step_1.abcd1234.tmp" in out
    no_partials(tmp_path)


def test_a_live_lock_of_another_host_is_refused_naming_its_slurm_job_until_it_goes_stale(
    tmp_path: Path,
) -> None:
    d = job(tmp_path)
    d.mkdir(parents=True)
    lock = d / joblock.LOCK_NAME
    owner = {"host": "node-elsewhere", "pid": 1, "slurm_job_id": "4242"}
    lock.write_text(json.dumps(owner))
    rc, out = train_here("sft", SFT, tmp_path, "--training.max_steps=1")
    assert rc == 2 and "(host node-elsewhere, pid 1, Slurm job 4242)" in out, out
    assert sorted(p.name for p in d.iterdir()) == [joblock.LOCK_NAME]
    # Its heartbeat stops (the node died): after the timeout the folder is taken over.
    old = time.time() - joblock.STALE_AFTER_S - 60
    os.utime(lock, (old, old))
    rc, out = train_here("sft", SFT, tmp_path, "--training.max_steps=1")
    assert rc == 0 and "its heartbeat (host node-elsewhere" in out, out


def test_the_heartbeat_keeps_a_lock_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(joblock, "HEARTBEAT_S", 0.05)
    with joblock.held(tmp_path) as lock:
        old = time.time() - 1000
        os.utime(lock.path, (old, old))
        time.sleep(0.5)
        assert time.time() - lock.path.stat().st_mtime < 5
        assert joblock.owned(tmp_path)
    assert not lock.path.exists()


# --- a checkpoint is exactly its record -----------------------------------------------


def _unlisted(p: Path) -> None:
    shutil.copy(p / "model.safetensors", p / "model-extra.safetensors")


def _secret_link(p: Path) -> None:
    secret = p.parents[2] / "secret.txt"
    secret.write_text("TOKEN-SECRET\n")
    (p / "notes.txt").symlink_to(secret)


def _listed_link(p: Path) -> None:
    secret = p.parents[2] / "secret.txt"
    shutil.copy(p / "tokenizer.json", secret)
    (p / "tokenizer.json").unlink()
    (p / "tokenizer.json").symlink_to(secret)  # same bytes, same hash: still refused


def _linked_folder(p: Path) -> None:
    shutil.move(p / "trainer", p.parents[2] / "elsewhere")
    (p / "trainer").symlink_to(p.parents[2] / "elsewhere")


def _corrupt_config(p: Path) -> None:
    (p / "config.json").write_text('{"model_type": "no-such-model"}')
    meta = json.loads((p / "meta.json").read_text())
    meta["files"]["config.json"] = {
        "sha256": checkpoint.sha256_file(p / "config.json"),
        "size": (p / "config.json").stat().st_size,
    }
    (p / "meta.json").write_text(json.dumps(meta))


DAMAGE = {
    "an unlisted safetensors": (_unlisted, "model-extra.safetensors is not listed in meta.json"),
    "an empty record": (lambda p: rewrite_meta(p, files={}), "meta.json lists no files"),
    "a symlink to a secret": (_secret_link, "notes.txt is a symbolic link"),
    "a listed file as a symlink": (_listed_link, "tokenizer.json is a symbolic link"),
    "a symlinked folder": (_linked_folder, "trainer is a symbolic link"),
    "a step of the wrong type": (lambda p: rewrite_meta(p, step="2"), "step is '2', expected int"),
    "a lineage of the wrong type": (
        lambda p: rewrite_meta(p, lineage=[1]),
        "lineage is [1], expected int",
    ),
    "files of the wrong type": (lambda p: rewrite_meta(p, files=["x"]), "not a checkpoint record"),
    "an escaping name": (
        lambda p: rewrite_meta(p, files={"../../secret.txt": "0" * 64}),
        "'../../secret.txt' is not a file name inside the checkpoint",
    ),
    "an entry of the wrong type": (
        lambda p: rewrite_meta(
            p, files={**json.loads((p / "meta.json").read_text())["files"], "config.json": 7}
        ),
        "the entry of config.json is not a sha256 and size",
    ),
    "a corrupt config.json whose hash matches": (_corrupt_config, "config.json is not a usable"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_checkpoint_that_is_not_exactly_its_record_fails_verification(
    two: Path, tmp_path: Path, case: str
) -> None:
    damage, reason = DAMAGE[case]
    tmp = copy_of(two, tmp_path)
    damage(newest(tmp))
    problem = checkpoint.verify(newest(tmp))
    assert problem is not None and reason in problem, problem


@pytest.mark.parametrize(
    "case", ["an unlisted safetensors", "a symlink to a secret", "a step of the wrong type"]
)
def test_resume_sets_a_damaged_checkpoint_aside_in_one_line_and_never_loads_it(
    two: Path, tmp_path: Path, case: str
) -> None:
    damage, reason = DAMAGE[case]
    tmp = copy_of(two, tmp_path)
    damage(newest(tmp))
    rc, out = train_here("sft", SFT, tmp, *TWO)
    assert rc == 0, out
    skipped = [x for x in out.splitlines() if "skipping r1_epoch_0_step_2" in x]
    assert len(skipped) == 1 and reason in skipped[0], out
    assert "(step 1)" in out  # resumed from the one before: the extra file was never loaded
    assert (job(tmp) / ".r1_epoch_0_step_2.bad").is_dir()
    assert checkpoint.verify(newest(tmp)) is None  # step 2 written again, exactly its record


@pytest.mark.parametrize("case", ["a symlink to a secret", "a listed file as a symlink"])
def test_export_never_copies_through_a_link(two: Path, tmp_path: Path, case: str) -> None:
    damage, reason = DAMAGE[case]
    tmp = copy_of(two, tmp_path)
    damage(newest(tmp))
    out = tmp_path / "served"
    r = run_halo("export", str(newest(tmp)), str(out))
    assert r.returncode == 2 and reason in one_error_line(r.stderr), r.stderr
    assert not out.exists()
    assert not any("TOKEN-SECRET" in p.read_text() for p in tmp_path.rglob("served*"))


def test_export_copies_only_listed_files_as_regular_files(two: Path, tmp_path: Path) -> None:
    from halo.train.checkpoints import export

    served = export.export(newest(two), tmp_path / "served")
    meta = json.loads((newest(two) / "meta.json").read_text())
    want = sorted(r for r in meta["files"] if not r.startswith("trainer/"))
    got = sorted(str(p.relative_to(served)) for p in served.rglob("*"))
    assert got == want
    assert all(p.is_file() and not p.is_symlink() for p in served.rglob("*"))


def test_records_hold_sha256_and_size(two: Path) -> None:
    meta = json.loads((newest(two) / "meta.json").read_text())
    for rel, entry in meta["files"].items():
        assert entry["size"] == (newest(two) / rel).stat().st_size
        assert entry["sha256"] == checkpoint.sha256_file(newest(two) / rel)


def test_pruning_never_follows_a_symlinked_checkpoint_folder(two: Path, tmp_path: Path) -> None:
    tmp = copy_of(two, tmp_path)
    other = tmp_path / "other-run"
    shutil.copytree(job(tmp) / "r1_epoch_0_step_1", other)
    (job(tmp) / "r1_epoch_0_step_0").symlink_to(other)
    rc, out = train_here("sft", SFT, tmp, "--training.max_steps=3", "--checkpoint.keep_last=1")
    assert rc == 0, out
    assert (job(tmp) / "r1_epoch_0_step_0").is_symlink() and checkpoint.verify(other) is None
    assert [f.path.name for f in checkpoint.named(job(tmp))] == ["r1_epoch_0_step_3"]


# --- the launcher's net -----------------------------------------------------------------


def _file_in_the_way(tmp: Path) -> list[str]:
    (tmp / "ck").mkdir()
    (tmp / "ck" / "tiny-sft").write_text("not a folder\n")
    return []


def _bad_tokenizer(content: str) -> object:
    def make(tmp: Path) -> list[str]:
        shutil.copytree(TOKENIZER, tmp / "tok")
        (tmp / "tok" / "tokenizer.json").write_text(content)
        return [f"--model.tokenizer={tmp / 'tok'}"]

    return make


NET = {
    "a file where the job folder should be": (
        _file_in_the_way,
        2,
        "tiny-sft exists and is not a directory",
    ),
    "a job name too long for the file system": (
        lambda t: ["--runtime.job_name=" + "j" * 300],
        2,
        "runtime.job_name: jjjj",
    ),
    "a tokenizer.json that is JSON but not a tokenizer": (
        _bad_tokenizer('{"version": "1.0"}'),
        2,
        "tok: cannot load its tokenizer.json",
    ),
    "a tokenizer.json that is a JSON list": (_bad_tokenizer("[1, 2]"), 2, "tok: cannot load"),
    "model.config its class rejects": (
        lambda t: ["--model.config.num_attention_heads=3"],
        2,
        "model.config: not a usable model config",
    ),
    "model.config of the wrong type": (
        lambda t: ['--model.config.hidden_size="wide"'],
        2,
        "model.config: not a usable model config",
    ),
    "model.config whose model cannot be built": (
        lambda t: ["--model.config.hidden_act=no-such-activation"],
        2,
        "model.config: cannot build the model",
    ),
    "model.config whose model fails its first forward": (
        lambda t: ["--model.config.rope_theta=-1.0"],
        2,
        "model.config: the model's first forward gives non-finite logits",
    ),
    "a seed of 2**64": (
        lambda t: [f"--training.seed={2**64}"],
        2,
        "training.seed: Input should be less than",
    ),
    "max_steps huge": (lambda t: [f"--training.max_steps={10**30}"], 2, "training.max_steps"),
    "an lr that overflows fp32": (lambda t: ["--lr=1e39"], 2, "optim.lr"),
}


@pytest.mark.parametrize("case", sorted(NET))
def test_the_trainer_answers_a_bad_input_in_one_line(tmp_path: Path, case: str) -> None:
    make, code, expected = NET[case]
    extra = make(tmp_path)
    rc, err = main_here(tmp_path, "--training.max_steps=1", *extra)
    line = one_error_line(err)
    assert rc == code and expected in line, err
    no_partials(tmp_path)
    assert not (job(tmp_path) / joblock.LOCK_NAME).exists()


# 600 KiB stops the weights (safetensors), 1600 KiB the optimizer state (torch.save).
@pytest.mark.parametrize("blocks", [600, 1600])
def test_a_file_size_limit_during_a_checkpoint_is_one_line_exit_1_and_nothing_half_written(
    tmp_path: Path, blocks: int
) -> None:
    # CPython ignores SIGXFSZ, so the write fails with EFBIG instead of killing the process.
    r = trainer(tmp_path, "--training.max_steps=1", prefix=f"ulimit -f {blocks}; ")
    line = one_error_line(r.stderr)
    assert r.returncode == 1, r.stderr
    # safetensors passes EFBIG on; torch.save does not, so the line names the limit.
    why = "file too large" if blocks == 600 else f"ulimit -f) is {blocks * 1024} bytes"
    assert "step 1: " in line and "r1_epoch_0_step_1: " in line and why in line, line
    assert [p.name for p in job(tmp_path).iterdir()] == []  # no checkpoint, no .tmp, no lock
