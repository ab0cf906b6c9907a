"""Step costs from what a running server reports per request: the cost model `tune` reads, fitted from
served requests instead of an in-process engine.

Contract:

- `RequestTiming`: one finished request of a wave of `batch_size` requests sent together to a server that
  drafts `steps` per verify (0: plain decoding): `decode_s`, the client's time from its first to its last
  token, and `decode_steps`, the engine steps inside that span: the request's verify count (SGLang's
  `spec_verify_ct`, in `meta_info` and `sglext.spec_tokens_details`) when it speculates, else its
  completion tokens less the first (which the prefill produced). The first token marks the end of the
  prefill and the last the end of the last verify, so the span holds exactly those steps.
- `fit_points(timings)`: per (batch size, steps), the median of `decode_s / decode_steps` over the
  requests, with its quartiles and sample count. A wave's requests verify together while all of them
  decode; one that outlives the others runs its last verifies at a smaller batch (cheaper), and one whose
  prefill came after a sibling's first token charges that sibling its prefill (dearer): the median over
  every request of several waves keeps either from deciding the point.
- `served_cost_model(fits, meta)`: a `CostModel` of those medians (`step_s` only: no refill, no sampled
  table), `meta["measured_points"]` holding each point's quartiles and samples. The times are served
  steps: they include the serving loop's turn (scheduling, detokenising, streaming), which an in-process
  `adaptive profile` leaves out.
- `merge_cost_models(models)`: one model from several (each server or launch measures the steps it ran);
  every model must measure the same batch sizes, and no point twice.
- `with_estimated_steps(model, steps, basis)`: adds steps nobody measured, linear in the steps through the
  two nearest measured ones at each batch size, and labels the whole model an estimate (`meta["estimate"]`,
  which `tune` prints), listing the estimated points in `meta["estimated_points"]`.

Torch-free and I/O-free: the load that produces the timings is `specctl.bench.step_cost`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specctl.adaptive.cost import CostModel
from specctl.errors import UsageError

# Code-like text, so a draft model agrees with the target about as often as it does on real prompts; the
# in-process profile (engine/speculative/profile.py) and the served one send windows of it.
PROFILE_PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n        path = os.path.join("


def prompt_windows(count: int, chars: int | None = None) -> list[str]:
    """`count` different prompts: windows of PROFILE_PROMPT repeated, each starting 5 characters further in,
    `chars` long (default: PROFILE_PROMPT's own length)."""
    want = chars if chars is not None else len(PROFILE_PROMPT)
    text = PROFILE_PROMPT * (2 + want // len(PROFILE_PROMPT))
    return [text[(5 * i) % len(PROFILE_PROMPT):][:want] for i in range(count)]


@dataclass(frozen=True)
class RequestTiming:
    batch_size: int
    steps: int
    decode_s: float
    decode_steps: int
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class PointFit:
    """A (batch size, steps) point: median seconds of one step, its quartiles, and how many requests."""

    step_s: float
    low: float
    high: float
    samples: int

    def to_json(self) -> dict[str, Any]:
        return {"step_s": self.step_s, "quartiles": [self.low, self.high], "samples": self.samples}


def fit_points(timings: Iterable[RequestTiming]) -> dict[int, dict[int, PointFit]]:
    """Per batch size and steps, the step time of the requests measured there (module docstring)."""
    per: dict[int, dict[int, list[float]]] = {}
    for t in timings:
        if t.decode_steps < 1 or t.decode_s <= 0:
            continue
        per.setdefault(t.batch_size, {}).setdefault(t.steps, []).append(t.decode_s / t.decode_steps)
    out: dict[int, dict[int, PointFit]] = {}
    for b, row in sorted(per.items()):
        for k, values in sorted(row.items()):
            values.sort()
            q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
            out.setdefault(b, {})[k] = PointFit(statistics.median(values), q[0], q[2], len(values))
    return out


def served_cost_model(fits: Mapping[int, Mapping[int, PointFit]], meta: Mapping[str, Any]) -> CostModel:
    """The cost model of fitted points (module docstring)."""
    if not fits:
        raise UsageError("no request finished with a decode span and a step count: nothing to fit",
                         hint="check that the server answers streamed completions (see the errors above)")
    table = {b: {k: p.step_s for k, p in row.items()} for b, row in fits.items()}
    points = {str(b): {str(k): p.to_json() for k, p in sorted(row.items())} for b, row in sorted(fits.items())}
    return CostModel(table, {**meta, "measured_points": points})


def merge_cost_models(models: Sequence[CostModel]) -> CostModel:
    """One model of several models' points (module docstring); meta from the first, `sources` from all."""
    if not models:
        raise UsageError("no cost model to merge")
    if len(models) == 1:
        return models[0]
    sizes = {m.batch_sizes for m in models}
    if len(sizes) > 1:
        raise UsageError(f"the measurements cover different batch sizes ({sorted(sizes)}): tune prices a step only "
                         "where every batch size measured it", hint="measure every server at the same --batch-sizes")
    table: dict[int, dict[int, float]] = {}
    points: dict[str, dict[str, Any]] = {}
    for m in models:
        for b, row in m.step_s.items():
            for k, t in row.items():
                if k in table.setdefault(b, {}):
                    raise UsageError(f"steps {k} at batch size {b} was measured twice (two servers run steps {k})",
                                     hint="give each server's steps once")
                table[b][k] = t
        mp = m.meta.get("measured_points")
        if isinstance(mp, dict):
            for b_key, row in mp.items():
                if isinstance(row, dict):
                    points.setdefault(str(b_key), {}).update(row)
    first = dict(models[0].meta)
    for key in ("algorithm", "target"):
        first[key] = next((m.meta[key] for m in models if m.meta.get(key)), first.get(key))
    sources = [{k: v for k, v in m.meta.items() if k != "measured_points"} for m in models]
    first.update({"sources": sources, "measured_points": points,
                  "served_steps": sorted({k for m in models for k in m.steps})})
    return CostModel(table, first)


def with_estimated_steps(model: CostModel, steps: Sequence[int], basis: str) -> CostModel:
    """`model` with `steps` it lacks estimated (module docstring); `basis` says what they were estimated from."""
    measured = model.steps
    missing = sorted({k for k in steps if k not in measured})
    if not missing:
        return model
    if len(measured) < 2:
        raise UsageError(f"estimating steps {missing} needs two measured steps to draw a line through; "
                         f"measured: {list(measured)}", hint="measure a second step (a plain server gives steps 0)")
    def filled(src: Mapping[int, Mapping[int, float]] | None, floor: float) -> dict[int, dict[int, float]] | None:
        if src is None:
            return None
        table = {b: dict(row) for b, row in src.items()}
        for row in table.values():
            for k in missing:
                lo, hi = _nearest_pair(measured, k)
                slope = (row[hi] - row[lo]) / (hi - lo)
                row[k] = max(row[lo] + slope * (k - lo), min(row[lo], row[hi]) * floor)
        return table

    label = (f"steps {', '.join(map(str, missing))} estimated linearly through the measured steps "
             f"{', '.join(map(str, measured))} at each batch size ({basis}); the other points are measured")
    meta = {**model.meta, "estimate": label, "estimated_points": {"steps": missing, "basis": basis}}
    step_s = filled(model.step_s, 0.5)
    assert step_s is not None
    return CostModel(step_s, meta, filled(model.sampled_step_s, 0.5), filled(model.refill_s, 0.0),
                     filled(model.sampled_refill_s, 0.0))


def _nearest_pair(measured: Sequence[int], k: int) -> tuple[int, int]:
    """The measured steps a line to k goes through: the neighbours around k, else the last (first) two."""
    below = [m for m in measured if m < k]
    above = [m for m in measured if m > k]
    if below and above:
        return below[-1], above[0]
    if below:
        return below[-2], below[-1]
    return above[0], above[1]


def served_meta(*, url: str, model: str | None, steps: int, algorithm: str | None, max_tokens: int,
                rounds: int, prompt_tokens: int | None, deployment: str | None = None) -> dict[str, Any]:
    """The cost model's settings for a served measurement (`source: served`: `tune` prints `deployment`,
    `clock` and `created`)."""
    return {
        "source": "served",
        "deployment": deployment or url,
        "url": url,
        "target": model,
        "algorithm": algorithm,
        "served_steps": [steps],
        "max_tokens": max_tokens,
        "rounds": rounds,
        "temperature": 0.0,
        "prompt_tokens": prompt_tokens,
        "clock": "wall",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
