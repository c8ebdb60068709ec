"""The CI run as data: ci/pipeline.toml's sessions, what each waits for, and its budget.

A session starts once everything in its ``after`` has passed and the machine has room for
it: its ``cpus`` beside the running sessions' within the table's ``cpus`` (default: the
machine's cores + 1, the one for sessions that mostly wait on disk or the network), and its
``disk_gb`` (the most it adds to the disk while it runs) within the free disk, less what the
running ones may still take (DiskLedger) and ``disk_margin_gb``. Bazel schedules its actions
so (resource sets): two cores running five builds at once ran each one slower than in turn,
and ran the disk full. Waiting sessions start in the table's order. ``alone`` waits for every other
session and runs with the machine to itself (a benchmark). ``external`` rows are timed by
their caller (.ci/run's setup), not started here. ``plan`` is the run the budgets make, each
session taking its whole budget and started by the runner's rules (``turn_has_come``,
``waits_for``); a table whose plan passes limit_minutes is refused (``check_plan``). Parsing
is pure: one HaloError line for anything wrong with the file.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Collection, Sequence
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
    nice: int = 0  # its processes' CPU priority (nice(1)): below 0 goes first

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

    def room(self, machine: float) -> float:
        """The cores sessions may keep busy at once: the table's ``cpus``, else ``machine``'s."""
        return self.cpus if self.cpus is not None else machine

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


class DiskLedger:
    """What the running sessions may still add to the disk: each one's ``disk_gb`` less what it
    has added so far.

    The free disk already holds what they wrote, so holding back their whole ``disk_gb`` counts
    it twice (run 25 held kernels and test-arm64 for minutes with 44 GB free). Who wrote which
    bytes is not known, so each change of the free disk is shared among the running sessions:
    a loss in proportion to what each may still write, a gain (a session removed its images)
    in proportion to what each has added, so that it may write that much again."""

    def __init__(self, free_gb: float) -> None:
        self._free = free_gb
        self._limit: dict[str, float] = {}
        self._added: dict[str, float] = {}

    def start(self, s: Session) -> None:
        self._limit[s.name] = s.disk_gb
        self._added[s.name] = 0.0

    def end(self, name: str) -> None:
        self._limit.pop(name, None)
        self._added.pop(name, None)

    def observe(self, free_gb: float) -> None:
        """The free disk now: what it lost or gained since the last look, shared out."""
        if not (math.isfinite(free_gb) and math.isfinite(self._free)):
            self._free = free_gb
            return
        written, self._free = self._free - free_gb, free_gb
        weights = {
            n: (lim - self._added[n]) if written > 0 else self._added[n]
            for n, lim in self._limit.items()
        }
        total = sum(weights.values())
        if total <= 0:
            return
        for n, w in weights.items():
            added = self._added[n] + written * w / total
            self._added[n] = min(max(added, 0.0), self._limit[n])

    @property
    def held_gb(self) -> float:
        return sum(lim - self._added[n] for n, lim in self._limit.items())


def waits_for(
    s: Session,
    running: Sequence[Session],
    cpus: float,
    free_gb: float,
    margin_gb: float,
    held_gb: float | None = None,
) -> str | None:
    """None when ``s`` may start beside ``running``; else what it waits for, in words.

    ``held_gb`` is what the running sessions may still write (a DiskLedger's); None holds
    back their whole ``disk_gb``, as if they had written nothing yet. A full disk fails every
    session at once. A session alone on the machine always starts (the machine is all there
    is)."""
    if not running:
        return None
    busy = sum(r.cpus for r in running)
    if busy + s.cpus > cpus + 1e-9:
        return f"cores: {busy:g} of {cpus:g} busy, it needs {s.cpus:g}"
    held = sum(r.disk_gb for r in running) if held_gb is None else held_gb
    room = free_gb - margin_gb - held
    if s.disk_gb > 0 and s.disk_gb > room:
        return f"disk: {max(room, 0):.0f} GB to spare, it may write {s.disk_gb:g}"
    return None


def turn_has_come(
    s: Session, pending: Sequence[Session], running: Sequence[Session], ended: Collection[str]
) -> bool:
    """Has everything ``s`` waits for ended, with no ``alone`` session in its way? One alone
    waits for every other session to end, and nothing starts beside it."""
    if not all(a in ended for a in s.after):
        return False
    if s.alone:
        return not running and not any(p is not s and not p.alone for p in pending)
    return not any(r.alone for r in running)


@dataclass(frozen=True)
class Slot:
    session: Session
    start: float  # minutes from the run's start
    end: float


def plan(pipeline: Pipeline, cpus: float) -> tuple[Slot, ...]:
    """The run as its budgets plan it, every session taking its whole budget: the external rows
    (setup) first, one after another, then each session started as the runner starts it (its
    ``after``, ``alone``, cores within ``cpus`` unless the table names its own). The disk is
    not planned: the runner measures it as the run goes. In the table's order."""
    t = 0.0
    slots: dict[str, Slot] = {}
    for s in pipeline.sessions:
        if s.external:
            slots[s.name] = Slot(s, t, t + s.budget)
            t += s.budget
    room = pipeline.room(cpus)
    pending, running, ended = list(pipeline.runnable), list[Slot](), set[str]()
    while pending or running:
        for s in list(pending):
            beside = [r.session for r in running]
            if turn_has_come(s, pending, beside, ended) and (
                waits_for(s, beside, room, math.inf, 0.0) is None
            ):
                pending.remove(s)
                slots[s.name] = Slot(s, t, t + s.budget)
                running.append(slots[s.name])
        if not running:  # _check_graph refuses cycles; this is the alone rule's dead end
            names = ", ".join(s.name for s in pending)
            raise HaloError(f"{pipeline.path}: sessions that can never start: {names}")
        t = min(r.end for r in running)
        ended |= {r.session.name for r in running if r.end <= t}
        running = [r for r in running if r.end > t]
    return tuple(slots[s.name] for s in pipeline.sessions)


def critical_path(slots: Sequence[Slot]) -> tuple[Slot, ...]:
    """The planned sessions the run's end waits on, first to last: from the last to end, back
    through the one that ended as each started (what it waited for, else what made room)."""
    if not slots:
        return ()
    path = [max(slots, key=lambda x: x.end)]
    while before := [x for x in slots if abs(x.end - path[-1].start) < 1e-9]:
        cur = path[-1]
        path.append(min(before, key=lambda x: (x.session.name not in cur.session.after, x.start)))
    return tuple(reversed(path))


def planned(slots: Sequence[Slot]) -> tuple[float, str]:
    """(the planned run's minutes, the sessions its end waits on as "a -> b -> c")."""
    end = max((x.end for x in slots), default=0.0)
    return end, " -> ".join(x.session.name for x in critical_path(slots))


def check_plan(pipeline: Pipeline, cpus: float) -> tuple[Slot, ...]:
    """The plan, refused in one line when it passes limit_minutes: budgets that all hold then
    make a run within the limit."""
    slots = plan(pipeline, cpus)
    end, path = planned(slots)
    if end > pipeline.limit_minutes + 1e-9:
        raise HaloError(
            f"{pipeline.path}: the budgets plan a run of {end:g} minutes, over limit_minutes "
            f"{pipeline.limit_minutes:g} ({path})"
        )
    return slots


_KEYS = {
    "name", "budget", "args", "after", "env", "alone", "external", "why", "cpus", "disk_gb", "nice"
}  # fmt: skip


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
    nice = row.get("nice", 0)
    if isinstance(nice, bool) or not isinstance(nice, int) or not -20 <= nice <= 19:
        raise HaloError(f"{path}: {where}.nice: expected an integer from -20 to 19, got {nice!r}")
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
        nice=nice,
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
