"""specctl validate command(s)."""

from __future__ import annotations
