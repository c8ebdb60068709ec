"""The one error type the CLI turns into a single line and exit code 2."""

from __future__ import annotations


class HaloError(Exception):
    """A user-facing failure: bad input, a refused artifact, a missing file.

    The message is one line that names the file or key, and what was expected.
    """

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
