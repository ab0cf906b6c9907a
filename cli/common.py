"""What every command shares: output format, consoles, and mapping SpecctlError to exit codes.

Results go to stdout, diagnostics to stderr; Rich styling only on a terminal (Rich's own detection,
overridable with NO_COLOR / TERM=dumb). Commands wrap their body in `handle_errors()` so expected
failures print a message and a hint, never a traceback.

User and engine text is never parsed as Rich markup: the consoles here have markup off (a message
holding `[swa]` prints `[swa]`); styling is applied with `Text`/`style=`, never by interpolating into
markup. Off a terminal, lines are not hard-wrapped (soft wrap), so piped output keeps whole lines.
"""

from __future__ import annotations

import contextlib
import enum
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

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

    return _console(sys.stdout)


def stderr_console() -> Console:
    return _console(sys.stderr)


def _console(file: TextIO) -> Console:
    from rich.console import Console

    probe = Console(file=file)
    # On a terminal Rich wraps to the window; piped, a fixed 80-column hard wrap would cut sentences.
    return Console(file=file, markup=False, highlight=False, soft_wrap=not probe.is_terminal)


def fail(exc: SpecctlError) -> typer.Exit:
    """Print an expected failure on stderr and return the Exit to raise (`raise fail(e) from None`)."""
    from rich.text import Text

    err = stderr_console()
    err.print(Text.assemble(("error:", "bold red"), " ", str(exc)))
    if exc.hint:
        err.print(Text.assemble(("hint:", "yellow"), " ", exc.hint))
    return typer.Exit(exc.exit_code)


@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """Map SpecctlError to its exit code; Ctrl-C to 130 without a traceback."""
    try:
        yield
    except SpecctlError as exc:
        raise fail(exc) from None
    except ModuleNotFoundError as exc:  # the tool install reached the builtin engine: name the extra
        from specctl.engine.install import engine_error

        err = engine_error(exc)
        if err is None:
            raise
        raise fail(err) from None
    except KeyboardInterrupt:
        stderr_console().print("interrupted")
        raise typer.Exit(130) from None
