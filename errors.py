"""One exception base for every expected failure, carrying the process exit code.

Exit codes: 0 ok; 1 invalid input (findings); 2 usage error or unreadable
input; 3 launch, handshake or runtime failure. The CLI prints `str(exc)` (and `exc.hint`) without a
traceback; asserts are reserved for internal invariants.
"""

from __future__ import annotations


class SpecctlError(Exception):
    """An expected failure with an actionable message."""

    exit_code = 3

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


class InvalidInput(SpecctlError):
    """The input was read but is invalid (findings)."""

    exit_code = 1


class UsageError(SpecctlError):
    """Bad options, or a file that cannot be read or parsed."""

    exit_code = 2


class RuntimeFailure(SpecctlError):
    """Launch, handshake, transfer or engine failure."""

    exit_code = 3
