"""What the machine did while CI ran: CPU busy share (/proc/stat), memory and disk in use.

Readings are data (parsed from the kernel's text); ``Sampler`` takes one every few seconds in
a thread, and a session's share is read off the samples between its start and its end.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuTimes:
    """The first `cpu` line of /proc/stat, in clock ticks summed over every core."""

    busy: int
    total: int

    @classmethod
    def parse(cls, stat_text: str) -> CpuTimes:
        for line in stat_text.splitlines():
            fields = line.split()
            if fields and fields[0] == "cpu":
                ticks = [int(x) for x in fields[1:]]
                # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time
                # is already counted in user and nice, so only the first eight add up.
                ticks = (ticks + [0] * 8)[:8]
                idle = ticks[3] + ticks[4]
                return cls(busy=sum(ticks) - idle, total=sum(ticks))
        raise ValueError("no aggregate `cpu` line in /proc/stat")


def busy_share(start: CpuTimes, end: CpuTimes) -> float | None:
    """The share of every core's time that was busy between two readings (0..1)."""
    total = end.total - start.total
    if total <= 0:
        return None
    return max(0.0, min(1.0, (end.busy - start.busy) / total))


def mem_used(meminfo_text: str) -> int:
    """Bytes in use: MemTotal - MemAvailable (what the kernel could not give back at once)."""
    values = {}
    for line in meminfo_text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = int(parts[0]) * 1024
    return values.get("MemTotal", 0) - values.get("MemAvailable", values.get("MemFree", 0))


@dataclass(frozen=True)
class Sample:
    at: float  # time.time()
    cpu: CpuTimes
    mem: int  # bytes in use
    disk: int  # bytes in use on the watched file systems (each counted once)


def _read(path: str) -> str:
    return Path(path).read_text()


def take_sample(
    disks: Sequence[Path],
    read: Callable[[str], str] = _read,
    used: Callable[[Path], int] = lambda p: shutil.disk_usage(p).used,
    clock: Callable[[], float] = time.time,
) -> Sample:
    seen: set[int] = set()
    disk = 0
    for d in disks:
        try:
            dev = d.stat().st_dev
        except OSError:
            continue
        if dev not in seen:
            seen.add(dev)
            disk += used(d)
    return Sample(
        clock(), CpuTimes.parse(read("/proc/stat")), mem_used(read("/proc/meminfo")), disk
    )


def free_gb(disks: Sequence[Path]) -> float:
    """The least free space, in GiB, of the watched file systems that exist (inf: none)."""
    free = []
    for d in disks:
        try:
            free.append(shutil.disk_usage(d).free / 2**30)
        except OSError:
            continue
    return min(free, default=float("inf"))


@dataclass(frozen=True)
class Window:
    """What the samples say of one stretch of time."""

    busy: float | None
    peak_mem: int
    peak_disk: int
    disk_at_start: int


def window(samples: Sequence[Sample], start: float, end: float) -> Window | None:
    """The samples from the last one at or before ``start`` to the first at or after ``end``."""
    if not samples:
        return None
    first = max((i for i, s in enumerate(samples) if s.at <= start), default=0)
    last = min((i for i, s in enumerate(samples) if s.at >= end), default=len(samples) - 1)
    inside = samples[first : last + 1]
    return Window(
        busy=busy_share(inside[0].cpu, inside[-1].cpu) if len(inside) > 1 else None,
        peak_mem=max(s.mem for s in inside),
        peak_disk=max(s.disk for s in inside),
        disk_at_start=inside[0].disk,
    )


class Sampler:
    """A sample now, then every ``every`` seconds until stopped (and one at the stop)."""

    def __init__(self, disks: Sequence[Path], every: float = 5.0) -> None:
        self.disks = [d for d in disks if d.exists()]
        self.every = every
        self.samples: list[Sample] = [take_sample(self.disks)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="halo-ci-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(take_sample(self.disks))

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        self.samples.append(take_sample(self.disks))
        return self.samples


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
