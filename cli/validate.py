"""`specctl validate`, `specctl schema`, `specctl presets list|show`, `specctl explain`.

Thin Typer wrappers: each parses options, calls one library function (`specctl.schemas.*`), renders,
and exits 0 (ok), 1 (error findings; warnings too with --strict) or 2 (usage error or unreadable
input). Start-up matters (`validate` runs in editors and CI loops): everything beyond Typer is
imported inside the command, and nothing here may import torch.
"""

from __future__ import annotations

import contextlib
import enum
import sys
from collections.abc import Iterator
from typing import Annotated, Optional

import typer

from specctl.cli.common import OutputFormat, handle_errors
from specctl.cli.main import app
from specctl.cli.options import SetOption
from specctl.errors import SpecctlError, UsageError

presets_app = typer.Typer(help="List and show the shipped preset deployments.", no_args_is_help=True)
app.add_typer(presets_app, name="presets")

_TABLES_AUTO_MAX_FILES = 10


class InputKind(str, enum.Enum):
    auto = "auto"
    deployment = "deployment"
    sglang = "sglang"
    sglang_command = "sglang-command"


def _is_terminal() -> bool:
    # Rich's own detection honours NO_COLOR / TERM=dumb / FORCE_COLOR; import Rich only when it can matter.
    if not sys.stdout.isatty():
        return False
    from rich.console import Console

    return Console(file=sys.stdout).is_terminal


@contextlib.contextmanager
def _internal_errors() -> Iterator[None]:
    """A bug is exit 3 with a one-line message, never a traceback nor exit 1 ("your input is invalid")."""
    try:
        yield
    except (typer.Exit, SpecctlError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"error: internal error in specctl validate: {type(exc).__name__}: {exc}\n"
                         "hint: this is a bug; please report it with the input files\n")
        raise typer.Exit(3) from None


def parse_int_list(text: str, *, option: str) -> list[int]:
    """`"1,2,4,8"` -> [1, 2, 4, 8]; UsageError naming the option otherwise."""
    items = [t.strip() for t in text.replace(" ", ",").split(",") if t.strip()]
    try:
        values = [int(t) for t in items]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected comma-separated positive integers, e.g. 1,2,4,8") from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{option} {text!r}: expected comma-separated positive integers, e.g. 1,2,4,8")
    return values


