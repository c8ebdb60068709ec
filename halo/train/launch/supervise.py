"""Run a multi-process launcher (torchrun, accelerate) as a child and relay signals to it.

SIGTERM and SIGINT go to the workers themselves, never through torchrun: torchrun, on its own
SIGTERM, gives its workers 30 s and then kills them, mid-checkpoint for a large model. So the
launcher starts with both signals blocked (the mask is inherited through fork and exec, by
torchrun and by its workers); each worker unblocks them once its handler is in place
(halo.train.loop.stopping), and torchrun never sees them: not ours, not a scheduler's that signals
the whole process tree (Slurm's `--signal`). The first SIGTERM/SIGINT to `halo launch` is sent
on to the launcher's children, the workers; they finish the batch, write one emergency
checkpoint and exit 0, and so does torchrun. Later signals are not relayed: the workers are
already stopping. A signal that comes before any worker exists (a rendezvous still waiting)
stops the launcher with SIGHUP, which torchrun handles; there is nothing to save yet.
After a relayed signal `halo launch` exits 0 when the newest complete checkpoint is an
emergency one written since the launch, and the launcher's code otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any


def emergency_saved(job_dir: Path, since: float) -> bool:
    from halo.train.checkpoints import checkpoint

    found = checkpoint.latest(job_dir)
    if found is None or found.path.stat().st_mtime < since:
        return False
    return json.loads((found.path / "meta.json").read_text()).get("reason") == "signal"


def failed_rank(lines: list[str]) -> str | None:
    """torchrun's failure summary (its "Root Cause" block) as one line naming the rank."""
    try:
        start = max(
            i for i, line in enumerate(lines) if "Root Cause (first observed failure)" in line
        )
    except ValueError:
        return None
    fields: dict[str, str] = {}
    for line in lines[start + 1 :]:
        key, sep, value = line.strip().partition(":")
        key = key.strip()
        if sep and key in ("host", "rank", "exitcode", "traceback") and key not in fields:
            fields[key] = value.strip()
        if line.startswith("====") and fields:
            break
    if "rank" not in fields:
        return None
    rank = fields["rank"].replace("(local_rank:", "(local rank")
    why = fields.get("traceback", "")
    why = "" if why in ("", "<N/A>") or why.startswith("To enable traceback") else f": {why}"
    return (
        f"halo launch: rank {rank} on {fields.get('host', '?')} failed with exit code "
        f"{fields.get('exitcode', '?').split(' ')[0]}{why}; the job is stopped"
    )


# torchrun's own failures before any worker ran, as the line a person can act on.
RENDEZVOUS = {
    "RendezvousTimeoutError": "the rendezvous timed out: not every node joined within "
    "runtime.rdzv.join_timeout_s (is every node started, and the endpoint the first node's "
    "reachable address?)",
    "RendezvousClosedError": "the rendezvous was closed: another node of this job stopped",
}


def failure_line(lines: list[str]) -> str | None:
    """One line for a failed launcher: the rank that failed, or the rendezvous problem."""
    found = failed_rank(lines)
    if found:
        return found
    for name, what in RENDEZVOUS.items():
        if any(name in line for line in lines):
            return f"halo launch: {what}"
    return None


def _relay_stderr(stream: IO[str], tail: deque[str]) -> None:
    """Pass the launcher's stderr through, keeping the last lines for `failed_rank`."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        tail.append(line)


def children(pid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc/*/stat)."""
    out = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(entry.name))
    return sorted(out)


def _stop(proc: subprocess.Popen[str]) -> None:
    workers = children(proc.pid)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if not workers and proc.poll() is None:
        proc.send_signal(signal.SIGHUP)


def run(argv: list[str], env: dict[str, str], job_dir: Path) -> int:
    started = time.time()
    signals = (signal.SIGTERM, signal.SIGINT)
    relayed: list[int] = []

    def relay(signum: int, frame: Any) -> None:
        relayed.append(signum)

    previous = {s: signal.signal(s, relay) for s in signals}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    tail: deque[str] = deque(maxlen=400)
    assert proc.stderr is not None
    reader = threading.Thread(target=_relay_stderr, args=(proc.stderr, tail), daemon=True)
    reader.start()
    stopped = False
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if relayed and not stopped:
                stopped = True
                _stop(proc)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        reader.join(timeout=10)
    if relayed and emergency_saved(job_dir, started):
        print(
            "halo launch: signal relayed; the workers saved an emergency checkpoint, exiting 0",
            file=sys.stderr,
            flush=True,
        )
        return 0
    if rc != 0:
        line = failure_line(list(tail))
        if line:
            print(line, file=sys.stderr, flush=True)
    return rc
