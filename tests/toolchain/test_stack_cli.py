"""`halo stack verify` refuses bad input in one line, before installing anything."""

from __future__ import annotations

from pathlib import Path

from support import REPO, halo


def test_unknown_set_is_one_error_line(tmp_path: Path) -> None:
    proc = halo("stack", "verify", "nosuchset", "--venvs", str(tmp_path), cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "halo: error: halo stack: no stack check for set 'nosuchset' (known: blackwell, hopper, "
        "vllm, sglang, cpu, vllm-cpu)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_cpu_tier_must_name_a_checked_set(tmp_path: Path) -> None:
    proc = halo("stack", "verify", "hopper", "--cpu-tier", "blackwell", cwd=REPO)
    assert proc.returncode == 2
    assert "--cpu-tier blackwell: not among the sets checked (hopper)" in proc.stderr


def test_missing_interpreter_is_one_error_line(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HALO_PYTHON_3_11": "", "HALO_STORE": str(tmp_path / "s")}
    proc = halo("stack", "verify", "hopper", "--venvs", str(tmp_path / "v"), cwd=REPO, env=env)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("halo: error: no CPython 3.11 found: set HALO_PYTHON_3_11")
    )