@app.command()
def validate(
    paths: Annotated[Optional[list[str]], typer.Argument(  # noqa: UP045 - Typer reads annotations at runtime
        help="Deployment files (YAML/JSON), SGLang launch commands (a file "
                                                     "holding `python -m sglang.launch_server ...` or `sglang serve "
                                                     "...`, any extension) or SGLang adaptive-config JSON files, "
                                                     "recognised by content. A prefill-only file and a decode-only "
                                                     "file are cross-checked as a pair: specctl validate prefill.sh "
                                                     "decode.sh.", show_default=False, metavar="PATH...")
                     ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")] = False,
    output: Annotated[OutputFormat, typer.Option("--format", help="Report format.")] = OutputFormat.text,
    set_values: SetOption = None,
    initial_steps: Annotated[Optional[int], typer.Option(  # noqa: UP045 - Typer reads annotations at runtime
        "--initial-steps", min=0, help="SGLang adaptive JSON: the --speculative-num-steps to check "
        "(default: SGLang's, the middle of the candidates' union).", show_default=False)] = None,
    graph_batch_sizes: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--graph-batch-sizes", metavar="1,2,4,8", help="SGLang adaptive JSON: batch sizes a batch is padded up "
        "to (cuda-graph sizes) before bucket routing.", show_default=False)] = None,
    kind: Annotated[InputKind, typer.Option("--kind", help="Input kind: auto (by content), deployment, sglang "
                                                            "(an SGLang --speculative-adaptive-config JSON) or "
                                                            "sglang-command (an SGLang launch command file).")
                    ] = InputKind.auto,
    tables: Annotated[Optional[bool], typer.Option(  # noqa: UP045
        "--table/--no-table", help="Print the reachable (batch size -> steps) table per file "
        f"(default: when at most {_TABLES_AUTO_MAX_FILES} files).", show_default=False)] = None,
    resolve: Annotated[bool, typer.Option(
        "--resolve", help="Also run SGLang's own start-up resolution (prepare_server_args + "
        "ServerArgs.resolve_once) on every SGLang command and each role of an engine: sglang deployment, in a "
        "child process with the GPU of --gpu declared (no GPU needed), and report its verdicts as SGL9xx "
        "findings (SGLang's own words) and prefill/decode differences in what it resolved.")] = False,
    gpu: Annotated[str, typer.Option(
        "--gpu", help="The GPU SGLang's start-up choices are predicted (and, with --resolve, resolved) for: H100, "
        "H200 or B200.")] = "H100",
    sglang_python: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--sglang-python", metavar="PATH", help="With --resolve: the Python that has SGLang installed (default: "
        "the deployment's sglang.python, else this interpreter when it has SGLang).", show_default=False)] = None,
    sglang_version: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--sglang-version", metavar="X.Y.Z", help="SGLang launch commands: check the flags of this SGLang release "
        "(flags of other releases are then errors). Default: the SGLang of --set sglang.python=..., else the "
        "installed SGLang, else the newest release (other releases' flags are then warnings).",
        show_default=False)] = None,
    list_versions: Annotated[bool, typer.Option(
        "--list-sglang-versions", help="List the SGLang releases whose flags specctl knows (and which one "
        "validate would use), then exit.")] = False,
) -> None:
    """Check deployment files, SGLang launch commands and SGLang adaptive configs; report every finding.

    Exit 0 ok, 1 findings (errors; warnings too with --strict), 2 unreadable input, 3 an internal error."""
    with handle_errors(), _internal_errors():
        if list_versions:
            _list_sglang_versions(output, sglang_version, set_values or ())
            return
        if not paths:
            raise UsageError("give the files to validate", hint="specctl validate prefill.sh decode.sh; "
                             "specctl validate --list-sglang-versions lists the SGLang releases")
        from specctl.schemas.report import render_json, write_text
        from specctl.schemas.validator import Validator

        graphs = parse_int_list(graph_batch_sizes, option="--graph-batch-sizes") if graph_batch_sizes else None
        request = None
        from specctl.schemas.sglang.startup import GPUS

        if gpu.upper() not in GPUS:
            raise UsageError(f"--gpu {gpu!r}: SGLang's start-up choices are known for {', '.join(GPUS)}",
                             hint="specctl validate --gpu H100 prefill.sh decode.sh")
        if resolve:
            from specctl.schemas.sglang.verdicts import ResolveRequest

            request = ResolveRequest(gpu=gpu.upper(), python=sglang_python)
        elif sglang_python is not None:
            raise UsageError("--sglang-python applies to SGLang's own resolution",
                             hint="add --resolve: specctl validate --resolve --sglang-python PY prefill.sh decode.sh")
        validator = Validator(
            overrides=set_values or (), initial_steps=initial_steps, graph_batch_sizes=graphs, kind=kind.value,
            strict=strict, resolve=request, sglang_gpu=gpu.upper(), sglang_version=sglang_version,
        )
        report = validator.validate_paths(paths)
        if output is OutputFormat.json:
            sys.stdout.write(render_json(report))
        else:
            show = tables if tables is not None else len(paths) <= _TABLES_AUTO_MAX_FILES
            write_text(report, sys.stdout, rich=_is_terminal(), tables=show)
    raise typer.Exit(report.exit_code)


def _list_sglang_versions(output: OutputFormat, requested: str | None, sets: list[str] | tuple[str, ...]) -> None:
    """The releases of the flag history, oldest first, with flags added/removed against the one before."""
    import json

    from specctl.schemas.sglang import flags
    from specctl.schemas.validator import Validator

    chosen = Validator(overrides=sets, sglang_version=requested).sglang_release()
    rows = []
    prev: set[str] = set()
    for v in flags.releases():
        options = set(flags.table(v).by_option)
        rows.append({"version": v, "flags": len(flags.table(v).flags), "added": len(options - prev) if prev else None,
                     "removed": len(prev - options) if prev else None})
        prev = options
    not_loaded = flags.history().get("not_loaded") or {}
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps({"releases": rows, "newest": flags.newest(), "not_loaded": not_loaded,
                                     "checked": {"release": chosen.release, "named": chosen.named,
                                                 "source": chosen.source, "note": chosen.note or None}},
                                    indent=2) + "\n")
        return
    sys.stdout.write("SGLang releases whose server flags specctl knows (from each release's own parser):\n")
    for r in rows:
        delta = f"  +{r['added']} -{r['removed']} options" if r["added"] is not None else ""
        mark = "  <- checked" if r["version"] == chosen.release else ""
        sys.stdout.write(f"  {r['version']:<14}{r['flags']:>4} flags{delta}{mark}\n")
    if not_loaded:
        sys.stdout.write(f"not loaded (their parsers do not import here): {', '.join(not_loaded)}\n")
    sys.stdout.write(f"validate checks SGLang {chosen.release}: {chosen.source}"
                     + (f" ({chosen.note})" if chosen.note else "") + "\n")


