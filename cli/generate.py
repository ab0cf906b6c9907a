"""specctl generate command(s)."""

from __future__ import annotations
