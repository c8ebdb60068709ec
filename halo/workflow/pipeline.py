"""The CI run as data: ci/pipeline.toml's sessions, what each waits for, and its budget.

A session starts once everything in its ``after`` has passed and the machine has room for
it: its ``cpus`` beside the running sessions' within the table's ``cpus`` (default: the
machine's cores + 1, the one for sessions that mostly wait on disk or the network), and its
``disk_gb`` (the most it adds to the disk while it runs) within the free disk, less what the
running ones may still take and ``disk_margin_gb``. Bazel schedules its actions so (resource
sets): two cores running five builds at once ran each one slower than in turn, and ran the
disk full. Waiting sessions start in the table's order. ``alone`` waits for every other
session and runs with the machine to itself (a benchmark). ``external`` rows are timed by
their caller (.ci/run's setup), not started here. Parsing is pure: one HaloError line for
anything wrong with the file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    cpus: float = 1.0  # cores it keeps busy while it runs
    disk_gb: float = 0.0  # the most it adds to the disk while it runs

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
    cpus: float | None = None  # None: the machine's cores + 1
    disk_margin_gb: float = 6.0

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
            s if s.external else replace(s, after=tuple(a for a in s.after if a in names))
            for s in self.sessions
            if s.external or s.name in names
        )
        return replace(self, sessions=kept)


def waits_for(
    s: Session, running: Sequence[Session], cpus: float, free_gb: float, margin_gb: float
) -> str | None:
    """None when ``s`` may start beside ``running``; else what it waits for, in words.

    The running sessions' ``disk_gb`` is held back whole, as if they had written nothing yet:
    a session may be at its start, and a full disk fails every session at once. A session
    alone on the machine always starts (the machine is all there is)."""
    if not running:
        return None
    busy = sum(r.cpus for r in running)
    if busy + s.cpus > cpus + 1e-9:
        return f"cores: {busy:g} of {cpus:g} busy, it needs {s.cpus:g}"
    held = sum(r.disk_gb for r in running)
    room = free_gb - margin_gb - held
    if s.disk_gb > 0 and s.disk_gb > room:
        return f"disk: {max(room, 0):.0f} GB to spare, it may write {s.disk_gb:g}"
    return None


_KEYS = {"name", "budget", "args", "after", "env", "alone", "external", "why", "cpus", "disk_gb"}


def _number(
    path: Path, key: str, value: object, unit: str = "minutes", positive: bool = True
) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (value <= 0 if positive else value < 0)
    ):
        kind = "a positive" if positive else "a non-negative"
        raise HaloError(f"{path}: {key}: expected {kind} number of {unit}, got {value!r}")
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
        cpus=_number(path, f"{where}.cpus", row.get("cpus", 1), "cores"),
        disk_gb=_number(path, f"{where}.disk_gb", row.get("disk_gb", 0), "GB", positive=False),
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
    cpus = None if "cpus" not in data else _number(path, "cpus", data["cpus"], "cores")
    margin = _number(path, "disk_margin_gb", data.get("disk_margin_gb", 6), "GB", positive=False)
    return Pipeline(sessions, limit, target, warn, path, cpus, margin)


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
