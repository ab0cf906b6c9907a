"""What every command shares: output format, consoles, and mapping SpecctlError to exit codes.

Results go to stdout, diagnostics to stderr; Rich styling only on a terminal (Rich's own detection,
overridable with NO_COLOR / TERM=dumb). Commands wrap their body in `handle_errors()` so expected
failures print a message and a hint, never a traceback.
"""

from __future__ import annotations

import contextlib
import enum
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import typer

from specctl.errors import SpecctlError

if TYPE_CHECKING:
    from rich.console import Console


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"


def stdout_console() -> Console:
    # Created per call so tests (CliRunner swaps sys.stdout) and width settings are honoured.
    # Imported here: rich.console costs ~0.1 s of start-up that `specctl validate` must not pay.
    from rich.console import Console

    return Console(file=sys.stdout, soft_wrap=False)


def stderr_console() -> Console:
    from rich.console import Console

    return Console(file=sys.stderr, soft_wrap=False)


def fail(exc: SpecctlError) -> typer.Exit:
    """Print an expected failure on stderr and return the Exit to raise (`raise fail(e) from None`)."""
    err = stderr_console()
    err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
    if exc.hint:
        err.print(f"[yellow]hint:[/] {exc.hint}", markup=True, highlight=False)
    return typer.Exit(exc.exit_code)


@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """Map SpecctlError to its exit code; Ctrl-C to 130 without a traceback."""
    try:
        yield
    except SpecctlError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        stderr_console().print("interrupted")
        raise typer.Exit(130) from None
