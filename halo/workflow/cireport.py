"""CI's own measurements as a table: each session's minutes against its budget, its tests, the
CPU busy share while it ran, the memory and disk peaks; then the slowest tests; then the
verdict on the budgets. The same table is written to a file and kept, so a run can be
compared with the last one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from halo.junit import NONE, Case, Counts, read_cases, read_counts
from halo.report import human_bytes, table
from halo.workflow.machine import Sample, busy_share, window
from halo.workflow.pipeline import Pipeline, Session
from halo.workflow.runner import Outcome

SLOWEST = 20


@dataclass(frozen=True)
class Row:
    session: str
    args: str
    state: str  # passed | failed | skipped | external
    start_min: float  # minutes after the run began
    minutes: float
    budget: float
    passed: int
    failed: int
    skipped: int
    busy: float | None  # share of all cores busy over its window (0..1)
    peak_mem: int
    peak_disk: int  # bytes in use on the watched disks at its peak


@dataclass(frozen=True)
class Slow:
    session: str
    test: str
    seconds: float


@dataclass(frozen=True)
class Summary:
    started: float  # time.time() of the run's start (setup included)
    minutes: float
    limit: float
    target: float
    cores: int
    busy: float | None
    peak_mem: int
    disk_at_start: int
    peak_disk: int
    rows: tuple[Row, ...]
    slowest: tuple[Slow, ...]
    tests: int  # test cases in every report (a superset check reads the lists)
    test_ids: tuple[str, ...]


def junit_files(report: Path, session: str) -> list[Path]:
    """A session's reports: its own pytest's, and those of the tiers it ran in images."""
    own = report / "junit" / f"{session}.xml"
    tiers = sorted((report / "junit" / session).glob("*.xml"))
    return [p for p in (own, *tiers) if p.is_file()]


def session_counts(report: Path, session: str) -> Counts:
    total = NONE
    for path in junit_files(report, session):
        total = total + (read_counts(path) or NONE)
    return total


def session_cases(report: Path, session: str) -> list[Case]:
    return [c for p in junit_files(report, session) for c in read_cases(p)]


def summarize(
    pipeline: Pipeline,
    outcomes: Sequence[Outcome],
    samples: Sequence[Sample],
    report: Path,
    started: float,
    ended: float,
    cores: int,
    setup: tuple[float, float | None] | None = None,
) -> Summary:
    """``setup``: when the caller's own setup ended and its CPU busy share (an external row)."""
    rows: list[Row] = []
    for s in pipeline.sessions:
        if s.external and setup is not None:
            end, busy = setup
            row = _row(s, "external", started, started, end, samples, NONE)
            rows.append(Row(**{**asdict(row), "busy": busy}))
    for o in outcomes:
        counts = session_counts(report, o.session.name)
        rows.append(_row(o.session, o.state, started, o.start, o.end, samples, counts))
    whole = window(samples, started, ended)
    cases = [(o.session.name, c) for o in outcomes for c in session_cases(report, o.session.name)]
    slowest = sorted(cases, key=lambda sc: -sc[1].seconds)[:SLOWEST]
    return Summary(
        started=started,
        minutes=(ended - started) / 60.0,
        limit=pipeline.limit_minutes,
        target=pipeline.target_minutes,
        cores=cores,
        busy=whole.busy if whole else None,
        peak_mem=whole.peak_mem if whole else 0,
        disk_at_start=samples[0].disk if samples else 0,
        peak_disk=whole.peak_disk if whole else 0,
        rows=tuple(rows),
        slowest=tuple(Slow(name, c.nodeid, c.seconds) for name, c in slowest),
        tests=len(cases),
        test_ids=tuple(sorted({c.nodeid for _, c in cases})),
    )


