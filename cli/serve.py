"""specctl serve command(s)."""

from __future__ import annotations
