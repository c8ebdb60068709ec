"""A content-addressed store: every file lives under its sha256 and is kept only if it matches.

Layout under the root:

    sha256/ab/<sha256>     the bytes (read-only), named by their hash
    verified/<sha256>      a stamp: size, mtime, inode and device of the entry when it last hashed right
    sha256/ab/.incoming.*  a download in progress (locked by its writer; `halo store gc` drops dead ones)

Re-hashing gigabytes of wheels on every build is what made a warm rebuild slow, so an entry
whose size, mtime, inode and device still match its stamp counts as verified; anything that
rewrites the file changes one of them and forces a re-hash. `verify(..., rehash=True)`
ignores stamps (`halo store verify`, and before a push).

The key is checked here, not only by the lock reader: a name that is not 64 lowercase hex
digits (``../../etc/passwd``) never becomes a path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from halo.atomic import write_text
from halo.errors import HaloError, os_error
from halo.hashing import CHUNK, sha256_file

SHA256_RE = re.compile(r"[0-9a-f]{64}")
PARTIAL_PREFIX = ".incoming."


def check_key(sha256: object) -> str:
    """``sha256`` if it is 64 lowercase hex digits; anything else is refused before any I/O."""
    if not isinstance(sha256, str) or not SHA256_RE.fullmatch(sha256):
        raise HaloError(f"store: refusing key {sha256!r}: a sha256 is 64 lowercase hex digits")
    return sha256


@dataclass(frozen=True)
class Stamp:
    """What an entry looked like when it last hashed right."""

    size: int
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, st: os.stat_result) -> Stamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


@dataclass(frozen=True)
class Corrupt:
    sha256: str
    actual: str  # the hash of the bytes found ("" when they could not be read)


@dataclass(frozen=True)
class Store:
    root: Path

    def path(self, sha256: str) -> Path:
        key = check_key(sha256)
        return self.root / "sha256" / key[:2] / key

    def _stamp_path(self, sha256: str) -> Path:
        return self.root / "verified" / check_key(sha256)

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    # -- verification --------------------------------------------------------------------

    def _stamp(self, sha256: str) -> Stamp | None:
        try:
            data = json.loads(self._stamp_path(sha256).read_text())
            return Stamp(**data)
        except (OSError, ValueError, TypeError):
            return None  # no stamp, or an unreadable one: hash again

    def _write_stamp(self, sha256: str, stamp: Stamp) -> None:
        # Best effort: a store another user owns read-only still verifies, just more slowly.
        with contextlib.suppress(OSError):
            write_text(self._stamp_path(sha256), json.dumps(stamp.__dict__), mode=0o644)

    def check(self, sha256: str, rehash: bool = False) -> Corrupt | None:
        """None when the entry holds the right bytes; its stamp spares the hash when it still fits.

        A missing entry raises; a corrupt one is returned, so callers can repair or refuse.
        """
        path = self.path(sha256)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise HaloError(f"{path}: not in the store") from None
        except OSError as exc:
            raise os_error(exc, path, "read the store entry") from None
        if not rehash and self._stamp(sha256) == Stamp.of(st):
            return None
        try:
            actual = sha256_file(path)
        except OSError:
            actual = ""
        if actual != sha256:
            return Corrupt(sha256, actual)
        self._write_stamp(sha256, Stamp.of(st))
        return None

    def verify(
        self, sha256: str, label: str, fix: str = "halo fetch", rehash: bool = False
    ) -> Path:
        """The stored file, verified now; a tampered or missing entry is refused, naming the fix."""
        path = self.path(sha256)
        if not path.is_file():
            raise HaloError(f"{label}: not in the store ({self.root}); run `{fix}`")
        bad = self.check(sha256, rehash=rehash)
        if bad is not None:
            got = bad.actual or "unreadable bytes"
            raise HaloError(
                f"{label}: store entry corrupted: expected sha256 {sha256}, got {got}; "
                f"run `{fix}` to replace it"
            )
        return path

    def discard(self, sha256: str) -> None:
        """Drop an entry (and its stamp), e.g. before replacing corrupt bytes."""
        for path in (self.path(sha256), self._stamp_path(sha256)):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise os_error(exc, path, "remove the store entry") from None

    # -- adding --------------------------------------------------------------------------

    def add_stream(
        self,
        sha256: str,
        chunks: Iterable[bytes],
        label: str,
        on_bytes: Callable[[int], None] = lambda n: None,
        expected_size: int | None = None,
    ) -> Path:
        """Keep the bytes only if they hash to ``sha256`` (a fixed-output fetch).

        ``expected_size`` (a Content-Length, or the lock's size) turns a download that stopped
        early into its own message instead of a hash mismatch.
        """
        final = self.path(sha256)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=PARTIAL_PREFIX, dir=final.parent)
        except OSError as exc:
            raise os_error(exc, final.parent, "write to the store") from None
        tmp = Path(tmp_name)
        h = hashlib.sha256()
        n = 0
        try:
            try:
                # (closing flushes too, and can fail on a full disk: inside the try)
                with os.fdopen(fd, "wb") as out:
                    # The lock tells `halo store gc` this partial is alive; it dies with its writer.
                    fcntl.flock(out.fileno(), fcntl.LOCK_EX)
                    for chunk in chunks:
                        h.update(chunk)
                        out.write(chunk)
                        n += len(chunk)
                        on_bytes(len(chunk))
                    out.flush()
                    os.fsync(out.fileno())
            except OSError as exc:
                raise os_error(exc, tmp, "write to the store") from None
            if expected_size is not None and n < expected_size:
                raise HaloError(
                    f"{label}: download cut short: got {n} of {expected_size} bytes; not kept"
                )
            actual = h.hexdigest()
            if actual != sha256:
                raise HaloError(
                    f"{label}: sha256 mismatch: expected {sha256}, got {actual}; not kept"
                )
            try:
                tmp.chmod(0o444)
                tmp.replace(final)
            except OSError as exc:
                raise os_error(exc, final, "write to the store") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        self._write_stamp(sha256, Stamp.of(final.stat()))
        return final

    def add_file(
        self, sha256: str, src: Path, label: str, on_bytes: Callable[[int], None] = lambda n: None
    ) -> Path:
        try:
            fh = src.open("rb")
        except OSError as exc:
            raise os_error(exc, src, "read") from None
        with fh:
            return self.add_stream(sha256, iter(lambda: fh.read(CHUNK), b""), label, on_bytes)

    def link_into(self, sha256: str, dest: Path) -> None:
        """Place a store entry at ``dest`` without copying when the filesystem allows it."""
        src = self.path(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copyfile(src, dest)

    # -- listing (verify, gc) ------------------------------------------------------------

    def entries(self) -> Iterator[str]:
        """Every stored sha256, sorted."""
        root = self.root / "sha256"
        if not root.is_dir():
            return
        for sub in sorted(root.iterdir()):
            if sub.is_dir():
                for path in sorted(sub.iterdir()):
                    if SHA256_RE.fullmatch(path.name) and path.is_file():
                        yield path.name

    def partials(self) -> Iterator[Path]:
        root = self.root / "sha256"
        if root.is_dir():
            yield from sorted(root.glob(f"*/{PARTIAL_PREFIX}*"))

    def stamps(self) -> Iterator[Path]:
        root = self.root / "verified"
        if root.is_dir():
            yield from sorted(root.iterdir())


def partial_is_dead(path: Path) -> bool:
    """True when no process is writing ``path`` any more (its writer's lock is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
