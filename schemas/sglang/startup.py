"""What SGLang decides at start-up from flags, environment and config.json alone, predicted without SGLang.

Contract: `predict_startup(cmd, model, gpu=...)` never raises and returns a `Startup`:
- `errors`: one finding (severity error) per check SGLang's start-up would raise for this command
  (`ServerArgs` post-init, `resolve_once()` and its hooks); SGLang stops at the first, specctl lists all;
- `warnings`: silent downgrades and overrides (adaptive turned off, values replaced), as findings;
- `resolved`: the values SGLang resolves silently, by `ServerArgs` field name (`speculative_algorithm`
  after NEXTN -> EAGLE, `speculative_num_draft_tokens`, `page_size` ...), only for the fields predicted.

The differential test (`tests/test_sglang_differential.py`) runs SGLang's own resolution over the same
commands and requires the same verdict (error / no error) and the same values for every key in `resolved`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specctl.schemas.findings import Finding
from specctl.schemas.sglang.command import SGLangCommand
from specctl.schemas.sglang.families import SGLangModel

GPUS = ("H100", "H200", "B200")


@dataclass(frozen=True)
class Startup:
    errors: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()
    resolved: Mapping[str, Any] = field(default_factory=dict)


def predict_startup(cmd: SGLangCommand, model: SGLangModel | None, *, gpu: str = "H100") -> Startup:
    """SGLang's start-up verdict for `cmd` on a declared `gpu` (one of GPUS)."""
    return Startup()
