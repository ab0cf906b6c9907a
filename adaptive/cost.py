"""The cost model: seconds of one decode step per (batch size, steps), and its JSON form.

Contract:

`CostModel` is what `specctl adaptive profile` writes: the wall time of one decode step (draft +
  verify) per (batch size, steps) on one machine, steps 0 being plain decoding, settled (well after a
  prefill), and what the steps after a request joins pay beyond that (`refill_time`). `step_time(b, k)`

Torch-free.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.errors import UsageError

COST_KIND = "specctl-cost-model"
COST_VERSION = 1


@dataclass(frozen=True)
class CostModel:
    """Seconds of one decode step per (batch size, steps), measured on one machine."""

    step_s: Mapping[int, Mapping[int, float]]  # batch size -> steps -> seconds (greedy requests)
    meta: Mapping[str, Any] = field(default_factory=dict)
    # The same table for sampled requests (rejection sampling drafts and verifies cost more), when profiled.
    sampled_step_s: Mapping[int, Mapping[int, float]] | None = None
    # Seconds the steps after a request joins (its prefill) take beyond settled ones, per (batch size, steps),
    # greedy and sampled: the cache refill a prefill costs the decode, and a new request's draft prompt pass
    # (`profile`). None in cost models written before it was measured: then no step pays it.
    refill_s: Mapping[int, Mapping[int, float]] | None = None
    sampled_refill_s: Mapping[int, Mapping[int, float]] | None = None
    # (batch size, steps, sampled, joined) -> `price`: tune replays the same steps thousands of times
    _prices: dict[tuple[int, int, float, bool], float] = field(default_factory=dict, compare=False, repr=False)

    def price(self, batch_size: int, steps: int, sampled: float, joined: bool) -> float:
        """`step_time`, plus `refill_time` when requests `joined` since the last step; memoised."""
        key = (batch_size, steps, sampled, joined)
        t = self._prices.get(key)
        if t is None:
            t = self.step_time(batch_size, steps, sampled)
            if joined:
                t += self.refill_time(batch_size, steps, sampled)
            self._prices[key] = t
        return t

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.step_s))

    @property
    def estimate(self) -> str | None:
        """The label of a cost model that was estimated, not measured (`meta["estimate"]`: what estimated it
        and for what), else None."""
        label = self.meta.get("estimate")
        return str(label) if label else None

    def provenance(self) -> str:
        """One line saying which cost model prices the replay: measured (where and how) or an estimate."""
        if self.estimate is not None:
            return f"an ESTIMATE, not a measurement: {self.estimate}"
        m = self.meta
        if m.get("source") == "served":
            return (f"measured by `adaptive profile` on the running server {m.get('deployment')} (served steps, "
                    f"timed per request, {m.get('clock', 'wall')} clock, {m.get('created', 'undated')})")
        if m.get("device") is None:
            return "of unknown origin (no `adaptive profile` metadata)"
        return (f"measured by `adaptive profile` of {m.get('deployment')} on {m.get('device')} "
                f"({m.get('threads')} thread(s), {m.get('clock', 'wall')} clock, {m.get('created', 'undated')})")

    @functools.cached_property
    def steps(self) -> tuple[int, ...]:
        """Steps measured at every batch size (step_time checks every priced step against it)."""
        sets = [set(v) for v in self.step_s.values()]
        return tuple(sorted(set.intersection(*sets))) if sets else ()

    def step_time(self, batch_size: int, steps: int, sampled: float = 0.0) -> float:
        """Seconds of one step of `batch_size` requests at `steps`, `sampled` of them sampling: the greedy
        and sampled tables mixed in that proportion (greedy only when the model has no sampled table)."""
        self._covers(steps)
        t = _interpolate(self.step_s, batch_size, steps)
        if sampled > 0 and self.sampled_step_s is not None:
            frac = min(1.0, sampled / batch_size)
            t += frac * (_interpolate(self.sampled_step_s, batch_size, steps) - t)
        return t

    def _covers(self, steps: int) -> None:
        """A step is priced when measured, or between two measured ones (linear between them, `_at`): a trace
        drafting K every step holds verifies that drafted fewer (a request's max_tokens cap), and a profile of
        steps 0,1,3,5,7 must still price its 6. `tune` only proposes measured steps."""
        measured = self.steps
        if steps not in measured and not (measured and measured[0] < steps < measured[-1]):
            raise UsageError(f"the cost model has no measurement for steps {steps} (it has {list(measured)}), "
                             "nor one on each side of it",
                             hint="re-run `specctl adaptive profile` with --steps covering it")

    def refill_time(self, batch_size: int, steps: int, sampled: float = 0.0) -> float:
        """Seconds the steps after a request joins a batch of `batch_size` at `steps` pay beyond settled steps
        (`refill_s`, mixed by the sampled share as `step_time`); 0.0 when the model did not measure it."""
        if self.refill_s is None:
            return 0.0
        self._covers(steps)
        t = _interpolate(self.refill_s, batch_size, steps)
        if sampled > 0 and self.sampled_refill_s is not None:
            frac = min(1.0, sampled / batch_size)
            t += frac * (_interpolate(self.sampled_refill_s, batch_size, steps) - t)
        return max(0.0, t)

    def served(self, scale: float, join_s: float = 0.0) -> CostModel:
        """This model at served speed: every step and a refill it measured times `scale`; without a measured
        refill and with `join_s` > 0, a refill of `join_s` at every steps > 0 and none at 0 (the draft's pass
        over a joining request's prompt, which plain decoding never runs). A request that joins while an
        adaptive config runs steps 0 pays its pass when speculation resumes; replays do not charge it there."""
        def scaled(table: Mapping[int, Mapping[int, float]]) -> dict[int, dict[int, float]]:
            return {b: {k: t * scale for k, t in row.items()} for b, row in table.items()}

        def maybe(table: Mapping[int, Mapping[int, float]] | None) -> dict[int, dict[int, float]] | None:
            return None if table is None else scaled(table)

        refill = maybe(self.refill_s)
        if refill is None and join_s > 0:
            refill = {b: {k: join_s if k > 0 else 0.0 for k in row} for b, row in self.step_s.items()}
        return CostModel(scaled(self.step_s), self.meta, maybe(self.sampled_step_s), refill,
                         maybe(self.sampled_refill_s))

    def to_json(self) -> dict[str, Any]:
        tables = {"sampled_step_s": self.sampled_step_s, "refill_s": self.refill_s,
                  "sampled_refill_s": self.sampled_refill_s}
        return {
            "kind": COST_KIND,
            "version": COST_VERSION,
            **dict(self.meta),
            "batch_sizes": list(self.batch_sizes),
            "steps": list(self.steps),
            "step_s": _table_json(self.step_s),
            **{key: _table_json(t) for key, t in tables.items() if t is not None},
        }

    @classmethod
    def from_json(cls, obj: object, *, source: str = "cost model") -> CostModel:
        hint = "write one with `specctl adaptive profile -c DEPLOY --output cost.json`"
        if not isinstance(obj, dict) or obj.get("kind") != COST_KIND:
            raise UsageError(f"{source}: not a specctl cost model (kind {COST_KIND!r} missing)", hint=hint)
        out = _parse_table(obj.get("step_s"), "step_s", source, hint)
        extra: dict[str, dict[int, dict[int, float]] | None] = {}
        for key in ("sampled_step_s", "refill_s", "sampled_refill_s"):
            extra[key] = None
            if obj.get(key) is None:
                continue
            table = extra[key] = _parse_table(obj[key], key, source, hint, zero=key.endswith("refill_s"))
            if set(table) != set(out) or any(set(table[b]) != set(out[b]) for b in out):
                raise UsageError(f"{source}: {key} must measure the same (batch size, steps) points as step_s",
                                 hint=hint)
        skip = ("kind", "version", "step_s", "sampled_step_s", "refill_s", "sampled_refill_s", "batch_sizes",
                "steps")
        cm = cls(out, {k: v for k, v in obj.items() if k not in skip}, extra["sampled_step_s"], extra["refill_s"],
                 extra["sampled_refill_s"])
        if not cm.steps:
            raise UsageError(f"{source}: no steps value is measured at every batch size", hint=hint)
        return cm


def _at(row: Mapping[int, float], steps: int) -> float:
    """row[steps], linear between the nearest measured steps below and above it when it was not measured
    (`CostModel._covers` checked there are both)."""
    if steps in row:
        return float(row[steps])
    below = max(k for k in row if k < steps)
    above = min(k for k in row if k > steps)
    return float(row[below] + (row[above] - row[below]) * (steps - below) / (above - below))


def _interpolate(table: Mapping[int, Mapping[int, float]], batch_size: int, steps: int) -> float:
    """table[batch_size][steps], linear between measured batch sizes (extrapolated from the last two) and
    between measured steps (`_at`)."""
    sizes = sorted(table)
    if batch_size in table:
        return _at(table[batch_size], steps)
    if len(sizes) == 1:
        return _at(table[sizes[0]], steps) * batch_size / sizes[0]
    lo, hi = sizes[0], sizes[1]
    for a, b in itertools.pairwise(sizes):
        lo, hi = a, b
        if batch_size < b:
            break
    tl, th = _at(table[lo], steps), _at(table[hi], steps)
    t = tl + (th - tl) * (batch_size - lo) / (hi - lo)
    return float(max(t, min(tl, th) * 0.5))


def _table_json(table: Mapping[int, Mapping[int, float]]) -> dict[str, dict[str, float]]:
    return {str(b): {str(k): v for k, v in sorted(row.items())} for b, row in sorted(table.items())}


def _parse_table(table: object, key: str, source: str, hint: str, zero: bool = False) -> dict[int, dict[int, float]]:
    """A {batch size: {steps: seconds}} table; seconds > 0 (>= 0 with `zero`: a refill can be nothing)."""
    if not isinstance(table, dict) or not table:
        raise UsageError(f"{source}: {key} must map batch sizes to {{steps: seconds}}", hint=hint)
    out: dict[int, dict[int, float]] = {}
    for bkey, row in table.items():
        try:
            b = int(bkey)
        except ValueError:
            b = 0
        if b < 1 or not isinstance(row, dict) or not row:
            raise UsageError(f"{source}: {key}.{bkey}: expected a positive batch size with a steps table", hint=hint)
        out[b] = {}
        for kkey, sec in row.items():
            try:
                k = int(kkey)
            except ValueError:
                k = -1
            ok = (isinstance(sec, (int, float)) and not isinstance(sec, bool) and math.isfinite(sec)
                  and (sec >= 0 if zero else sec > 0))
            if k < 0 or not ok:
                least = ">=" if zero else ">"
                raise UsageError(f"{source}: {key}.{bkey}.{kkey}: expected steps >= 0 -> seconds {least} 0, "
                                 f"got {kkey!r}: {sec!r}", hint=hint)
            out[b][k] = float(sec)
    return out


def read_cost(path: str | Path) -> CostModel:
    try:
        obj = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read cost model: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON ({str(exc).split(':')[0]})") from None
    return CostModel.from_json(obj, source=str(path))

