"""SIGTERM and SIGINT: finish the batch, write one emergency checkpoint, exit 0.

`halo launch` blocks both signals before it replaces itself with the trainer, and the
trainer installs its handler first thing and only then unblocks them: a signal that arrives
while torch is still importing waits instead of killing the process. Later signals (a
scheduler's repeated SIGTERM, a second Ctrl-C) are counted and change nothing.
"""

from __future__ import annotations

import signal
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def block() -> None:
    """Hold SIGTERM/SIGINT pending (the mask survives exec) until the trainer is ready."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


class StopFlag:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "stop"

    def install(self) -> None:
        for s in SIGNALS:
            signal.signal(s, self._handle)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)

    def done(self) -> None:
        """Ignore later signals while the process exits: at interpreter shutdown Python puts
        the default (fatal) action back for signals with a Python handler, so a scheduler's
        third SIGTERM would otherwise kill a run that already saved and finished."""
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)

    def _handle(self, signum: int, frame: Any) -> None:
        # No printing here: a handler that writes while the loop writes can raise in the
        # middle of a print (a reentrant buffered write).
        self.count += 1
        if self.signum is None:
            self.signum = signum
