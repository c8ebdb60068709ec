"""The Makefile's targets, the shared docker run flags, `halo docs check` and `halo clean`."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, halo

from halo.devtools.clean import clean
from halo.devtools.doclinks import anchors, check, slug
from halo.testing.container import RunSpec, docker_run_args

TARGETS = (
    "train", "seed-hf-cache", "ecr-public-login", "push-public-all", "push-public-blackwell",
    "push-public-hopper", "push-public-vllm", "push-public-sglang", "format", "precommit",
    "docs", "diagrams", "install", "clean",
)  # fmt: skip


def _make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.skip("needs GNU make (.ci/run installs it)")
    # `make train` asks `halo` for the docker run line: the one beside this interpreter, also
    # when pytest runs from a venv that is not on PATH.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # The Makefile's own defaults unless a test names them: CI exports ENV_FILE= and AWS_DIR=
    # empty, and make's `?=` keeps an empty value from the environment.
    inherited = {k: v for k, v in os.environ.items() if k not in ("ENV_FILE", "AWS_DIR")}
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        env={**inherited, "PATH": path, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )


def test_make_help_lists_every_target() -> None:
    proc = _make("help")
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert set(TARGETS) <= listed
    assert "$$" not in proc.stdout


def test_each_target_is_one_nox_session_or_one_halo_command() -> None:
    for target in TARGETS:
        if target == "train":
            continue
        proc = _make("-n", target, "LIST=pins/hf-cache.toml")
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        assert proc.returncode == 0 and len(lines) == 1, (target, proc.stdout, proc.stderr)
        argv = shlex.split(lines[0])
        assert argv[0] == "nox" or argv[0].endswith("halo"), (target, lines)


def _train_line(image: str, ci: str = "") -> list[str]:
    proc = _make(
        "-n", "train", "CONFIG=examples/sft/config.yaml", f"IMAGE={image}", "NPROC=8",
        "EXTRA=--lr=1e-4 --training.max_steps=8", env={"CI": ci},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return shlex.split(lines[0])


def test_make_n_train_shows_the_gpu_flag_set_for_gpu_images() -> None:
    argv = _train_line("halo:blackwell")
    assert argv[1] == "run" and "--rm" in argv and "-d" not in argv and "--detach" not in argv
    flags = " ".join(argv[: argv.index("halo:blackwell")])
    for flag in (
        "--gpus all", "--ipc=host", "--ulimit memlock=-1", "--ulimit stack=67108864",
        "--shm-size=", f"-v {REPO}:/workspace ", "-w /workspace",
        "-e HF_HOME=/scratch/hf", "-e HF_DATASETS_CACHE=/scratch/hf/datasets",
        "-e TMPDIR=/scratch/tmp", "-e HALO_DATA_ROOT=/scratch/data",
        "-e CUDA_DEVICE_MAX_CONNECTIONS=1",
    ):  # fmt: skip
        assert flag in flags, flag
    assert re.search(r"-v \S+:/scratch ", flags)
    after = argv[argv.index("halo:blackwell") + 1 :]
    assert after == [
        "halo", "launch", "sft", "examples/sft/config.yaml", "--nproc", "8", "--",
        "--lr=1e-4", "--training.max_steps=8",
    ]  # fmt: skip
    cpu = _train_line("halo:cpu")
    assert "--gpus" not in cpu and "CUDA_DEVICE_MAX_CONNECTIONS=1" not in " ".join(cpu)


def test_make_train_without_config_says_so() -> None:
    proc = _make("train")
    assert proc.returncode != 0
    assert "CONFIG=path/to/config.yaml is required" in proc.stderr


def test_credentials_only_when_asked_present_and_not_in_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, home = tmp_path / "repo", tmp_path / "home"
    repo.mkdir()
    (home / ".aws").mkdir(parents=True)
    (repo / ".env").write_text("HF_TOKEN=x\n")
    monkeypatch.delenv("CI", raising=False)
    job = RunSpec(image="halo:cpu", argv=["true"], credentials=True)
    args = " ".join(docker_run_args(job, repo, tmp_path / "s", home=home))
    assert f"--env-file {repo}/.env" in args
    assert f"-v {home}/.aws:/scratch/home/.aws:ro" in args
    tier = " ".join(docker_run_args(RunSpec(image="halo:cpu", argv=["true"]), repo, tmp_path, home))
    assert "--env-file" not in tier and ".aws" not in tier
    monkeypatch.setenv("CI", "true")
    in_ci = " ".join(docker_run_args(job, repo, tmp_path / "s", home=home))
    assert "--env-file" not in in_ci and ".aws" not in in_ci
    monkeypatch.delenv("CI")
    (repo / ".env").unlink()
    (home / ".aws").rmdir()
    absent = " ".join(docker_run_args(job, repo, tmp_path / "s", home=home))
    assert "--env-file" not in absent and ".aws" not in absent


def _secret_files(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A .env and an AWS folder holding fresh random secrets: what must never be printed."""
    values = [secrets.token_hex(20) for _ in range(5)]
    env_file = tmp_path / "secrets.env"
    env_file.write_text(
        f"WANDB_API_KEY={values[0]}\nHF_TOKEN={values[1]}\nAWS_DEFAULT_REGION=us-east-1\n"
    )
    aws = tmp_path / "aws"
    aws.mkdir()
    (aws / "credentials").write_text(
        f"[default]\naws_access_key_id = {values[2]}\naws_secret_access_key = {values[3]}\n"
        f"aws_session_token = {values[4]}\n"
    )
    (aws / "config").write_text("[default]\nregion = us-east-1\n")
    return env_file, aws, values