def _row(
    s: Session,
    state: str,
    t0: float,
    start: float,
    end: float,
    samples: Sequence[Sample],
    counts: Counts,
) -> Row:
    w = window(samples, start, end) if end > start else None
    return Row(
        session=s.name,
        args=" ".join(s.args),
        state=state,
        start_min=(start - t0) / 60.0,
        minutes=max(0.0, end - start) / 60.0,
        budget=s.budget,
        passed=counts.passed,
        failed=counts.failures + counts.errors,
        skipped=counts.skipped,
        busy=w.busy if w else None,
        peak_mem=w.peak_mem if w else 0,
        peak_disk=w.peak_disk if w else 0,
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _tests(r: Row) -> str:
    if not (r.passed or r.failed or r.skipped):
        return "-"
    extra = [f"{r.failed} failed"] if r.failed else []
    extra += [f"{r.skipped} skipped"] if r.skipped else []
    return f"{r.passed} passed" + (f" ({', '.join(extra)})" if extra else "")


def render(summary: Summary, last: Summary | None = None) -> str:
    """The table, the slowest tests, the totals: what .ci/run prints last."""
    before = {r.session: r for r in last.rows} if last else {}
    headers = ["session", "start", "minutes", "budget", "tests", "cpu busy", "peak mem", "state"]
    if last:
        headers.insert(4, "last run")
    rows = []
    for r in summary.rows:
        cells: list[object] = [
            f"{r.session} {r.args}".strip(),
            f"+{r.start_min:.1f}",
            f"{r.minutes:.1f}",
            f"{r.budget:g}",
            _tests(r),
            _pct(r.busy),
            human_bytes(r.peak_mem) if r.peak_mem else "-",
            r.state,
        ]
        if last:
            prev = before.get(r.session)
            cells.insert(4, f"{prev.minutes:.1f}" if prev else "-")
        rows.append(cells)
    total_tests = sum(r.passed + r.failed + r.skipped for r in summary.rows)
    total: list[object] = [
        "whole run",
        "",
        f"{summary.minutes:.1f}",
        f"{summary.target:g} (limit {summary.limit:g})",
        f"{total_tests} tests",
        _pct(summary.busy),
        human_bytes(summary.peak_mem),
        "",
    ]
    if last:
        total.insert(4, f"{last.minutes:.1f}")
    rows.append(total)
    out = [
        f"CI on {summary.cores} cores: {summary.minutes:.1f} min, CPU busy {_pct(summary.busy)}, "
        f"peak memory {human_bytes(summary.peak_mem)}, peak disk "
        f"{human_bytes(summary.peak_disk - summary.disk_at_start)} above the start "
        f"({human_bytes(summary.peak_disk)} in use)",
        table(headers, rows),
    ]
    if summary.slowest:
        out += [
            "",
            f"the {len(summary.slowest)} slowest tests",
            table(
                ("seconds", "session", "test"),
                [(f"{t.seconds:.1f}", t.session, t.test) for t in summary.slowest],
            ),
        ]
    return "\n".join(out)


def verdict(summary: Summary, warn_factor: float) -> tuple[list[str], str | None]:
    """(warning lines for sessions over warn_factor x budget, the failure line or None)."""
    warnings = [
        f"warning: {r.session} took {r.minutes:.1f} min, over {warn_factor:g}x its budget of "
        f"{r.budget:g} min (ci/pipeline.toml)"
        for r in summary.rows
        if r.minutes > warn_factor * r.budget
    ]
    failure = None
    if summary.minutes > summary.limit:
        over = [
            f"{r.session} {r.minutes:.1f}/{r.budget:g}"
            for r in summary.rows
            if r.minutes > r.budget
        ]
        failure = (
            f"CI took {summary.minutes:.1f} min, over its {summary.limit:g}-minute limit; "
            f"sessions over budget (minutes/budget): {', '.join(over) or 'none'}"
        )
    return warnings, failure


def to_json(summary: Summary) -> str:
    return json.dumps(asdict(summary), indent=1, sort_keys=True) + "\n"


def from_json(text: str) -> Summary:
    data = json.loads(text)
    data["rows"] = tuple(Row(**r) for r in data["rows"])
    data["slowest"] = tuple(Slow(**s) for s in data["slowest"])
    data["test_ids"] = tuple(data.get("test_ids", ()))
    return Summary(**data)


def latest(history: Path, before: float) -> Summary | None:
    """The newest kept run that started before ``before`` (the one to compare with)."""
    found = []
    for p in history.glob("ci-*.json"):
        try:
            s = from_json(p.read_text())
        except (OSError, ValueError, TypeError, KeyError):
            continue  # another version's file, or half of one: not comparable
        if s.started < before:
            found.append(s)
    return max(found, key=lambda s: s.started, default=None)


def setup_share(cpu0_line: str, samples: Sequence[Sample]) -> float | None:
    """The CPU busy share of .ci/run's setup: its /proc/stat line at the start, to the first sample."""
    from halo.workflow.machine import CpuTimes

    try:
        first = CpuTimes.parse(cpu0_line)
    except ValueError:
        return None
    return busy_share(first, samples[0].cpu) if samples else None
