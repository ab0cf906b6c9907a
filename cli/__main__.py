"""`python -m specctl.cli` runs the CLI (used by tests and by process launchers)."""

from __future__ import annotations

from specctl.cli.main import app

app()
