"""`halo workflow run`: CI's sessions side by side, measured, and judged against their budgets.

.ci/run sets HALO_CI_STARTED (its start, seconds since the epoch) and HALO_CI_CPU0 (its first
/proc/stat line), so the table's whole-run minutes and its setup row include what it did
before this ran. The table goes to the console and, with the junit reports and each session's
log, under ``report``; a copy is kept under ~/.cache/halo/ci-runs to compare the next run with.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from halo.atomic import write_text
from halo.paths import cache_home, scratch_root, store_root
from halo.report import say, table
from halo.workflow import cireport
from halo.workflow.machine import Sampler, cores, free_gb
from halo.workflow.pipeline import Pipeline, Slot, planned
from halo.workflow.runner import nox_launch, run_pipeline

HISTORY_KEEP = 20


def dry_run(pipeline: Pipeline, slots: Sequence[Slot]) -> str:
    """The table as the runner reads it, with the run its budgets plan (``slots``)."""
    at = {x.session.name: x for x in slots}
    rows = [
        (
            s.label,
            ", ".join(s.after) or ("(its caller)" if s.external else "-"),
            "alone" if s.alone else "",
            "" if s.external else f"{s.cpus:g}",
            f"{s.disk_gb:g}" if s.disk_gb else "",
            f"{s.nice:+d}" if s.nice else "",
            f"{s.budget:g}",
            f"{at[s.name].start:.1f}-{at[s.name].end:.1f}" if s.name in at else "",
        )
        for s in pipeline.sessions
    ]
    room = f"{pipeline.cpus:g}" if pipeline.cpus is not None else f"{cores() + 1} (cores + 1)"
    end, path = planned(slots)
    head = (
        f"{pipeline.path}: {len(pipeline.sessions)} sessions; budget target "
        f"{pipeline.target_minutes:g} min, limit {pipeline.limit_minutes:g} min; room for "
        f"{room} cores, the free disk less {pipeline.disk_margin_gb:g} GB"
    )
    foot = (
        f"each session at its whole budget, the run takes {end:.1f} min (limit "
        f"{pipeline.limit_minutes:g}), waiting on {path}"
    )
    cols = ("session", "after", "alone", "cores", "disk GB", "nice", "budget (min)", "planned")
    return head + "\n" + table(cols, rows) + "\n" + foot


def _started() -> tuple[float, float | None]:
    """(when the run started, when setup ended or None): .ci/run's clock, else now."""
    now = time.time()
    try:
        given = float(os.environ.get("HALO_CI_STARTED", ""))
    except ValueError:
        return now, None
    return (given, now) if 0 < given <= now else (now, None)


def _watched_disks() -> list[Path]:
    return [scratch_root(), store_root(), cache_home(), Path("/var/lib/docker"), Path("/tmp")]


def _keep(history: Path, summary: cireport.Summary) -> None:
    history.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(summary.started))
    write_text(history / f"ci-{stamp}.json", cireport.to_json(summary))
    for old in sorted(history.glob("ci-*.json"))[:-HISTORY_KEEP]:
        old.unlink(missing_ok=True)


def _stop(signum: int, _frame: object) -> None:
    # CI's timeout and `kill` send SIGTERM: as an exception it reaches the runner, which stops
    # every session's process group instead of leaving them running behind it.
    raise SystemExit(128 + signum)


def run_ci(repo: Path, pipeline: Pipeline, report: Path) -> int:
    signal.signal(signal.SIGTERM, _stop)
    started, setup_end = _started()
    if report.exists():
        shutil.rmtree(report)  # a report describes one run; the last is kept under history
    report.mkdir(parents=True)
    sampler = Sampler(_watched_disks())
    say(
        f"CI: {len(pipeline.runnable)} sessions from {pipeline.path}, side by side as their "
        f"`after` allows; logs and junit under {report}"
    )
    try:
        disks = _watched_disks()
        outcomes = run_pipeline(
            pipeline,
            report,
            nox_launch(repo / "noxfile.py"),
            say,
            cpus=cores() + 1.0,
            free_gb=lambda: free_gb(disks),
        )
    finally:
        samples = sampler.stop()
    setup = None
    if setup_end is not None:
        setup = (setup_end, cireport.setup_share(os.environ.get("HALO_CI_CPU0", ""), samples))
    summary = cireport.summarize(
        pipeline, outcomes, samples, report, started, time.time(), cores(), setup
    )
    history = cache_home() / "ci-runs"
    last = cireport.latest(history, summary.started)
    text = cireport.render(summary, last)
    write_text(report / "summary.md", text + "\n")
    write_text(report / "summary.json", cireport.to_json(summary))
    _keep(history, summary)
    print("\n" + text, flush=True)
    warnings, failure = cireport.verdict(summary, pipeline.warn_factor)
    for w in warnings:
        print(w, flush=True)
    failed = [o.session.label for o in outcomes if o.state != "passed"]
    if failed:
        print(f"CI: {len(failed)} sessions did not pass: {', '.join(failed)}", flush=True)
    if failure:
        print(f"CI: {failure}", flush=True)
    return 1 if failed or failure else 0
