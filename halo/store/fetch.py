"""The fetch phase: bring every artifact of a lock into the store, verified by sha256.

Order of preference: already in the store (re-verified: by its stamp, or hashed again when the
file changed), a local substitute folder, the configured index. An entry that no longer hashes
right is fetched again, replaced, and reported as repaired. A substitute or download whose
bytes don't match the pin is refused and nothing of it is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from halo.confine import inside
from halo.errors import HaloError
from halo.pins.lockfile import Artifact, Lock
from halo.report import Progress, human_bytes, say, table
from halo.store.store import Store, check_key


class Index(Protocol):
    def locate(self, project: str, filename: str, sha256: str) -> str | None: ...

    def download(self, url: str) -> tuple[int | None, Iterable[bytes]]: ...


@dataclass(frozen=True)
class Fetched:
    package: str
    artifact: Artifact
    origin: str  # "store", "substitute", "index", or "repaired"
    size: int


def _from_substitutes(store: Store, art: Artifact, dirs: Sequence[Path]) -> bool:
    for folder in dirs:
        candidate = inside(folder, art.file, f"{art.file} (substitute {folder})")
        if not candidate.is_file():
            continue
        try:
            store.add_file(art.sha256, candidate, f"{art.file} (substitute {folder})")
            return True
        except HaloError as exc:
            say(f"  refused substitute: {exc.message}")
    return False


def _from_index(store: Store, package: str, art: Artifact, index: Index) -> None:
    url = index.locate(package, art.file, art.sha256)
    if url is None:
        raise HaloError(
            f"{art.file}: not found on the configured index(es) or substitutes (package {package})"
        )
    length, chunks = index.download(url)
    progress = Progress(art.file, length or art.size)
    store.add_stream(art.sha256, chunks, art.file, progress.advance, length or art.size)
    progress.finish()


def bring(store: Store, package: str, art: Artifact, index: Index, dirs: Sequence[Path]) -> str:
    if _from_substitutes(store, art, dirs):
        return "substitute"
    _from_index(store, package, art, index)
    return "index"


def fetch_lock(
    lock: Lock, store: Store, index: Index, substitutes: Sequence[Path]
) -> list[Fetched]:
    results = []
    wanted = [(p.name, a) for p in lock.packages for a in p.artifacts]
    for _, art in wanted:  # every key is checked before anything is written
        check_key(art.sha256)
    say(f"fetch {lock.set}: {len(wanted)} artifacts into {store.root}")
    for package, art in wanted:
        if store.has(art.sha256):
            bad = store.check(art.sha256)
            if bad is None:
                origin = "store"
            else:
                got = bad.actual[:12] or "unreadable bytes"
                say(f"  {art.file}: store entry corrupted (sha256 {got}…), fetching it again")
                # The good bytes replace the bad ones in one rename; until then the entry
                # stays (refused by every reader), so the next fetch still reports the repair.
                try:
                    bring(store, package, art, index, substitutes)
                except HaloError as exc:
                    raise HaloError(
                        f"{art.file}: store entry corrupted and not replaced ({exc.message}); "
                        f"run `halo fetch {lock.set}` when a source has it"
                    ) from None
                origin = "repaired"
        else:
            origin = bring(store, package, art, index, substitutes)
        size = store.path(art.sha256).stat().st_size
        results.append(Fetched(package, art, origin, size))
    return results


def summary(set_name: str, results: Sequence[Fetched]) -> str:
    by_origin: dict[str, list[Fetched]] = {}
    for r in results:
        by_origin.setdefault(r.origin, []).append(r)
    rows = [
        (origin, len(items), human_bytes(sum(i.size for i in items)))
        for origin, items in sorted(by_origin.items())
    ]
    rows.append(("total", len(results), human_bytes(sum(r.size for r in results))))
    repaired = [r.artifact.file for r in by_origin.get("repaired", [])]
    head = f"fetch {set_name}: every artifact verified by sha256"
    if repaired:
        head += f"; repaired {len(repaired)} corrupt store entr{'y' if len(repaired) == 1 else 'ies'}: {', '.join(repaired)}"
    return head + "\n" + table(("from", "artifacts", "bytes"), rows)
