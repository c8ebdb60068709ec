"""Run a Pipeline: each session a `nox -s NAME -- ARGS` process, started once what it waits
for has passed and the machine has room for it (cores, disk: pipeline.waits_for), side by
side with whatever else runs; progress lines while they run, naming what waits and why.

Each session writes its output to ``<report>/logs/NAME.log`` (the console would interleave
sessions) and its pytest results to ``<report>/junit/NAME.xml`` (PYTEST_ADDOPTS) and
``<report>/junit/NAME/`` (HALO_TEST_REPORTS: the tiers `halo test` runs in images). A failed
session's dependents are skipped; the others go on. The process launch is one function
(``Launch``), so the scheduling is tested with real, tiny processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from halo.workflow.pipeline import DiskLedger, Pipeline, Session, turn_has_come, waits_for

Launch = Callable[[Session, Mapping[str, str], TextIO], subprocess.Popen[bytes]]
HEARTBEAT_S = 60.0
FAILED_TAIL = 120  # lines of a failed session's log shown on the console


@dataclass(frozen=True)
class Outcome:
    session: Session
    state: str  # passed | failed | skipped
    start: float  # time.time(); for a skipped session, when it was given up
    end: float
    rc: int | None
    log: Path
    beside: tuple[str, ...] = ()  # sessions that ran at some point beside it
    reason: str = ""

    @property
    def minutes(self) -> float:
        return (self.end - self.start) / 60.0


def nox_launch(noxfile: Path) -> Launch:
    """`python -m nox -f NOXFILE -s NAME [-- ARGS]`, output into ``log``, in its own group, at
    the session's nice (coreutils' nice: where it may not raise a priority it says so and runs
    the session at its own)."""

    def launch(s: Session, env: Mapping[str, str], log: TextIO) -> subprocess.Popen[bytes]:
        argv = ["nice", "-n", str(s.nice)] if s.nice else []
        argv += [sys.executable, "-m", "nox", "--noxfile", str(noxfile), "-s", s.name]
        if s.args:
            argv += ["--", *s.args]
        proc = subprocess.Popen(
            argv,
            cwd=noxfile.parent,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if s.nice:
            _group_nice(proc.pid, s.nice)
        return proc

    return launch


def _group_nice(pid: int, nice: int) -> None:
    """The nice of ``pid``'s scheduling group, where the kernel has them (sched_autogroup: one
    group per session, and each container's is one). The cores are shared out between groups
    first and by nice(1) only within one, so a session's nice alone reorders nothing between
    sessions: run 34's toolchain tests at nice -10 took 17.4 minutes, as at nice 0."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def session_env(s: Session, report: Path, base: Mapping[str, str]) -> dict[str, str]:
    """The runner's environment, the session's own variables, and where its reports go."""
    env = {k: v for k, v in base.items() if k not in ("VIRTUAL_ENV", "NOX_CURRENT_SESSION")}
    for key, value in s.env:
        # $NAME and ${NAME} from the runner's environment; an unset one leaves the key unset.
        expanded = _VAR.sub(lambda m: base.get(m.group(1) or m.group(2), ""), value)
        if expanded:
            env[key] = expanded
        else:
            env.pop(key, None)
    junit = report / "junit" / f"{s.name}.xml"
    env["PYTEST_ADDOPTS"] = " ".join(
        x for x in (base.get("PYTEST_ADDOPTS", ""), f"--junitxml={shlex.quote(str(junit))}") if x
    )
    env["HALO_TEST_REPORTS"] = str(report / "junit" / s.name)
    return env


_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_PERCENT = re.compile(rb"\[\s*(\d+)%\]\s*$")


def progress_of(log: Path) -> str:
    """pytest's last `[ NN%]` in a log, or its last line, for a heartbeat."""
    try:
        with log.open("rb") as fh:
            fh.seek(max(0, log.stat().st_size - 4096))
            lines = [li.rstrip() for li in fh.read().splitlines() if li.strip()]
    except OSError:
        return ""
    for li in reversed(lines):
        if m := _PERCENT.search(li):
            return f"pytest {int(m.group(1))}%"
    return lines[-1].decode(errors="replace")[:70] if lines else ""


def tail(log: Path, n: int) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


@dataclass
class _Running:
    session: Session
    proc: subprocess.Popen[bytes]
    start: float
    log: Path
    fh: TextIO
    beside: set[str]


