"""Which CPython builds a set's venv: configuration, then PATH. Never a path of this machine.

``HALO_PYTHON_3_11`` (the set's version, dots as underscores: every set is CPython 3.11,
Debian 12's) names an interpreter; otherwise the first ``python3.11`` on PATH that really
runs and is CPython 3.11 (a pyenv shim for a version that is not selected exits 127 and is
skipped).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from halo.errors import HaloError

_ASK = "import sys; print(sys.implementation.name, '%d.%d.%d' % sys.version_info[:3])"


def env_var(version: str) -> str:
    return "HALO_PYTHON_" + version.replace(".", "_")


def describe(python: str) -> tuple[str, str] | None:
    """(implementation, full version) of an interpreter, or None when it does not run."""
    try:
        proc = subprocess.run(
            [python, "-I", "-c", _ASK], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = proc.stdout.split()
    return (parts[0], parts[1]) if proc.returncode == 0 and len(parts) == 2 else None


def _matches(found: tuple[str, str] | None, version: str) -> bool:
    return found is not None and found[0] == "cpython" and found[1].startswith(version + ".")


def find_python(version: str, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(interpreter, full version) of a CPython ``version`` (e.g. "3.11")."""
    env = os.environ if env is None else env
    var = env_var(version)
    if chosen := env.get(var):
        found = describe(chosen)
        if not _matches(found, version):
            got = f"{found[0]} {found[1]}" if found else "does not run"
            raise HaloError(f"${var}: {chosen}: expected a CPython {version} interpreter, {got}")
        return chosen, found[1]  # type: ignore[index]
    for folder in env.get("PATH", "").split(os.pathsep):
        cand = shutil.which(f"python{version}", path=folder) if folder else None
        if cand and _matches(found := describe(cand), version):
            return str(Path(cand)), found[1]  # type: ignore[index]
    raise HaloError(
        f"no CPython {version} found: set {var} to one, or put python{version} on PATH "
        f"(with pyenv: PYENV_VERSION=<a {version} version>)"
    )
