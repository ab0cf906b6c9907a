"""specctl bench command(s)."""

from __future__ import annotations
