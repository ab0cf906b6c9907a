"""Test-only fault injection for the serving processes: a `FaultPlan` the test hands over explicitly.

How a test asks for faults: it writes a JSON file, e.g. `{"prefill_hold_s": 1.5, "prefill_corrupt_marker":
"XYZ"}`, and starts the process with `specctl serve --role prefill ... --fault-plan FILE` (an option hidden
from --help: no deployment, no environment variable and no request can turn a fault on). The file is read
once, at start-up, into a frozen `FaultPlan` carried by the role's context (`RoleContext.faults`); nothing
is read per request. A production process never gets one and runs with `FaultPlan()` (no faults).

Faults (prefill, engine/serve/prefill.py):
- `prefill_hold_s`: hold each payload this long before sending it (so a test can kill decode "mid-transfer").
- `prefill_corrupt_marker`: a prompt containing this text has its state components sent in reverse order
  (decode's verification against the registration must fail that request alone).

Faults (decode, engine/serve/decode.py):
- `decode_link_error`: each link to a prefill raises RuntimeError(this text) as it starts, standing for a bug
  in a background task (the role must exit 3 naming it, not wait in "pairing" forever).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from specctl.errors import UsageError


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """Faults a test asks for when it starts a process (never set in production)."""

    prefill_hold_s: float = 0.0
    prefill_corrupt_marker: str = ""
    decode_link_error: str = ""

    @classmethod
    def from_file(cls, path: str | Path) -> FaultPlan:
        """The plan in a JSON file; `UsageError` (exit 2) naming the key for anything else."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--fault-plan {path}: unreadable JSON ({exc})") from None
        if not isinstance(data, dict):
            raise UsageError(f"--fault-plan {path}: expected a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"--fault-plan {path}: unknown key(s) {unknown}", hint=f"known: {sorted(known)}")
        hold = data.get("prefill_hold_s", 0.0)
        if isinstance(hold, bool) or not isinstance(hold, (int, float)) or not math.isfinite(hold) or hold < 0:
            raise UsageError(f"--fault-plan {path}: prefill_hold_s must be a number >= 0, got {hold!r}")
        texts = {}
        for key in ("prefill_corrupt_marker", "decode_link_error"):
            texts[key] = data.get(key, "")
            if not isinstance(texts[key], str):
                raise UsageError(f"--fault-plan {path}: {key} must be a string, got {texts[key]!r}")
        return cls(prefill_hold_s=float(hold), **texts)
