"""The one error type the CLI turns into a single line and exit code 2, and OSErrors as one."""

from __future__ import annotations

import errno
from pathlib import Path


class HaloError(Exception):
    """A user-facing failure: bad input, a refused artifact, a missing file.

    The message is one line that names the file or key, and what was expected.
    """

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# What people can act on, for the errors a full disk, a read-only mount or a file in the
# way of a folder give (the bare strerror names no path and reads like a bug).
_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a file is in the way of a folder",
    errno.EEXIST: "already exists (a file where a folder should be?)",
    errno.EISDIR: "a folder is in the way of a file",
    errno.ENOENT: "no such file or folder",
    errno.ENAMETOOLONG: "a name is too long for the file system",
    errno.EFBIG: "file too large (a file-size limit, ulimit -f, or the file system's maximum)",
}


def os_error(exc: OSError, path: Path | str | None = None, doing: str = "") -> HaloError:
    """An OSError as one HaloError line naming the path (the one in ``exc`` when it has one)."""
    where = exc.filename if exc.filename is not None else path
    reason = _REASONS.get(exc.errno or 0, exc.strerror or str(exc))
    what = f"cannot {doing}: {reason}" if doing else reason
    return HaloError(f"{where}: {what}" if where is not None else what)
