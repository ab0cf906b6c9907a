"""Named deployments shipped as YAML package data; look one up by name.

`names()` lists them, `path(name)` is the file (UsageError listing the known names for an unknown
one), `read_text(name)` its text. Every preset validates clean (a test checks).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from specctl.errors import UsageError


def _root() -> Path:
    return Path(str(resources.files("specctl.presets")))


def names() -> list[str]:
    return sorted(p.stem for p in _root().glob("*.yaml"))


def path(name: str) -> Path:
    p = _root() / f"{name}.yaml"
    if not p.is_file():
        raise UsageError(f"unknown preset {name!r}", hint=f"presets: {', '.join(names())}")
    return p


def read_text(name: str) -> str:
    return path(name).read_text(encoding="utf-8")
