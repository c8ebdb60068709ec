"""`halo fetch` for a base's .debs: the OS lock's files into the store, like wheels.

The OS lock is seen as a Lock of one-artifact packages, so the fetch, repair and gc code is
the wheels' code: kept only when the bytes hash to the lock's sha256, a tampered entry
refused and fetched again, never trusted by name. The mirror (halo.sources.debian_mirror) is
only a place to download from: a .deb stays in the store after the archive superseded it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from halo.pins.deblock import DebLock, deb_lock_name
from halo.pins.lockfile import Artifact, Lock, Package
from halo.store.index import IndexClient


def as_lock(lock: DebLock) -> Lock:
    """The OS lock in the shape fetch, verify and gc read (set name: the base's lock file)."""
    packages = tuple(
        Package(d.name, d.version, (Artifact(d.file, d.sha256, d.size),)) for d in lock.debs
    )
    return Lock(
        set=lock.inputs.base,
        python="",
        platform=f"debian-{lock.inputs.suite}-{lock.inputs.architecture}",
        inputs_sha256=lock.inputs.sha256,
        packages=packages,
        extra={"lock": deb_lock_name(lock.inputs.base)},
    )


@dataclass
class DebMirror:
    """An Index over a Debian mirror: a .deb is found at MIRROR/Filename, by the lock's sha256."""

    url: str
    pool: dict[str, str]  # sha256 -> archive-relative Filename

    @classmethod
    def for_locks(cls, url: str, locks: Iterable[DebLock]) -> DebMirror:
        return cls(url.rstrip("/"), {d.sha256: d.filename for lk in locks for d in lk.debs})

    def locate(self, project: str, filename: str, sha256: str) -> str | None:
        rel = self.pool.get(sha256)
        return f"{self.url}/{rel}" if rel else None

    download = staticmethod(IndexClient.download)


@dataclass
class Indexes:
    """Several indexes as one: the first that locates an artifact serves it (repair of a store
    that holds wheels and .debs)."""

    members: list[object]

    def locate(self, project: str, filename: str, sha256: str) -> str | None:
        for index in self.members:
            url = index.locate(project, filename, sha256)  # type: ignore[attr-defined]
            if url:
                return url  # type: ignore[no-any-return]
        return None

    download = staticmethod(IndexClient.download)
