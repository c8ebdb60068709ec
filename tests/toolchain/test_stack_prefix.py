"""`halo stack install SET PREFIX`: bad input is one line, exit 2, and no venv is made.

The install itself (66 packages, minutes) runs in `nox -s test-slurm`, whose nodes train from it
(tests/slurm/test_stack_venv.py).
"""

from __future__ import annotations

from pathlib import Path

from support import REPO, halo


def test_an_unknown_set_is_one_line_and_nothing_installed(tmp_path: Path) -> None:
    proc = halo("stack", "install", "nope", str(tmp_path / "venv"), cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no stack check for set 'nope'" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_a_set_not_in_the_store_is_one_line_and_nothing_installed(tmp_path: Path) -> None:
    proc = halo("stack", "install", "cpu", str(tmp_path / "venv"), cwd=REPO,
                env={"HALO_STORE": str(tmp_path / "empty-store")})  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "halo fetch" in proc.stderr, proc.stderr
    assert not (tmp_path / "venv").exists()