def test_make_train_passes_env_file_and_aws_by_path_never_their_values(tmp_path: Path) -> None:
    env_file, aws, values = _secret_files(tmp_path)
    home = tmp_path / "home"
    shutil.copytree(aws, home / ".aws")
    base = {"CI": "", "HALO_SCRATCH": str(tmp_path / "scratch"), "HOME": str(home)}
    train = ["-n", "train", "CONFIG=examples/sft/config.yaml", "IMAGE=halo:cpu"]

    def line(*args: str, **env: str) -> str:
        proc = _make(*train, *args, env={**base, **env})
        assert proc.returncode == 0, proc.stderr
        for value in values:  # not in the command, not in anything else make printed
            assert value not in proc.stdout + proc.stderr
        (shown,) = proc.stdout.strip().splitlines()
        return shown

    given = line(f"ENV_FILE={env_file}", f"AWS_DIR={aws}")
    assert f" --env-file {env_file} " in given and f" -v {aws}:/scratch/home/.aws:ro " in given
    # The Makefile's defaults: the checkout's .env (when there is one) and ~/.aws.
    assert f" -v {home}/.aws:/scratch/home/.aws:ro " in line()
    # Empty drops each one: CI exports both empty.
    dropped = line(ENV_FILE="", AWS_DIR="")
    assert "--env-file" not in dropped and ".aws" not in dropped
    only_env = line(f"ENV_FILE={env_file}", "AWS_DIR=")
    assert "--env-file" in only_env and ".aws" not in only_env
    # Named but absent: nothing; and in CI never, whatever is named.
    absent = line(f"ENV_FILE={tmp_path}/none.env", f"AWS_DIR={tmp_path}/none")
    assert "--env-file" not in absent and ".aws" not in absent
    in_ci = line(f"ENV_FILE={env_file}", f"AWS_DIR={aws}", CI="true")
    assert "--env-file" not in in_ci and ".aws" not in in_ci


def test_docs_links_and_anchors(tmp_path: Path) -> None:
    assert slug("Publishing, by digest (ECR Public)") == "publishing-by-digest-ecr-public"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
    count, broken = check(REPO)
    assert count >= 2 and broken == []
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("# Real heading\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/x.md#real-heading) [gone](docs/y.md) [bad](docs/x.md#nope)\n"
        "`[code](not/a/link.md)` [web](https://example.invalid/x)\n"
    )
    _, broken = check(tmp_path)
    assert [(b.target, b.why) for b in broken] == [
        ("docs/y.md", "no such file"),
        ("docs/x.md#nope", "no heading with anchor #nope"),
    ]
    proc = halo("docs", "check", cwd=REPO)
    assert proc.returncode == 0 and "every link and anchor resolves" in proc.stdout


