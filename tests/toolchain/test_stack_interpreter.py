"""Which CPython builds a set's venv: $HALO_PYTHON_X_Y, else a working pythonX.Y on PATH."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from halo.errors import HaloError
from halo.stack.interpreter import env_var, find_python

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
FULL = ".".join(map(str, sys.version_info[:3]))


def script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_the_variable_names_the_interpreter() -> None:
    env = {env_var(HERE): sys.executable, "PATH": ""}
    assert find_python(HERE, env) == (sys.executable, FULL)


def test_a_variable_naming_another_version_is_one_error_line() -> None:
    with pytest.raises(HaloError, match=r"^\$HALO_PYTHON_3_99: .*expected a CPython 3\.99"):
        find_python("3.99", {"HALO_PYTHON_3_99": sys.executable, "PATH": ""})


def test_path_skips_a_shim_that_does_not_run(tmp_path: Path) -> None:
    # A pyenv shim for a version that is not selected exits 127; the next entry is used.
    script(tmp_path / "shims", f"python{HERE}", "exit 127")
    script(tmp_path / "real", f"python{HERE}", f'exec "{sys.executable}" "$@"')
    path = f"{tmp_path / 'shims'}:{tmp_path / 'real'}"
    found, version = find_python(HERE, {"PATH": path})
    assert found == str(tmp_path / "real" / f"python{HERE}") and version == FULL


def test_none_found_is_one_line_that_says_what_to_set(tmp_path: Path) -> None:
    script(tmp_path, "python3.98", "exit 127")
    with pytest.raises(HaloError) as err:
        find_python("3.98", {"PATH": str(tmp_path)})
    assert "\n" not in err.value.message
    assert err.value.message.startswith("no CPython 3.98 found: set HALO_PYTHON_3_98")
