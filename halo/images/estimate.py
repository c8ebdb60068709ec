"""Where a derivation's wheel would come from, and what compiling it costs on this host.

A derivation is in the store (its record and wheel, verified), in the binary cache (an entry
under its hash; pulling compiles nothing), or must compile. The compile estimate is
core-time divided by this host's parallelism (MAX_JOBS): the core-time of the last compile of
the same source recorded in the store (any inputs: what one compile of it costs), else a
seed figure per source pin for one architecture. Estimates are marked as such.
"""

from __future__ import annotations

from typing import Protocol

from halo.builder.record import read_record, store_records
from halo.errors import HaloError
from halo.images.realise.derivation import Cache, parallelism
from halo.store.store import Store


class Named(Protocol):
    """A derivation, or its node in a plan: what an estimate needs is its source's name."""

    @property
    def name(self) -> str: ...


# Core-hours of one single-architecture compile with the cuda-builder toolchain, where no
# record of one exists yet. Measured on this kind of host (2 busy cores): FA2's first nvcc
# unit (one of 73) took 7 min for sm_100, so about 8 core-hours; FA3 (hopper/, sm_90a, no
# SM8x) has about 100 units, each several times heavier; DeepEP's AOT part took 5.3 min at
# MAX_JOBS=2.
SEED_CORE_HOURS = {"flash-attn": 8.0, "flash-attn-3": 40.0, "deep-ep": 0.2}
LONG_HOURS = 2.0  # beyond this, the plan says to compile on a host with the cores


class CacheProbe:
    """``has`` of a cache, with a failing registry reported once instead of failing the plan."""

    def __init__(self, cache: Cache | None) -> None:
        self.cache = cache
        self.problem: str | None = None

    def has(self, drv_hash: str) -> bool | None:
        if self.cache is None or self.problem is not None:
            return None
        try:
            return bool(self.cache.has(drv_hash))  # type: ignore[attr-defined]
        except HaloError as exc:
            self.problem = exc.message
            return None


def where(drv_hash: str, store: Store, cache: CacheProbe) -> str | None:
    """Where the wheel is ("in the store", "in the cache"), or None: it must compile."""
    record = read_record(store, drv_hash)
    if record is not None:
        return f"in the store ({record.wheel})"
    if cache.has(drv_hash):
        return "in the cache: pulled, not compiled"
    return None


def core_seconds(name: str, store: Store) -> tuple[float, str]:
    """(core-seconds of one compile of ``name``, where the figure comes from)."""
    measured = [r for r in store_records(store) if r.name == name and r.compile is not None]
    if measured:
        c = measured[-1].compile
        assert c is not None
        return c.seconds * min(c.jobs, c.cores), "measured"
    return SEED_CORE_HOURS.get(name, 1.0) * 3600, "estimate"


def compile_estimate(drv: Named, store: Store) -> str:
    jobs = int(parallelism()["MAX_JOBS"])
    seconds, basis = core_seconds(drv.name, store)
    hours = seconds / jobs / 3600
    shown = f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"
    text = f"must compile: ~{shown} at MAX_JOBS={jobs} ({basis})"
    if hours > LONG_HOURS:
        text += ": leave it to a host with the cores"
    return text
