"""The census of SGLang's start-up raise sites: every `raise` / `assert` in the files whose checks run when
`ServerArgs.resolve_once()` resolves flags, environment and config.json.

A site's id is stable across line moves: `FILE::FUNCTION::MESSAGE`, with FILE relative to the package's
parent (`sglang/srt/...`), FUNCTION the enclosing def (dotted through classes and nested defs) and
MESSAGE the source text of the exception (or of the assert's test and message), whitespace collapsed.
Two sites with the same id in one function get `#2`, `#3` suffixes in source order.

Reads source only (never imports sglang). `python scripts/sglang_raise_sites.py [SGLANG_PACKAGE_DIR]`
prints the census as JSON lines.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

# The files whose raise sites the start-up census covers (relative to the sglang package directory).
CENSUS_FILES = ("srt/arg_groups/speculative_hook.py", "srt/arg_groups/pd_disaggregation_hook.py")
CENSUS_DIRS = ("srt/arg_groups/model_overrides",)
CENSUS_EXTRA = ("srt/server_args.py", "srt/arg_groups/model_override_base.py")


@dataclass(frozen=True)
class Site:
    id: str
    file: str
    function: str
    kind: str  # "raise" or "assert"
    line: int
    end_line: int
    message: str


def sglang_dir() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed for this interpreter")
    return Path(list(spec.submodule_search_locations)[0])


def census_paths(root: Path) -> list[Path]:
    paths = [root / f for f in CENSUS_FILES + CENSUS_EXTRA if (root / f).is_file()]
    for d in CENSUS_DIRS:
        paths += sorted(p for p in (root / d).glob("*.py") if p.name != "__init__.py")
    return paths


def _text(node: ast.AST | None) -> str:
    return " ".join(ast.unparse(node).split()) if node is not None else ""


class _Visitor(ast.NodeVisitor):
    def __init__(self, rel: str) -> None:
        self.rel = rel
        self.scope: list[str] = []
        self.sites: list[tuple[str, str, int, int, str]] = []

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = _scoped
    visit_AsyncFunctionDef = _scoped
    visit_ClassDef = _scoped

    def visit_Raise(self, node: ast.Raise) -> None:
        if node.exc is not None:  # a bare `raise` re-raises a site counted where it began
            self.sites.append(("raise", ".".join(self.scope) or "<module>", node.lineno,
                               node.end_lineno or node.lineno, _text(node.exc)))
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        msg = _text(node.test) + (" :: " + _text(node.msg) if node.msg is not None else "")
        scope = ".".join(self.scope) or "<module>"
        self.sites.append(("assert", scope, node.lineno, node.end_lineno or node.lineno, msg))
        self.generic_visit(node)


def census(root: Path | None = None) -> list[Site]:
    """Every raise/assert site of the census files of the SGLang at `root` (default: the installed one)."""
    root = root or sglang_dir()
    out: list[Site] = []
    for path in census_paths(root):
        rel = path.relative_to(root.parent).as_posix()
        v = _Visitor(rel)
        v.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        seen: dict[str, int] = {}
        for kind, func, line, end, msg in v.sites:
            base = f"{rel}::{func}::{msg}"
            seen[base] = seen.get(base, 0) + 1
            sid = base if seen[base] == 1 else f"{base}#{seen[base]}"
            out.append(Site(sid, rel, func, kind, line, end, msg))
    return out


def site_at(sites: list[Site], where: str) -> Site | None:
    """The census site whose statement spans `where` ("sglang/...py:LINE"), if any."""
    file, _, line = where.rpartition(":")
    if not line.isdigit():
        return None
    n = int(line)
    for s in sites:
        if s.file == file and s.line <= n <= s.end_line:
            return s
    return None


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else None
    for s in census(root):
        print(json.dumps(s.__dict__))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
