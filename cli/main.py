"""The `specctl` Typer application. Each command lives in its own module under `specctl.cli` and
registers itself on `app` when imported; the list below is the whole command surface."""

from __future__ import annotations

import importlib
import os

import typer

# Before any command loads torch's OpenMP runtime: idle intra-op threads sleep instead of spinning.
# On a shared CPU, spinning threads fight other processes (engine roles, the bench client) and a
# small model decodes ~30x slower (measured: 5 vs 166 tok/s for the tiny preset next to one busy
# process on 2 cores). Child processes (serve roles started by `up`) inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
    "preflight",  # preflight (live prefill/decode comparison)
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
