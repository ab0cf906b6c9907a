"""Reading a server's self-description (`/server_info`) tolerantly: whatever is present, else None.

Servers differ (specctl, SGLang's `/get_server_info`, none at all), so every reader searches the
JSON for a few known key names at any depth and returns None when it finds nothing; the report then
says "n/a". Recognised keys:

- fingerprint: `fingerprint`, `handshake_fingerprint`, `fingerprints` (a dict, e.g. per role)
- server-wide acceptance (tokens per verify step, SGLang's convention): SGLang's
  `internal_states[].avg_spec_accept_length` (one entry per DP rank: their mean; SGLang 0.5.23's
  `/server_info`, averaged since the server started), else `avg_spec_accept_length`,
  `avg_accept_length`, `accept_length`, `mean_tokens_per_verify` at any depth
- steps in use: `batches_per_steps` (verify batches per step count; the run's share is the
  difference between the snapshots)
- adaptive step timeline: a list under `switches` (or `step_switches`), items as dicts with
  `time`, `bucket`, `from_steps`, `to_steps`, `ema` (or `[time, bucket, from, to, ema]` lists)
- time per step: `time_per_step_ms`, `step_time_ms`, `avg_step_time_ms` (a number, or a dict keyed
  by step count), or `mean_step_s` (seconds)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Echoes of the configuration, not runtime state: a config's `adaptive` block is not the live one.
_SKIP = frozenset({"deployment", "raw", "resolved_role", "config", "registration"})


def find_key(obj: object, names: Iterable[str], *, depth: int = 6) -> Any:
    """The value of the first of `names` found in `obj` (breadth-first over nested dicts and lists,
    not descending into configuration echoes such as `deployment` or `resolved_role`)."""
    wanted = tuple(names)
    level = [obj]
    for _ in range(depth):
        nxt: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                for name in wanted:
                    if name in item and item[name] is not None:
                        return item[name]
                nxt.extend(v for k, v in item.items() if isinstance(v, (dict, list)) and k not in _SKIP)
            elif isinstance(item, list):
                nxt.extend(v for v in item[:64] if isinstance(v, (dict, list)))
        level = nxt
        if not level:
            break
    return None


def fingerprint(info: object) -> str | None:
    value = find_key(info, ("fingerprint", "handshake_fingerprint", "fingerprints"))
    if isinstance(value, (str, int)):
        return str(value)
    if isinstance(value, dict):
        # A structured fingerprint (per role or per model): keep it compact but traceable.
        flat = _flatten(value)
        return ",".join(f"{k}={v}" for k, v in sorted(flat.items())) or None
    return None


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        elif isinstance(v, (str, int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


def server_accept_length(info: object) -> float | None:
    ranks = sglang_accept_lengths(info)
    if ranks:
        return sum(ranks) / len(ranks)
    value = find_key(info, ("avg_spec_accept_length", "avg_accept_length", "accept_length",
                            "mean_tokens_per_verify"))
    return float(value) if _is_number(value) else None


def sglang_accept_lengths(info: object) -> list[float]:
    """`avg_spec_accept_length` of each DP rank in SGLang's `internal_states` (empty when absent)."""
    states = info.get("internal_states") if isinstance(info, dict) else None
    if not isinstance(states, list):
        return []
    values = [s.get("avg_spec_accept_length") for s in states if isinstance(s, dict)]
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def time_per_step(info: object) -> dict[str, float] | float | None:
    value = find_key(info, ("time_per_step_ms", "step_time_ms", "avg_step_time_ms"))
    if value is None:
        seconds = find_key(info, ("mean_step_s",))
        return 1000.0 * float(seconds) if _is_number(seconds) else None
    if _is_number(value):
        return float(value)
    if isinstance(value, dict):
        out = {str(k): float(v) for k, v in value.items() if _is_number(v)}
        return out or None
    return None


def adaptive_switches(before: object, after: object) -> list[dict[str, Any]] | None:
    """The step switches that happened between two snapshots (None if the server reports none)."""
    after_list = find_key(after, ("switches", "step_switches"))
    if not isinstance(after_list, list):
        return None
    before_list = find_key(before, ("switches", "step_switches"))
    skip = len(before_list) if isinstance(before_list, list) and len(before_list) <= len(after_list) else 0
    out = []
    for item in after_list[skip:]:
        norm = _switch(item)
        if norm is not None:
            out.append(norm)
    return out


def batches_per_steps(before: object, after: object) -> dict[str, int] | None:
    """Verify batches run at each step count during the run (after - before), or None."""
    a = find_key(after, ("batches_per_steps",))
    if not isinstance(a, dict):
        return None
    b = find_key(before, ("batches_per_steps",))
    b = b if isinstance(b, dict) else {}
    out = {}
    for k, v in a.items():
        if _is_number(v):
            prev = b.get(k, 0)
            delta = v - (prev if _is_number(prev) else 0)
            if delta:
                out[str(k)] = int(delta)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0]) if kv[0].lstrip("-").isdigit() else 0))


def adaptive_state(info: object) -> dict[str, Any] | None:
    """The server's adaptive snapshot as reported (a small dict), for the record."""
    value = find_key(info, ("adaptive",))
    return value if isinstance(value, dict) else None


def _switch(item: object) -> dict[str, Any] | None:
    if isinstance(item, dict):
        out = {k: item.get(k) for k in ("time", "bucket", "from_steps", "to_steps", "ema")}
        return out if _is_number(out["to_steps"]) else None
    if isinstance(item, (list, tuple)) and len(item) >= 4:
        keys = ("time", "bucket", "from_steps", "to_steps", "ema")
        return dict(zip(keys, item[:5], strict=False))
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
