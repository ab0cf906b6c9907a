"""Helpers shared by the test_validate_* files: run the CLI in-process with a fixed width."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

DATA = Path(__file__).parent / "data"
WIDTH = 100


def run_cli(*args: str) -> Any:
    from specctl.cli.main import app

    runner = CliRunner()
    return runner.invoke(app, list(args), env={"COLUMNS": str(WIDTH), "NO_COLOR": "1"}, catch_exceptions=False)


def run_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("validate", "--format", "json", *args)
    return result.exit_code, json.loads(result.stdout)


def expectations(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(extra CLI args, expected (code, path) pairs) from `# expect:` / `# args:` header lines or a sidecar."""
    sidecar = path.with_name(path.name + ".expect")
    lines = sidecar.read_text().splitlines() if sidecar.exists() else path.read_text().splitlines()
    args: list[str] = []
    expect: list[tuple[str, str]] = []
    for line in lines:
        line = line.lstrip("# ").strip()
        if line.startswith("args:"):
            args = line[len("args:"):].split()
        elif line.startswith("expect:"):
            for item in line[len("expect:"):].split(";"):
                code, jpath = item.split()
                expect.append((code, jpath))
    return args, expect


def make_models(root: Path) -> None:
    """Model directories the example files name (`models/...`, relative to the data folder), derived
    from the current builtin configs so the examples differ from the builtins in exactly one fact."""
    from specctl.schemas.model_facts import builtin_dir

    hybrid = json.loads((builtin_dir("tiny-hybrid") / "config.json").read_text())
    draft = json.loads((builtin_dir("tiny-draft") / "config.json").read_text())
    kinds = hybrid["layer_types"]
    variants = {
        "hybrid-copy": hybrid,  # same facts, another identity (path)
        "hybrid-6layer": {**hybrid, "num_hidden_layers": len(kinds) + 2, "layer_types": [*kinds, "full", "full"]},
        "hybrid-window128": {**hybrid, "sliding_window": 2 * int(hybrid.get("sliding_window") or 64)},
        "draft-vocab300": {**draft, "vocab_size": hybrid["vocab_size"] + 40},
        "draft-vocab260": draft,
    }
    for name, cfg in variants.items():
        (root / "models" / name).mkdir(parents=True, exist_ok=True)
        (root / "models" / name / "config.json").write_text(json.dumps(cfg))


def data_copy(tmp: Path) -> Path:
    """A writable copy of tests/data with the derived model directories."""
    root = tmp / "data"
    shutil.copytree(DATA, root)
    make_models(root)
    return root
