"""PrefillExport: what an engine hands over for a request prefilled for another engine (the PD prefill role).

Contract: `Engine.add_request(..., export_after_prefill=True)` admits a request that finishes with reason
"prefilled" in the step that samples its first token; that step exports the request's caches and frees its
pages, and the request's final `RequestOutput` (async_engine) carries this export as `.prefilled`. Fields:

- `tensors`: `runner.export_request` of the prompt (the transfer's components, engine/pd/transfer.py);
- `length`: the tokens they cache (the prompt's ids as the engine admitted them);
- `first_token`: the token prefill sampled (decode applies the request's stop conditions to it);
- `rng_state`: the request's random stream after that sample (a torch generator state as bytes), None when
  greedy; decode continues the same stream;
- `queue_s`: the request's arrival -> the start of the step that sampled its first token;
- `compute_s`: that step's duration (the batch's forward, sampling and export).

Torch-free: the tensors are opaque here.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class PrefillExport:
    """A prefilled request's caches, first token, random stream and prefill timings."""

    tensors: dict[str, Any]
    length: int
    first_token: int
    rng_state: bytes | None = None
    queue_s: float = 0.0
    compute_s: float = 0.0
