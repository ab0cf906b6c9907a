"""The package installs as one import package with the console script."""

from __future__ import annotations

import subprocess
import sys


def test_console_script_reports_version() -> None:
    import specctl

    out = subprocess.run([sys.executable, "-m", "specctl.cli", "version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == specctl.__version__
