"""A content-addressed store: every file lives under its sha256 and is kept only if it matches."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from halo.errors import HaloError
from halo.hashing import CHUNK, sha256_file


@dataclass(frozen=True)
class Store:
    root: Path

    def path(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def verify(self, sha256: str, label: str) -> Path:
        """The stored file, re-hashed now; a tampered or missing entry is refused."""
        path = self.path(sha256)
        if not path.is_file():
            raise HaloError(
                f"{label}: not in the store ({path.parent.parent.parent}); run `halo fetch`"
            )
        actual = sha256_file(path)
        if actual != sha256:
            raise HaloError(
                f"{label}: store entry corrupted: expected sha256 {sha256}, got {actual}; run `halo fetch` to replace it"
            )
        return path

    def add_stream(
        self,
        sha256: str,
        chunks: Iterable[bytes],
        label: str,
        on_bytes: Callable[[int], None] = lambda n: None,
    ) -> Path:
        """Keep the bytes only if they hash to ``sha256`` (a fixed-output fetch)."""
        final = self.path(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".incoming.", dir=final.parent)
        tmp = Path(tmp_name)
        h = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    h.update(chunk)
                    out.write(chunk)
                    on_bytes(len(chunk))
            actual = h.hexdigest()
            if actual != sha256:
                raise HaloError(
                    f"{label}: sha256 mismatch: expected {sha256}, got {actual}; not kept"
                )
            tmp.chmod(0o444)
            tmp.replace(final)
        finally:
            tmp.unlink(missing_ok=True)
        return final

    def add_file(
        self, sha256: str, src: Path, label: str, on_bytes: Callable[[int], None] = lambda n: None
    ) -> Path:
        with src.open("rb") as fh:
            return self.add_stream(sha256, iter(lambda: fh.read(CHUNK), b""), label, on_bytes)

    def link_into(self, sha256: str, dest: Path) -> None:
        """Place a store entry at ``dest`` without copying when the filesystem allows it."""
        src = self.path(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copyfile(src, dest)
