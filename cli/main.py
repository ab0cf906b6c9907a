"""The `specctl` Typer application. Each command lives in its own module under `specctl.cli` and
registers itself on `app` when imported; the list below is the whole command surface."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated

import typer

# Before any command loads torch's OpenMP runtime: idle intra-op threads sleep instead of spinning.
# On a shared CPU, spinning threads fight other processes (engine roles, the bench client) and a
# small model decodes ~30x slower (measured: 5 vs 166 tok/s for the tiny preset next to one busy
# process on 2 cores). Child processes (serve roles started by `up`) inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

def _completion_wanted() -> bool:
    """Typer's own shell completion (--install-completion, --show-completion; bash, zsh, fish) costs ~10 ms
    of start-up per command (it inspects its option functions), which `specctl validate` cannot spare: it
    is switched on only when it can be used, i.e. when the shell asks for completions (_SPECCTL_COMPLETE),
    a completion option is given, or help is shown (which lists the options)."""
    if os.environ.get("_SPECCTL_COMPLETE"):
        return True
    args = sys.argv[1:]
    return not args or any(a in ("--install-completion", "--show-completion", "--help") for a in args)


app = typer.Typer(
    name="specctl",
    help="Validate, launch and benchmark adaptive-speculative, prefill/decode-disaggregated deployments.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=_completion_wanted(),
    rich_markup_mode="markdown",
)


def _print_version(value: bool) -> None:
    if value:
        from specctl import __version__

        typer.echo(f"specctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print specctl's version and exit.")] = False,
) -> None:
    """specctl: preflight, launcher and benchmark for speculative + disaggregated LLM serving."""


COMMAND_MODULES = (
    "validate",  # validate, schema, presets, explain
    "adaptive",  # adaptive simulate
    "generate",  # generate (offline engine)
    "serve",  # serve, up
    "bench",  # bench, bench compare
    "preflight",  # preflight (live prefill/decode comparison)
    "watch",  # watch (a running pair, live)
    "model",  # model (config.json facts for SGLang)
    "sglang_io",  # import sglang, export sglang
)

for _name in COMMAND_MODULES:
    importlib.import_module(f"specctl.cli.{_name}")


@app.command()
def version() -> None:
    """Print specctl's version."""
    from specctl import __version__

    typer.echo(__version__)
