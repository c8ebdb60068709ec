"""What a matrix may name: the noxfile's sessions, asked of nox itself; and the pinned nox."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

from halo.errors import HaloError

# nox lists only the default sessions unless a selection is given; a keyword expression
# that no session name contains selects all of them.
_SELECT_ALL = "not halo_ci_no_such_session"


def _nox_argv() -> list[str]:
    if importlib.util.find_spec("nox") is not None:
        return [sys.executable, "-m", "nox"]
    exe = shutil.which("nox")
    if exe is None:
        raise HaloError(
            "halo workflow: nox is not installed here (it is in the dev dependency group: "
            "`uv pip install --group dev`)"
        )
    return [exe]


def nox_sessions(noxfile: Path) -> frozenset[str]:
    if not noxfile.is_file():
        raise HaloError(f"{noxfile}: noxfile not found")
    argv = [*_nox_argv(), "--noxfile", str(noxfile), "--list", "--json", "-k", _SELECT_ALL]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    try:
        listing = json.loads(proc.stdout) if proc.returncode == 0 else None
    except json.JSONDecodeError:
        listing = None
    if not isinstance(listing, list):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise HaloError(f"{noxfile}: nox could not list its sessions ({last})")
    return frozenset(str(s["session"]) for s in listing)


def dev_pin(pyproject: Path, name: str) -> str:
    """The version ``name`` is pinned to in pyproject's dev group: CI installs the same nox."""
    import tomllib

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise HaloError(f"{pyproject}: cannot read ({exc})") from None
    for line in data.get("dependency-groups", {}).get("dev", []):
        try:
            req = Requirement(line) if isinstance(line, str) else None
        except InvalidRequirement:
            continue
        if req and req.name == name:
            pins = [s.version for s in req.specifier if s.operator == "=="]
            if pins:
                return pins[0]
    raise HaloError(f"{pyproject}: dependency-groups.dev: expected a `{name}==VERSION` pin")
