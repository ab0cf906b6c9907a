"""`python -m specctl.cli` runs the CLI (used by tests and by process launchers)."""

from __future__ import annotations

from specctl.cli.main import app

app(prog_name="specctl")  # help, errors and shell completion (_SPECCTL_COMPLETE) as the installed script
