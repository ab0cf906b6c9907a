"""specctl adaptive command(s)."""

from __future__ import annotations
