"""Lint and types are part of the test command: `ruff check` over the tree, and mypy --strict over every
library module (found in the tree, so a new module is strict from its first commit).

mypy resolves `specctl.*` by module name, but the repository root *is* the package (pyproject's
package-dir), so the check runs from a temporary folder holding a `specctl` link to the root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Folders of the repository that are not library code (the tests, benchmarks and scripts that use it).
NOT_LIBRARY = ("tests", "benchmarks", "scripts", "docs", "build", "dist")


def library_modules() -> tuple[str, ...]:
    """Every library module (relative to the root), found in the tree: a new module is checked from its
    first commit, and none can be left out by forgetting a list."""
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in NOT_LIBRARY or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        found.append(rel.as_posix())
    return tuple(sorted(found))


# Files (relative to the root) checked with `mypy --strict`: every library module.
STRICT = library_modules()


def _module(path: str) -> str:
    name = "specctl." + path.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def test_ruff_check_is_clean() -> None:
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow
def test_strict_modules_type_check(tmp_path: Path) -> None:
    assert "__init__.py" in STRICT and "engine/engine.py" in STRICT and not any(p.startswith("tests/") for p in STRICT)
    (tmp_path / "specctl").symlink_to(ROOT, target_is_directory=True)
    args = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
            "--cache-dir", str(tmp_path / ".mypy_cache"), "--no-error-summary"]
    for path in STRICT:
        args += ["-m", _module(path)]
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    res = subprocess.run(args, capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
