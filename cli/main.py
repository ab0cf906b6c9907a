"""The `specctl` Typer application. Each command lives in its own module under `specctl.cli` and
registers itself on `app` when imported; the list below is the whole command surface."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="specctl",
    help="Validate, launch and benchmark adaptive-speculative, prefill/decode-disaggregated deployments.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)


@app.callback()
def _root() -> None:
    """specctl: preflight, launcher and benchmark for speculative + disaggregated LLM serving."""


COMMAND_MODULES = (
    "validate",  # validate, schema, presets, explain
    "adaptive",  # adaptive simulate
    "generate",  # generate (offline engine)
    "serve",  # serve, up
    "bench",  # bench, bench compare
)

for _name in COMMAND_MODULES:
    importlib.import_module(f"specctl.cli.{_name}")


@app.command()
def version() -> None:
    """Print specctl's version."""
    from specctl import __version__

    typer.echo(__version__)
