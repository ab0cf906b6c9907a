"""The library's module import graph points one way: no module cycle, no import from a lower package rank
into a higher one.

The graph is built from the source with `ast`: every `import` and `from ... import` of every library module,
at any depth (function bodies and `if TYPE_CHECKING:` blocks included), resolved to the library module it
names (`from specctl.x import y` is an edge to `specctl.x.y` when that is a module, else to `specctl.x`).
Relative imports are resolved against the importing module's package. An import of a package's own
`__init__` from inside that package is not an edge (it is where the package starts).

`RANKS` is the layering, lowest first; a module may import its own rank or a lower one. The longest prefix
of a module's name in `RANKS` gives its rank.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "specctl"
SKIP = {"tests", "benchmarks", "scripts", "docs", "build", "dist", "shared", "node_modules"}

# The layering of the library, lowest first. Within `engine`, the serving layer sits above the PD plane,
# the speculative runtime and the engine core.
RANKS: dict[str, int] = {
    "specctl": 0,  # the package root: its version
    "specctl.errors": 0,
    "specctl.schemas": 1,
    "specctl.presets": 1,
    "specctl.adaptive": 2,
    "specctl.engine": 3,
    "specctl.engine.speculative": 3,
    "specctl.engine.pd": 3,
    "specctl.engine.serve": 4,
    "specctl.preflight": 5,
    "specctl.orchestrate": 6,
    "specctl.bench": 7,
    "specctl.cli": 8,
}


def library_modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file of every library module under `root` (the repository root is the package)."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in SKIP or any(p.startswith(".") for p in rel.parts):
            continue
        parts = [PACKAGE, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The library modules `module` (source at `path`) imports, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _package_of(module, path)
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if not name or name == module:
                continue
            if module.startswith(name + ".") and modules[name].name == "__init__.py":
                continue  # the package's own __init__
            out.add(name)
    return out


def build_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = library_modules(root)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, todo = work[-1]
            if todo:
                w = todo.pop()
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, sorted(graph.get(w, ()))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def rank(module: str, ranks: Mapping[str, int] = RANKS) -> int:
    name = module
    while name not in ranks:
        if "." not in name:
            raise KeyError(f"{module}: no package rank (add its package to RANKS)")
        name = name.rpartition(".")[0]
    return ranks[name]


def upward(graph: Mapping[str, Iterable[str]], ranks: Mapping[str, int] = RANKS) -> list[str]:
    """Every edge from a module to one of a higher rank, as `a -> b (rank i -> j)`."""
    return sorted(f"{a} -> {b} (rank {rank(a, ranks)} -> {rank(b, ranks)})"
                  for a, targets in graph.items() for b in targets if rank(b, ranks) > rank(a, ranks))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return build_graph()


def test_the_library_has_no_module_cycle(graph: dict[str, set[str]]) -> None:
    found = cycles(graph)
    assert not found, "module cycles (cut each at the edge, moving the shared definition to the lower module):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_no_module_imports_a_higher_rank(graph: dict[str, set[str]]) -> None:
    found = upward(graph)
    assert not found, "upward imports (see RANKS):\n" + "\n".join(found)


def test_every_library_module_has_a_rank(graph: dict[str, set[str]]) -> None:
    for module in graph:
        rank(module)


def test_the_graph_sees_imports_at_every_depth(graph: dict[str, set[str]]) -> None:
    """Function-level imports are edges too: the CLI imports each command's implementation when it runs."""
    assert "specctl.adaptive.search" in graph["specctl.cli.adaptive"]
    assert "specctl.schemas.loader" in graph["specctl.schemas.deployment"]


def test_the_checks_fail_on_a_cycle_and_an_upward_edge(tmp_path: Path) -> None:
    """A synthetic package: a <-> b through a function-level import and a TYPE_CHECKING one, and a low
    module importing a high one relatively."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "low").mkdir()
    (tmp_path / "low" / "__init__.py").write_text("")
    (tmp_path / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specctl.low.b import B\n")
    (tmp_path / "low" / "b.py").write_text("def f():\n    from . import a\n")
    (tmp_path / "high").mkdir()
    (tmp_path / "high" / "__init__.py").write_text("")
    (tmp_path / "high" / "c.py").write_text("import specctl.low.a\n")
    (tmp_path / "low" / "d.py").write_text("from ..high import c\n")
    g = build_graph(tmp_path)
    assert g["specctl.low.a"] == {"specctl.low.b"} and g["specctl.low.b"] == {"specctl.low.a"}
    assert cycles(g) == [["specctl.low.a", "specctl.low.b"]]
    ranks = {"specctl": 0, "specctl.low": 1, "specctl.high": 2}
    assert upward(g, ranks) == ["specctl.low.d -> specctl.high.c (rank 1 -> 2)"]
    with pytest.raises(KeyError, match="no package rank"):
        rank("other.x", ranks)
