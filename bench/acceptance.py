"""Speculative acceptance per request, from the `usage` each response carries.

Per request the reader uses what is present: `accept_lengths` (a list: accepted draft tokens per
verify step, not counting the target's own token), or `spec_accepted_tokens` with
`spec_verify_steps` (SGLang's `spec_verify_ct` is accepted as the step count). A request's accept
length is tokens per verify step in SGLang's convention: `1 + accepted / steps`. The run's
`accept_length` pools all requests (`1 + sum(accepted) / sum(steps)`); without per-request data it
falls back to the server-wide value from `/server_info`, and to None ("n/a") without either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from specctl.bench.request import RequestResult


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def request_acceptance(usage: dict[str, Any] | None) -> tuple[int, int, list[int] | None] | None:
    """(accepted drafts, verify steps, per-step list or None) from one `usage`; None if absent."""
    if not usage:
        return None
    lengths = usage.get("accept_lengths")
    per_step = None
    if isinstance(lengths, list) and all(_count(x) is not None for x in lengths):
        per_step = [int(x) for x in lengths]
    steps = _count(usage.get("spec_verify_steps", usage.get("spec_verify_ct")))
    accepted = _count(usage.get("spec_accepted_tokens"))
    if per_step is not None:
        steps = len(per_step) if steps is None else steps
        accepted = sum(per_step) if accepted is None else accepted
    if steps is None or accepted is None or steps == 0:
        return None
    return accepted, steps, per_step


def summarize_acceptance(results: Sequence[RequestResult], server_accept_length: float | None) -> dict[str, Any]:
    total_acc = total_steps = 0
    per_request: list[float] = []
    histogram: Counter[int] = Counter()
    for r in results:
        if not r.ok:
            continue
        got = request_acceptance(r.usage)
        if got is None:
            continue
        accepted, steps, per_step = got
        total_acc += accepted
        total_steps += steps
        per_request.append(1.0 + accepted / steps)
        if per_step:
            histogram.update(per_step)
    out: dict[str, Any] = {"accept_length": None, "accept_length_source": None, "spec_verify_steps": None,
                           "spec_accepted_tokens": None, "accept_length_per_request": None,
                           "accepted_per_step_histogram": None}
    if total_steps:
        a = np.asarray(per_request)
        out.update(accept_length=1.0 + total_acc / total_steps, accept_length_source="usage",
                   spec_verify_steps=total_steps, spec_accepted_tokens=total_acc,
                   accept_length_per_request={"requests": len(per_request), "mean": float(a.mean()),
                                              "p10": float(np.percentile(a, 10)), "median": float(np.median(a)),
                                              "p90": float(np.percentile(a, 90)), "min": float(a.min()),
                                              "max": float(a.max())})
        if histogram:
            out["accepted_per_step_histogram"] = {str(k): histogram[k] for k in sorted(histogram)}
    elif server_accept_length is not None:
        out.update(accept_length=server_accept_length, accept_length_source="server_info")
    return out
