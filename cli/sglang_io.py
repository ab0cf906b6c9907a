"""`specctl import sglang P [D] [-o FILE]` and `specctl export sglang -c DEPLOY [--out DIR]`.

Thin wrappers over `specctl.schemas.sglang.importer.import_commands` and
`specctl.schemas.sglang.export.export_commands`. Exit 0 ok; 1 a command file has reading errors
(its findings are printed); 2 usage errors or unreadable files.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from specctl.cli.common import OutputFormat, handle_errors
from specctl.cli.main import app
from specctl.cli.options import ConfigOption, SetOption

import_app = typer.Typer(help="Read other tools' deployments into a specctl deployment file.", no_args_is_help=True)
export_app = typer.Typer(help="Write a specctl deployment in other tools' dialects.", no_args_is_help=True)
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")


@import_app.command("sglang")
def import_sglang(
    paths: Annotated[list[str], typer.Argument(help="The prefill and decode command files (or one server's).",
                                               metavar="PREFILL.sh [DECODE.sh]", show_default=False)],
    out: Annotated[Optional[str], typer.Option(  # noqa: UP045 - Typer reads annotations at runtime
        "-o", "--output", metavar="DEPLOY.yaml", help="Write the deployment here (default: stdout).",
        show_default=False)] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="The deployment's name.",  # noqa: UP045
                                                show_default=False)] = None,
) -> None:
    """Turn SGLang launch commands into a deployment file (adaptive config inlined)."""
    with handle_errors():
        from pathlib import Path

        from specctl.schemas.sglang.importer import import_commands, to_yaml

        imported = import_commands(paths, name=name)
        for file, f in imported.findings:
            where = f"{file}:{f.line}" if f.line else file
            sys.stderr.write(f"{where}: {f.code} {f.path}: {f.severity}: {f.message}\n    fix: {f.fix}\n")
        if not imported.ok or not imported.data:
            raise typer.Exit(1)
        for role, flags in imported.unmapped.items():
            sys.stderr.write(f"note: {role}: not represented in the deployment (kept as a comment): "
                             f"{' '.join(flags)}\n")
        text = to_yaml(imported.data, imported.unmapped)
        if out:
            Path(out).write_text(text, encoding="utf-8")
            sys.stderr.write(f"wrote {out}; check it with: specctl validate {out}\n")
        else:
            sys.stdout.write(text)


@export_app.command("sglang")
def export_sglang(
    config: ConfigOption,
    set_values: SetOption = None,
    out: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--out", metavar="DIR", help="Write prefill.sh, decode.sh, router.sh (or server.sh) and adaptive.json here.",
        show_default=False)] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="Output format: text (shell) or json "
                                                 '({"prefill": [...], "decode": [...], "router": [...], '
                                                 '"files": {...}}).')] = OutputFormat.text,
) -> None:
    """Print the SGLang server and sglang-router commands of a deployment (full flag names only)."""
    with handle_errors():
        import json
        from pathlib import Path

        from specctl.schemas.deployment import load_deployment
        from specctl.schemas.sglang.export import export_commands, shell_script

        cmds = export_commands(load_deployment(config, overrides=set_values or ()))
        scripts = {name: argv for name, argv in (("prefill.sh", cmds.prefill), ("decode.sh", cmds.decode),
                                                 ("server.sh", cmds.colocated), ("router.sh", cmds.router))
                   if argv}
        if out:
            d = Path(out)
            d.mkdir(parents=True, exist_ok=True)
            for name, argv in scripts.items():
                (d / name).write_text("#!/bin/sh\nexport HF_HUB_OFFLINE=1\n" + shell_script(argv), encoding="utf-8")
            for name, text in cmds.files.items():
                (d / name).write_text(text, encoding="utf-8")
            sys.stderr.write(f"wrote {', '.join([*scripts, *cmds.files])} to {d}/ (run them from there)\n")
        if output is OutputFormat.json:
            sys.stdout.write(json.dumps(cmds.to_json(), indent=2) + "\n")
        elif not out:
            for name, argv in scripts.items():
                sys.stdout.write(f"# {name}\n{shell_script(argv)}\n")
            for name, text in cmds.files.items():
                sys.stdout.write(f"# {name} (referenced by --speculative-adaptive-config)\n{text}\n")