@app.command()
def schema() -> None:
    """Print the deployment JSON Schema (draft 2020-12), e.g. for editor completion."""
    with handle_errors():
        from importlib import resources

        sys.stdout.write((resources.files("specctl.schemas") / "deployment.schema.json").read_text(encoding="utf-8"))


@presets_app.command("list")
def presets_list(
    output: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = OutputFormat.text,
) -> None:
    """List the shipped preset deployments."""
    with handle_errors():
        import json

        from specctl import presets

        rows = [(name, _preset_summary(presets.read_text(name))) for name in presets.names()]
        if output is OutputFormat.json:
            sys.stdout.write(json.dumps([{"name": n, "description": d} for n, d in rows], indent=2) + "\n")
            return
        width = max(len(n) for n, _ in rows)
        for name, desc in rows:
            sys.stdout.write(f"{name.ljust(width)}  {desc}\n")


def _preset_summary(text: str) -> str:
    """The preset's leading comment, joined into one line."""
    out = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        out.append(line.lstrip("# ").strip())
    return " ".join(out)


@presets_app.command("show")
def presets_show(
    name: Annotated[str, typer.Argument(help="Preset name (specctl presets list).")],
    output: Annotated[OutputFormat, typer.Option("--format", help="text: the YAML; json: {name, description, "
                                                 "deployment, yaml}.")] = OutputFormat.text,
) -> None:
    """Print a preset's YAML (a starting point: specctl presets show tiny-pd > deploy.yaml)."""
    with handle_errors():
        from specctl import presets

        text = presets.read_text(name)
        if output is OutputFormat.json:
            import json

            from specctl.schemas.loader import parse_document

            doc = {"name": name, "description": _preset_summary(text),
                   "deployment": parse_document(text, name=name).data, "yaml": text}
            sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
            return
        sys.stdout.write(text)


@app.command()
def explain(
    code: Annotated[Optional[str], typer.Argument(help="A finding code, e.g. ADP101.", show_default=False)] = None,  # noqa: UP045
    list_: Annotated[bool, typer.Option("--list", help="List every code with its severity and title.")] = False,
    output: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = OutputFormat.text,
) -> None:
    """Explain a validation rule: what it means, the runtime error it prevents, how to fix it."""
    with handle_errors():
        import dataclasses
        import difflib
        import json

        from specctl.schemas.catalog import all_rules

        rules = all_rules()
        if list_ or code is None:
            if code is None and not list_:
                raise UsageError("give a code to explain, or --list", hint="specctl explain --list")
            if output is OutputFormat.json:
                sys.stdout.write(json.dumps([dataclasses.asdict(r) for r in rules.values()], indent=2) + "\n")
                return
            for r in rules.values():
                sys.stdout.write(f"{r.code}  {r.severity:<7}  {r.title}\n")
            return
        doc = rules.get(code.strip().upper())
        if doc is None:
            close = difflib.get_close_matches(code.upper(), list(rules), n=3, cutoff=0.5)
            raise UsageError(
                f"unknown code {code!r}",
                hint=(f"did you mean {', '.join(close)}? " if close else "") + "specctl explain --list shows all codes",
            )
        from specctl.schemas.sglang.mapping import other_spelling

        other = other_spelling(doc.code, doc.summary, doc.fix)
        if output is OutputFormat.json:
            body = dataclasses.asdict(doc)
            if other is not None:
                body["other_input"] = {"input": other[0], "text": other[1]}
            sys.stdout.write(json.dumps(body, indent=2) + "\n")
            return
        parts = [
            f"{doc.code} ({doc.severity}): {doc.title}",
            "",
            doc.summary,
            "",
            "Prevents at runtime:",
            f"    {doc.runtime_error}",
            "",
            "Fix:",
            f"    {doc.fix}",
        ]
        if doc.before:
            parts += ["", "Before:", *("    " + ln for ln in doc.before.splitlines())]
        if doc.after:
            parts += ["", "After:", *("    " + ln for ln in doc.after.splitlines())]
        if other is not None:
            parts += ["", f"{other[0]}:", f"    {other[1]}"]
        sys.stdout.write("\n".join(parts) + "\n")
