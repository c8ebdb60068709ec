"""Run a multi-process launcher (torchrun, accelerate) as a child and relay signals to it.

torchrun turns a SIGTERM into an exception and exits 1 even when every worker finished its
batch, saved an emergency checkpoint and exited 0. Staying the parent lets `halo launch`
report what happened: after a relayed SIGTERM it exits 0 when the newest complete checkpoint
is an emergency one written since the launch, and the launcher's code otherwise. Only the
first signal is relayed: the workers are already stopping, and a second SIGTERM to torchrun
would make it kill them mid-checkpoint.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any


def emergency_saved(job_dir: Path, since: float) -> bool:
    from halo.train import checkpoint

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


def _relay_stderr(stream: IO[str], tail: deque[str]) -> None:
    """Pass the launcher's stderr through, keeping the last lines for `failed_rank`."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        tail.append(line)


def run(argv: list[str], env: dict[str, str], job_dir: Path) -> int:
    started = time.time()
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    tail: deque[str] = deque(maxlen=400)
    assert proc.stderr is not None
    reader = threading.Thread(target=_relay_stderr, args=(proc.stderr, tail), daemon=True)
    reader.start()
    relayed: list[int] = []

    def relay(signum: int, frame: Any) -> None:
        relayed.append(signum)
        if len(relayed) == 1:
            proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, relay) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        reader.join(timeout=10)
    if rc != 0 and relayed and emergency_saved(job_dir, started):
        print(
            "halo launch: signal relayed; the workers saved an emergency checkpoint, exiting 0",
            file=sys.stderr,
            flush=True,
        )
        return 0
    if rc != 0:
        line = failed_rank(list(tail))
        if line:
            print(line, file=sys.stderr, flush=True)
    return rc
