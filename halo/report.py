"""Progress lines and short result tables on stderr/stdout."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    """Byte progress for one transfer, at most a few lines a second, plain text (CI logs)."""

    def __init__(self, label: str, total: int | None, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self._start = time.monotonic()
        self._last = self._start  # the first line comes after a while, or at the end

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= 2.0:
            self._last = now
            self._emit()

    def finish(self) -> None:
        self._emit(final=True)

    def _emit(self, final: bool = False) -> None:
        total = f"/{human_bytes(self.total)}" if self.total else ""
        rate = self.done / max(time.monotonic() - self._start, 1e-6)
        state = "done" if final else "..."
        print(
            f"  {self.label}: {human_bytes(self.done)}{total} ({human_bytes(rate)}/s) {state}",
            file=self.stream,
            flush=True,
        )


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
