"""runtime.profile: torch.profiler around a window of steps, on the ranks asked for.

Each profiled rank writes a Chrome/Perfetto trace (open it in ui.perfetto.dev or
chrome://tracing) to ``$HALO_DATA_ROOT/profiling/<job>/rank<R>-steps<A>-<B>.json`` and logs a
short table of its top operators by self time. CPU activity always, CUDA where there is a GPU.
Off by default: then no Window exists and a step checks one attribute, nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from halo.train.config import Config
from halo.train.data.dataroot import data_root

TOP = 8


class Window:
    """The profiler of one rank over steps ``first``..``last`` (1-based, inclusive)."""

    def __init__(
        self, folder: Path, rank: int, first: int, last: int, say: Callable[[str], None] = print
    ) -> None:
        self.folder, self.rank, self.first, self.last, self.say = folder, rank, first, last, say
        self.prof: Any = None
        self.done = False

    def before(self, step: int) -> None:
        """Step ``step`` (1-based) is about to run."""
        if self.prof is None and not self.done and step == self.first:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(ProfilerActivity.CUDA)
            self.prof = profile(activities=acts, acc_events=True)  # one window: keep its events
            self.prof.__enter__()
            self.last_seen = step

    def after(self, step: int) -> None:
        """Step ``step`` finished."""
        if self.prof is not None:
            self.last_seen = step
            if step >= self.last:
                self.close()

    def close(self) -> None:
        """End the window (at its last step, or earlier when the run stops): write the trace."""
        if self.prof is None:
            return
        prof, self.prof, self.done = self.prof, None, True
        prof.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{self.rank}-steps{self.first}-{self.last_seen}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            prof.export_chrome_trace(str(tmp))
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        for line in table(prof, self.rank, self.first, self.last_seen):
            self.say(line)
        self.say(f"profile rank {self.rank}: trace {path}")


def table(prof: Any, rank: int, first: int, last: int) -> list[str]:
    """The top operators by self time (device time where there is one), as log lines."""
    device = torch.cuda.is_available()
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    attr = "self_device_time_total" if device else "self_cpu_time_total"
    events.sort(key=lambda e: getattr(e, attr, 0.0), reverse=True)
    total = sum(getattr(e, attr, 0.0) for e in events) or 1.0
    where = "device" if device else "CPU"
    lines = [f"profile rank {rank}, steps {first}-{last}: top operators by self {where} time"]
    lines.append(f"  {'operator':<40} {'calls':>7} {'self ms':>10} {'share':>6}")
    for e in events[:TOP]:
        t = getattr(e, attr, 0.0)
        lines.append(f"  {e.key[:40]:<40} {e.count:>7} {t / 1000:>10.2f} {t / total:>6.1%}")
    return lines


def window(cfg: Config, rank: int, total_steps: int) -> Window | None:
    """This rank's Window for runtime.profile, or None (off, or not one of its ranks)."""
    p = cfg.runtime.profile
    if p is None or (p.ranks != "all" and rank not in p.ranks):
        return None
    last = min(p.start_step + p.steps - 1, total_steps)
    if p.start_step > total_steps:
        print(
            f"profile: runtime.profile.start_step {p.start_step} is after the run's last step "
            f"{total_steps}; nothing is profiled",
            flush=True,
        )
        return None
    folder = data_root() / "profiling" / cfg.runtime.job_name
    return Window(folder, rank, p.start_step, last)