def run_pipeline(
    pipeline: Pipeline,
    report: Path,
    launch: Launch,
    say: Callable[[str], None],
    base_env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    poll_s: float = 0.5,
    heartbeat_s: float = HEARTBEAT_S,
    cpus: float = 3.0,
    free_gb: Callable[[], float] = lambda: float("inf"),
) -> list[Outcome]:
    """Run every session of ``pipeline``; returns their outcomes in the table's order.
    ``cpus`` is the machine's room when the table names none; ``free_gb`` measures the disk."""
    (report / "logs").mkdir(parents=True, exist_ok=True)
    (report / "junit").mkdir(parents=True, exist_ok=True)
    env0 = dict(os.environ if base_env is None else base_env)
    t0 = clock()
    pending = list(pipeline.runnable)
    running: dict[str, _Running] = {}
    done: dict[str, Outcome] = {}
    last_beat = t0
    room = pipeline.room(cpus)
    waiting: dict[str, str] = {}  # a pending session whose turn has come: why it waits
    ledger = DiskLedger(free_gb())

    def stamp() -> str:
        m, s = divmod(int(clock() - t0), 60)
        return f"[{m:3d}:{s:02d}]"

    def finish(r: _Running, rc: int) -> None:
        r.fh.close()
        state = "passed" if rc == 0 else "failed"
        out = Outcome(r.session, state, r.start, clock(), rc, r.log, tuple(sorted(r.beside)))
        done[r.session.name] = out
        word = "ok  " if rc == 0 else "FAIL"
        say(f"{stamp()} {word} {r.session.label}: {out.minutes:.1f} min (log {r.log})")
        if rc != 0:
            say(f"---- last {FAILED_TAIL} lines of {r.session.name} (exit {rc}) ----")
            for line in tail(r.log, FAILED_TAIL):
                say(f"  | {line}")
            say(f"---- end of {r.session.name} ----")

    try:
        while pending or running:
            for name, r in list(running.items()):
                rc = r.proc.poll()
                if rc is not None:
                    del running[name]
                    ledger.end(name)
                    finish(r, rc)
            free_now = free_gb()
            ledger.observe(free_now)
            for s in list(pending):
                blocked = [a for a in s.after if a in done and done[a].state != "passed"]
                if blocked:
                    pending.remove(s)
                    why = f"{blocked[0]} did not pass"
                    done[s.name] = Outcome(s, "skipped", clock(), clock(), None, Path(), reason=why)
                    say(f"{stamp()} skip {s.label}: {why}")
                    continue
                beside_now = [r.session for r in running.values()]
                if not turn_has_come(s, pending, beside_now, done):
                    continue
                why = waits_for(
                    s, beside_now, room, free_now, pipeline.disk_margin_gb, ledger.held_gb
                )
                if why is not None:
                    waiting[s.name] = why
                    continue
                waiting.pop(s.name, None)
                pending.remove(s)
                log = report / "logs" / f"{s.name}.log"
                fh = log.open("w")
                proc = launch(s, session_env(s, report, env0), fh)
                new = _Running(s, proc, clock(), log, fh, set(running))
                for r in running.values():
                    r.beside.add(s.name)
                running[s.name] = new
                ledger.start(s)
                beside = (
                    f" (beside {', '.join(sorted(running.keys() - {s.name}))})"
                    if len(running) > 1
                    else ""
                )
                say(f"{stamp()} start {s.label}{beside}")
            if running and clock() - last_beat >= heartbeat_s:
                last_beat = clock()
                parts = []
                for name, r in sorted(running.items()):
                    where = progress_of(r.log)
                    parts.append(
                        f"{name} {(clock() - r.start) / 60:.1f} min"
                        + (f" ({where})" if where else "")
                    )
                say(f"{stamp()} running: " + "; ".join(parts))
                if waiting:
                    say(
                        f"{stamp()} waiting: " + "; ".join(f"{n} ({w})" for n, w in waiting.items())
                    )
            if pending or running:
                time.sleep(poll_s)
    except BaseException:
        # Interrupted (Ctrl-C, CI's timeout): no session outlives the run.
        stop_all([r.proc for r in running.values()])
        raise
    return [done[s.name] for s in pipeline.runnable]


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Interrupt: each session's whole process group gets SIGTERM (nox passes it on)."""
    import signal

    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
