"""Reporters for a validation `Report`: text (plain, or Rich-styled on a terminal) and JSON.

Plain text, one finding per line, then its fix indented (grep- and editor-friendly):

    deploy.yaml:9: ADP101 $.speculative.num_steps: error: --speculative-num-steps=2 is not in ...
        fix: set the initial steps to one of [0, 1, 3, 5, 7] ...

then, per file, the reachable (batch size -> steps) table when asked for, and a summary line.
JSON has exactly this shape, `{"ok": .., "files": [{"path", "ok", "findings": [...], "reachable"}]}`,
where `reachable` is the decoding role's `StepCoverage.to_json()` (or null); an SGLang launch command's
file also has `"sglang": {"release", "gpu", "resolved": {ServerArgs field: value}}`, what SGLang resolves
silently for that release and GPU, as predicted.
"""

from __future__ import annotations

import json
from typing import TextIO

from specctl.schemas.findings import Finding
from specctl.schemas.validator import FileResult, Report

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def finding_line(path: str, f: Finding) -> str:
    where = f"{path}:{f.line}" if f.line is not None else path
    return f"{where}: {f.code} {f.path}: {f.severity}: {f.message}"


def summary(report: Report) -> str:
    counts = {"error": 0, "warning": 0, "info": 0}
    for fr in report.files:
        for f in fr.findings:
            counts[f.severity] += 1
    n = len(report.files)
    bad = sum(not fr.ok(report.strict) for fr in report.files)
    status = "ok" if report.ok else f"{bad} of {n} failed"
    def count(k: int, word: str) -> str:
        return f"{k} {word}" + ("s" if k != 1 and word != "info" else "")

    return (
        f"{count(n, 'file')} checked: {status} ({count(counts['error'], 'error')}, "
        f"{count(counts['warning'], 'warning')}, {count(counts['info'], 'info')})"
        f"{' [strict]' if report.strict else ''}"
    )


def render_plain(report: Report, *, tables: bool = True) -> str:
    """The whole text report as plain text."""
    lines: list[str] = []
    for fr in report.files:
        for f in fr.findings:
            lines.append(finding_line(fr.path, f))
            if f.fix:
                lines.append(f"    fix: {f.fix}")
        if tables and fr.reachable_text:
            lines.append(f"{fr.path}: reachable steps{_role_note(fr)}:")
            lines.extend("    " + t for t in fr.reachable_text.splitlines())
    lines.append(summary(report))
    return "\n".join(lines) + "\n"


def _role_note(fr: FileResult) -> str:
    for role in ("decode", "colocated", "prefill"):
        if role in fr.roles:
            return f" ({role})"
    return ""


def write_text(report: Report, out: TextIO, *, rich: bool, tables: bool = True, width: int | None = None) -> None:
    """Write the text report; Rich styling only when `rich` (a terminal)."""
    if not rich:
        out.write(render_plain(report, tables=tables))
        return
    from rich.console import Console  # noqa: PLC0415 - rich: only when a report is rendered as a table (`specctl validate` start-up)
    from rich.markup import escape  # noqa: PLC0415 - rich: only when a report is rendered as a table (`specctl validate` start-up)

    console = Console(file=out, width=width, soft_wrap=True, highlight=False)
    for fr in report.files:
        for f in fr.findings:
            where = f"{fr.path}:{f.line}" if f.line is not None else fr.path
            style = _STYLE[f.severity]
            console.print(
                f"[bold]{escape(where)}[/]: [{style}]{f.code}[/] [dim]{escape(f.path)}[/]: "
                f"[{style}]{f.severity}[/]: {escape(f.message)}"
            )
            if f.fix:
                console.print(f"    [green]fix:[/] {escape(f.fix)}")
        if tables and fr.reachable_text:
            console.print(f"[bold]{escape(fr.path)}[/]: reachable steps{_role_note(fr)}:")
            for t in fr.reachable_text.splitlines():
                console.print("    " + escape(t))
    style = "bold green" if report.ok else "bold red"
    console.print(f"[{style}]{escape(summary(report))}[/]")


def render_json(report: Report) -> str:
    return json.dumps(report.to_json(), indent=2) + "\n"
