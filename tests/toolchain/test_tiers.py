"""Tiers: the one place that knows the docker run flags, strict collection, readable results."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import REPO, halo

from halo.errors import HaloError
from halo.testing.container import RunSpec, docker_run_args
from halo.testing.tiers import TIERS, check_server, pytest_argv, read_junit, tier


def test_cpu_run_is_offline_credential_free_and_mounts_the_checkout_read_only(
    tmp_path: Path,
) -> None:
    args = docker_run_args(RunSpec(image="halo:cpu", argv=["python", "-V"]), REPO, tmp_path)
    assert "--network=none" in args
    assert f"{REPO}:/workspace:ro" in args
    assert f"{tmp_path}:/scratch" in args
    assert "--gpus" not in args
    envs = [args[i + 1] for i, a in enumerate(args) if a == "-e"]
    assert all(
        e.split("=", 1)[0]
        in {
            "HOME",
            "HF_HOME",
            "HF_DATASETS_CACHE",
            "HF_HUB_OFFLINE",
            "TMPDIR",
            "HALO_DATA_ROOT",
            "HALO_SCRATCH",
            "PYTHONDONTWRITEBYTECODE",
            "PYTHONPYCACHEPREFIX",
            "USER",
        }
        for e in envs
    )
    assert args[-3:] == ["halo:cpu", "python", "-V"]
    # Bytecode to the container's /tmp: the image's PYTHONDONTWRITEBYTECODE=1 is overridden.
    assert "PYTHONDONTWRITEBYTECODE=" in envs and "PYTHONPYCACHEPREFIX=/tmp/halo-pycache" in envs


def test_read_only_run_as_another_user_writes_only_to_scratch_and_tmp(tmp_path: Path) -> None:
    spec = RunSpec(image="halo:cpu", argv=["true"], read_only=True, user="4321:4321")
    args = docker_run_args(spec, REPO, tmp_path)
    assert args[args.index("--user") + 1] == "4321:4321"
    assert "--read-only" in args and args[args.index("--tmpfs") + 1].startswith("/tmp:rw,")
    writable = [v for i, v in enumerate(args) if args[i - 1] == "-v" and not v.endswith(":ro")]
    assert writable == [f"{tmp_path}:/scratch"]
    # A uid the image's passwd lacks still has a name, its own: a root run before it in the same
    # scratch left TMPDIR/pytest-of-halo-0, which pytest would refuse to use as another user.
    assert "USER=halo-4321" in args
    # HOME and TMPDIR its own: earlier root runs leave root's caches in the shared ones.
    assert "HOME=/scratch/home/4321" in args and "TMPDIR=/scratch/tmp/4321" in args
    assert "--read-only" not in docker_run_args(RunSpec(image="halo:cpu", argv=[]), REPO, tmp_path)


def test_read_only_and_user_are_refused_natively_and_user_must_be_numeric() -> None:
    for argv, why in (
        (["--native", "--read-only"], "not with --native"),
        (["--user", "bob"], "--user: expected UID:GID (numbers), got 'bob'"),
    ):
        proc = halo("test", "cpu", *argv, cwd=REPO)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr


def test_gpu_run_asks_for_gpus_ipc_and_ulimits(tmp_path: Path) -> None:
    args = docker_run_args(
        RunSpec(image="halo:blackwell", argv=["true"], gpus=True), REPO, tmp_path
    )
    assert args[args.index("--gpus") + 1] == "all"
    assert "--ipc=host" in args
    assert "memlock=-1" in args and "stack=67108864" in args


def test_tier_names_and_markers() -> None:
    assert {t.marker for t in TIERS.values()} == {
        "cpu",
        "gpu_core",
        "gpu_full",
        "rollout_vllm",
        "rollout_sglang",
    }
    assert tier("gpu_core") is tier("gpu-core")
    with pytest.raises(HaloError, match="unknown test tier 'gpu'"):
        tier("gpu")
    argv = pytest_argv(tier("cpu"), "/scratch/r.xml", ["-k", "x"])
    assert argv[:6] == ["-m", "pytest", "tests/cpu", "-m", "cpu", "-p"]
    assert "-n" in argv and argv[-2:] == ["-k", "x"]
    assert "-n" not in pytest_argv(tier("gpu-core"), "r.xml", [])


def test_rollout_tier_without_a_server_prints_the_command_that_starts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HALO_VLLM_URL", "http://127.0.0.1:9")
    with pytest.raises(HaloError) as err:
        check_server(tier("rollout-vllm"))
    assert "docker compose -f images/docker-compose.vllm.yml up -d" in str(err.value)


def test_junit_counts(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2" time="1.5"/></testsuites>'
    )
    counts = read_junit(report)
    assert counts is not None and (counts.passed, counts.failures, counts.skipped) == (2, 1, 2)


def test_a_tier_that_collects_nothing_fails(repo_copy: Path, tmp_path: Path) -> None:
    (repo_copy / "tests" / "gpu_full").mkdir(exist_ok=True)
    for f in (repo_copy / "tests" / "gpu_full").glob("test_*.py"):
        f.unlink()
    proc = halo("test", "gpu-full", "--native", cwd=repo_copy, env={"HALO_SCRATCH": str(tmp_path)})
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("halo: error: tier gpu-full: collected no tests")
    )


def test_gpu_tier_on_a_machine_without_gpu_reports_skips_not_passes(
    repo_copy: Path, tmp_path: Path
) -> None:
    proc = halo(
        "test",
        "gpu-core",
        "--native",
        "--",
        "-rs",
        cwd=repo_copy,
        env={"HALO_SCRATCH": str(tmp_path)},
    )
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this host has a GPU: the tier really runs here")
    except ImportError:
        pass
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "passed" not in proc.stdout.splitlines()[-4], proc.stdout
    assert "SKIPPED" in proc.stdout and "needs a CUDA GPU" in proc.stdout
    summary = [line for line in proc.stdout.splitlines() if line.startswith("gpu-core")]
    assert summary and summary[0].split()[2] == "0", summary  # 0 passed
