"""The one result type of validation: a `Finding` (schema errors and semantic rules alike)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """`(code, severity, path, message, fix)` plus line/column where the loader knows them.

    `path` is a JSON path into the document, e.g. `$.speculative.adaptive.buckets.8.candidate_steps`.
    """

    code: str
    severity: Severity
    path: str
    message: str
    fix: str = ""
    line: int | None = None
    column: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "code": self.code,
            "severity": self.severity,
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "message": self.message,
            "fix": self.fix,
        }
        return out


def json_path(*parts: str | int) -> str:
    """`json_path("speculative", "adaptive", "buckets", 8)` -> `$.speculative.adaptive.buckets.8`."""
    return "$" + "".join(f".{p}" for p in parts)
