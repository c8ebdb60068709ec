"""`halo store verify [--repair]` and `halo store gc`: keep the store honest and small.

verify  hashes every entry again (stamps ignored); with --repair, a corrupt entry a lock names
        is fetched again and one nothing names is removed.
gc      drops downloads whose writer died (``.incoming.*``), entries no lock (and no
        derivation record) names, and stamps of entries that are gone.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from halo.errors import HaloError, os_error
from halo.pins.lockfile import Artifact, Lock
from halo.store.fetch import Index, bring
from halo.store.store import SHA256_RE, Store, partial_is_dead


def named_by_locks(locks: Sequence[Lock]) -> dict[str, tuple[str, Artifact]]:
    """sha256 -> (package, artifact) for every artifact the locks pin."""
    return {a.sha256: (p.name, a) for lock in locks for p in lock.packages for a in p.artifacts}


def named_by_derivations(store: Store) -> set[str]:
    """Wheels that realised source derivations point at (their records live in the store)."""
    out = set()
    folder = store.root / "derivations"
    if folder.is_dir():
        for record in folder.glob("*.json"):
            try:
                sha = json.loads(record.read_text()).get("sha256")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(sha, str) and SHA256_RE.fullmatch(sha):
                out.add(sha)
    return out


@dataclass
class VerifyReport:
    checked: int = 0
    corrupt: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    partials: list[Path] = field(default_factory=list)


def verify_store(
    store: Store,
    locks: Sequence[Lock],
    index: Index | None = None,
    substitutes: Sequence[Path] = (),
) -> VerifyReport:
    """Hash every entry again; with an ``index`` (repair), replace or remove the corrupt ones."""
    named = named_by_locks(locks)
    report = VerifyReport(partials=[p for p in store.partials() if partial_is_dead(p)])
    for sha in store.entries():
        report.checked += 1
        if store.check(sha, rehash=True) is None:
            continue
        report.corrupt.append(sha)
        if index is None:
            continue
        if sha in named:
            package, art = named[sha]
            try:
                bring(store, package, art, index, substitutes)
            except HaloError as exc:
                raise HaloError(
                    f"{art.file}: store entry corrupted and not replaced ({exc.message}); "
                    "run `halo store verify --repair` when a source has it"
                ) from None
            report.repaired.append(art.file)
        else:
            store.discard(sha)
            report.removed.append(sha)
    return report


@dataclass
class GcReport:
    partials: list[Path] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)
    stamps: list[Path] = field(default_factory=list)
    freed: int = 0


def gc_store(store: Store, locks: Sequence[Lock], dry_run: bool = False) -> GcReport:
    keep = set(named_by_locks(locks)) | named_by_derivations(store)
    report = GcReport()
    for partial in store.partials():
        if partial_is_dead(partial):
            report.partials.append(partial)
            report.freed += _size(partial)
    for sha in store.entries():
        if sha not in keep:
            report.entries.append(sha)
            report.freed += _size(store.path(sha))
    gone = set(report.entries)
    for stamp in store.stamps():
        if stamp.name in gone or not (SHA256_RE.fullmatch(stamp.name) and store.has(stamp.name)):
            report.stamps.append(stamp)
    if dry_run:
        return report
    for path in [*report.partials, *(store.path(s) for s in report.entries), *report.stamps]:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise os_error(exc, path, "remove") from None
    return report


def _size(path: Path) -> int:
    with contextlib.suppress(OSError):
        return path.stat().st_size
    return 0
