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
import time
from pathlib import Path
from typing import Any


def emergency_saved(job_dir: Path, since: float) -> bool:
    from halo.train import checkpoint

    found = checkpoint.latest(job_dir)
    if found is None or found.path.stat().st_mtime < since:
        return False
    return json.loads((found.path / "meta.json").read_text()).get("reason") == "signal"


def run(argv: list[str], env: dict[str, str], job_dir: Path) -> int:
    started = time.time()
    proc = subprocess.Popen(argv, env=env)
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
    if rc != 0 and relayed and emergency_saved(job_dir, started):
        print(
            "halo launch: signal relayed; the workers saved an emergency checkpoint, exiting 0",
            file=sys.stderr,
            flush=True,
        )
        return 0
    return rc
