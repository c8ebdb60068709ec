"""Decide each patch's state on a site directory, then (optionally) write the fixes.

Deciding reads only; writing happens in ``write_plans`` once every patch has been
decided, so a strict run that finds drift anywhere writes nothing at all.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from halo.atomic import write_bytes
from halo.errors import HaloError
from halo.patching.model import Edit, Patch, Result, State
from halo.patching.site import Installed, find_distribution


@dataclass(frozen=True)
class Plan:
    result: Result
    # New contents per absolute path; non-empty only for State.APPLIED.
    writes: dict[Path, bytes] = field(default_factory=dict)


def _snippet(text: str, limit: int = 70) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), text.strip())
    return repr(line if len(line) <= limit else line[: limit - 3] + "...")


def _result(patch: Patch, version: str | None, state: State, detail: str) -> Result:
    return Result(patch.name, patch.distribution, version, state, patch.files, detail)


def _upstream_fix(patch: Patch, site: Path) -> str | None:
    for marker in patch.fixed_upstream:
        path = site / marker.file
        if path.is_file() and marker.regex().search(path.read_bytes()):
            return f"{marker.file} matches {marker.pattern!r}"
    return None


def _drift_detail(patch: Patch, edit: Edit, found: int) -> str:
    upstream = ", ".join(repr(m.pattern) for m in patch.fixed_upstream) or "none declared"
    return (
        f"patch {patch.name}: {edit.file}: looked for {_snippet(edit.defect)} "
        f"(expected {edit.count}x, found {found}x), its fix {_snippet(edit.fix)}, "
        f"or an upstream fix ({upstream}); found none"
    )


def _compile_check(patch: Patch, path: Path, data: bytes) -> None:
    # In memory: proves the edited file byte-compiles without leaving a .pyc behind.
    if path.suffix != ".py":
        return
    try:
        compile(data, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise HaloError(f"patch {patch.name}: {path}: edited file does not compile: {exc}") from exc


def plan_patch(patch: Patch, site: Path, installed: Installed | None = None) -> Plan:
    """``installed`` stands for the distribution when ``site`` has no metadata (a source tree)."""
    installed = installed or find_distribution(site, patch.distribution)
    if installed is None:
        return Plan(
            _result(patch, None, State.NOT_INSTALLED, f"{patch.distribution} is not installed")
        )
    version = installed.version
    try:
        in_range = SpecifierSet(patch.versions).contains(Version(version), prereleases=True)
    except InvalidVersion:
        in_range = False
    if not in_range:
        detail = f"{patch.distribution} {version} is outside the patched range {patch.versions}"
        return Plan(_result(patch, version, State.NOT_INSTALLED, detail))
    patch = patch.at_version(version)

    contents: dict[str, bytes] = {}
    for rel in patch.files:
        path = site / rel
        if not path.is_file() or not installed.owns(rel):
            detail = f"patch {patch.name}: {rel}: file not found in {patch.distribution} {version}"
            upstream = _upstream_fix(patch, site)
            if upstream:
                return Plan(
                    _result(patch, version, State.FIXED_UPSTREAM, f"upstream fix found: {upstream}")
                )
            return Plan(_result(patch, version, State.DRIFT, detail))
        contents[rel] = path.read_bytes()

    pending = [e for e in patch.edits if e.fix.encode() not in contents[e.file]]
    if not pending:
        return Plan(_result(patch, version, State.ALREADY_APPLIED, "the fix is in place"))
    if upstream := _upstream_fix(patch, site):
        return Plan(
            _result(patch, version, State.FIXED_UPSTREAM, f"upstream fix found: {upstream}")
        )

    new = dict(contents)
    for edit in pending:
        found = new[edit.file].count(edit.defect.encode())
        if found != edit.count:
            return Plan(_result(patch, version, State.DRIFT, _drift_detail(patch, edit, found)))
        new[edit.file] = new[edit.file].replace(edit.defect.encode(), edit.fix.encode())
    writes = {}
    for rel, data in new.items():
        if data != contents[rel]:
            _compile_check(patch, site / rel, data)
            writes[site / rel] = data
    detail = f"defect found; fixed {len(pending)} of {len(patch.edits)} edit(s)"
    return Plan(_result(patch, version, State.APPLIED, detail), writes)


def plan_all(patches: list[Patch], site: Path) -> list[Plan]:
    return [plan_patch(p, site) for p in patches]


def _drop_stale_bytecode(path: Path) -> None:
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


def write_plans(plans: list[Plan]) -> None:
    for plan in plans:
        for path, data in plan.writes.items():
            mode = stat.S_IMODE(path.stat().st_mode)
            write_bytes(path, data)
            # The temp file is created 0600; keep the installed file readable by every user.
            path.chmod(mode)
            _drop_stale_bytecode(path)


def drift_lines(results: list[Result]) -> list[str]:
    return [r.detail for r in results if r.state is State.DRIFT]
