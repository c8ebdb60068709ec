"""The CI run as data: ci/pipeline.toml's sessions, what each waits for, and its budget.

A session starts as soon as everything in its ``after`` has passed, beside whatever else is
running: the table is the schedule. ``alone`` waits for every other session and runs with the
machine to itself (a benchmark). ``external`` rows are timed by their caller (.ci/run's setup),
not started here. Parsing is pure: one HaloError line for anything wrong with the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from halo.errors import HaloError


@dataclass(frozen=True)
class Session:
    name: str  # the nox session
    budget: float  # minutes on CI's machine
    args: tuple[str, ...] = ()  # its posargs
    after: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # values may name variables: "$HALO_CI_ENGINE2"
    alone: bool = False
    external: bool = False
    why: str = ""  # a note for the table's reader

    @property
    def label(self) -> str:
        return " ".join([self.name, *self.args])


@dataclass(frozen=True)
class Pipeline:
    sessions: tuple[Session, ...]
    limit_minutes: float
    target_minutes: float
    warn_factor: float
    path: Path = field(default=Path("ci/pipeline.toml"))

    def session(self, name: str) -> Session:
        for s in self.sessions:
            if s.name == name:
                return s
        raise HaloError(f"{self.path}: no session {name!r}")

    @property
    def runnable(self) -> tuple[Session, ...]:
        return tuple(s for s in self.sessions if not s.external)

    def only(self, names: list[str]) -> Pipeline:
        """These sessions alone (and nothing they wait for): a rerun of part of CI."""
        for n in names:
            self.session(n)
        kept = tuple(
            s
            if s.external
            else Session(
                s.name, s.budget, s.args, tuple(a for a in s.after if a in names), s.env, s.alone
            )
            for s in self.sessions
            if s.external or s.name in names
        )
        return Pipeline(kept, self.limit_minutes, self.target_minutes, self.warn_factor, self.path)


_KEYS = {"name", "budget", "args", "after", "env", "alone", "external", "why"}


def _number(path: Path, key: str, value: object, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (positive and value <= 0):
        raise HaloError(f"{path}: {key}: expected a positive number of minutes, got {value!r}")
    return float(value)


def _strings(path: Path, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise HaloError(f"{path}: {key}: expected a list of strings, got {value!r}")
    return tuple(value)


def _session(path: Path, i: int, row: object) -> Session:
    where = f"sessions[{i}]"
    if not isinstance(row, dict):
        raise HaloError(f"{path}: {where}: expected a table {{ name = ..., budget = ... }}")
    if unknown := sorted(set(row) - _KEYS):
        raise HaloError(
            f"{path}: {where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})"
        )
    name = row.get("name")
    if not isinstance(name, str) or not name:
        raise HaloError(f"{path}: {where}.name: expected a nox session name")
    where = f"sessions[{name}]"
    env = row.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise HaloError(f"{path}: {where}.env: expected a table of strings")
    flags = {k: row.get(k, False) for k in ("alone", "external")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise HaloError(f"{path}: {where}.{k}: expected true or false, got {v!r}")
    return Session(
        name=name,
        budget=_number(path, f"{where}.budget", row.get("budget")),
        args=_strings(path, f"{where}.args", row.get("args", [])),
        after=_strings(path, f"{where}.after", row.get("after", [])),
        env=tuple(sorted(env.items())),
        alone=flags["alone"],
        external=flags["external"],
        why=str(row.get("why", "")),
    )


def _check_graph(path: Path, sessions: tuple[Session, ...]) -> None:
    names = [s.name for s in sessions]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise HaloError(f"{path}: session {dup[0]!r} appears twice")
    external = {s.name for s in sessions if s.external}
    for s in sessions:
        for a in s.after:
            if a not in names:
                raise HaloError(f"{path}: sessions[{s.name}].after: no session {a!r}")
            if a in external:
                raise HaloError(f"{path}: sessions[{s.name}].after: {a!r} is not run here")
    # A cycle would leave its sessions waiting for ever: refuse it before anything starts.
    state: dict[str, int] = {}
    deps = {s.name: s.after for s in sessions}

    def visit(n: str, trail: list[str]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            loop = [*trail[trail.index(n) :], n]
            raise HaloError(f"{path}: sessions wait for each other: {' -> '.join(loop)}")
        state[n] = 1
        for a in deps[n]:
            visit(a, [*trail, n])
        state[n] = 2

    for n in names:
        visit(n, [])


def parse_pipeline(text: str, path: Path, known: frozenset[str] | None = None) -> Pipeline:
    """ci/pipeline.toml as a Pipeline; ``known`` (the noxfile's sessions) checks every name."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HaloError(f"{path}: not valid TOML ({exc})") from None
    rows = data.get("sessions")
    if not isinstance(rows, list) or not rows:
        raise HaloError(f"{path}: sessions: expected a list of {{ name = ..., budget = ... }}")
    sessions = tuple(_session(path, i, row) for i, row in enumerate(rows))
    _check_graph(path, sessions)
    if known is not None:
        for s in sessions:
            if not s.external and s.name not in known:
                raise HaloError(f"{path}: sessions[{s.name}]: the noxfile has no such session")
    limit = _number(path, "limit_minutes", data.get("limit_minutes"))
    target = _number(path, "target_minutes", data.get("target_minutes"))
    warn = _number(path, "warn_factor", data.get("warn_factor", 1.5))
    if target > limit:
        raise HaloError(f"{path}: target_minutes {target:g} is over limit_minutes {limit:g}")
    return Pipeline(sessions, limit, target, warn, path)


def load_pipeline(
    path: Path, known: frozenset[str] | None = None, shown: Path | None = None
) -> Pipeline:
    """Read and parse ``path``; messages name it as ``shown`` (the checkout-relative path)."""
    try:
        text = path.read_text()
    except OSError as exc:
        from halo.errors import os_error

        raise os_error(exc, shown or path, "read the CI pipeline") from None
    return parse_pipeline(text, shown or path, known)