def test_clean_drops_caches_and_test_scratch_but_never_checkpoints(tmp_path: Path) -> None:
    repo, scratch = tmp_path / "repo", tmp_path / "scratch"
    for path in (
        repo / ".pytest_cache" / "v",
        repo / "halo" / "__pycache__" / "x.pyc",
        repo / "build" / "lib" / "checkpoints" / "step_1" / "model.safetensors",
        repo / "runs" / "checkpoints" / "job" / "model.safetensors",
        scratch / "reports" / "cpu.xml",
        scratch / "tmp" / "example-sft" / "checkpoints" / "epoch_0_step_2" / "state.pt",
        scratch / "hf" / "hub" / "config.json",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    removed = clean(repo, scratch)
    assert {r.path.name for r in removed} >= {
        ".pytest_cache",
        "__pycache__",
        "build",
        "reports",
        "tmp",
    }
    assert not (repo / ".pytest_cache").exists() and not (scratch / "reports").exists()
    assert not (repo / "halo" / "__pycache__").exists()
    for kept in (
        repo / "build" / "lib" / "checkpoints" / "step_1" / "model.safetensors",
        repo / "runs" / "checkpoints" / "job" / "model.safetensors",
        scratch / "tmp" / "example-sft" / "checkpoints" / "epoch_0_step_2" / "state.pt",
        scratch / "hf" / "hub" / "config.json",
    ):
        assert kept.is_file(), kept
    assert not (repo / "build" / "lib" / "x").exists()


def test_clean_prunes_wandb_and_tensorboard_outside_checkpoints(tmp_path: Path) -> None:
    repo, scratch = tmp_path / "repo", tmp_path / "scratch"
    record = '{"step": 2, "files": {}}'
    files = {
        # a run's log folder: the record of truth stays, the event files beside it go
        "repo/runs/logs/sft/metrics.jsonl": "keep",
        "repo/runs/logs/sft/events.out.tfevents.1700000000.host.1.0": "go",
        "repo/runs/logs/sft/tensorboard/events.out.tfevents.1700000001.host.1.0": "go",
        "repo/runs/logs/sft/tensorboard/eval/events.out.tfevents.1700000002.host.1.0": "go",
        "repo/wandb/debug.log": "go",
        "repo/wandb/offline-run-20260101_120000-abc123/files/config.yaml": "go",
        "repo/examples/sft/wandb/run-20260101_120000-x1y2z3/run-x1y2z3.wandb": "go",
        # inside a checkpoint, nothing is touched; nor a checkpoint inside a wandb folder
        "repo/runs/checkpoints/sft/r1_epoch_0_step_2/events.out.tfevents.1.h": "keep",
        "repo/wandb/offline-run-20260101_120000-abc123/files/ckpt/meta.json": record,
        "repo/out/r1_epoch_0_step_4/meta.json": record,
        "repo/out/r1_epoch_0_step_4/wandb/debug.log": "keep",
        # not wandb's: a package named so, a folder of notes, a venv's installed package
        "repo/halo/trackers/wandb/__init__.py": "keep",
        "repo/halo/trackers/wandb/debug.log": "keep",
        "repo/notes/wandb/plan.txt": "keep",
        "repo/venv/pyvenv.cfg": "keep",
        "repo/venv/lib/site-packages/wandb/debug.log": "keep",
        "repo/logs/events.txt": "keep",
        # scratch: the profiler's folder, and the seeded caches left alone
        "scratch/data/tb/run1/events.out.tfevents.1700000003.host.1.0": "go",
        "scratch/hf/wandb/debug.log": "keep",
        "scratch/stacks/cpu/wandb/debug.log": "keep",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (repo / "wandb" / "latest-run").symlink_to("offline-run-20260101_120000-abc123")
    dry = clean(repo, scratch, dry_run=True)
    removed = clean(repo, scratch)
    assert [r.removed for r in dry] == [r.removed for r in removed]
    gone = {p.relative_to(tmp_path).as_posix() for r in removed for p in r.removed}
    assert gone == {
        "repo/runs/logs/sft/events.out.tfevents.1700000000.host.1.0",
        "repo/runs/logs/sft/tensorboard",
        "repo/examples/sft/wandb",
        # the wandb folder goes but for the checkpoint inside it (and the folders above it)
        "repo/wandb/debug.log",
        "repo/wandb/latest-run",
        "repo/wandb/offline-run-20260101_120000-abc123/files/config.yaml",
        "scratch/data/tb/run1",
    }
    for rel, text in files.items():
        assert (tmp_path / rel).exists() == (text != "go"), rel
