"""A finished request's speculative statistics in SGLang's spellings, and SGLang's per-request metrics file.

Contract (SGLang 0.5.23's names, read from its `TokenizerManager._calculate_spec_decoding_metrics`,
`SpecTokensDetails` and `FileRequestMetricsExporter`):

- `spec_meta(accepts, completion_tokens, launch_steps)`: the keys SGLang puts in a finished request's
  `meta_info`: `spec_verify_ct` (verify forwards), `spec_num_correct_drafts` (accepted drafts, the target's
  own token not counted), `spec_accept_length` (completion tokens per verify, so the prefill's first token
  counts, as SGLang's does), `spec_correct_drafts_histogram` (index k: verifies that accepted k drafts),
  and with the launch-time draft length `spec_num_proposed_drafts` (= verify count x launch steps, SGLang's
  formula: wrong under adaptive, kept for its readers) and `spec_accept_rate`. specctl adds
  `spec_accept_lengths`, the accepted drafts of each verify in order (SGLang has no such key).
  Empty for a request that ran no verify, as SGLang's.
- `spec_tokens_details(meta)`: `sglext.spec_tokens_details` of SGLang's OpenAI responses (every field of
  its `SpecTokensDetails`, defaults included), built from such a `meta_info`.
- `MetricsFile(dir)`: `--export-metrics-to-file`: one JSON line per finished request in
  `DIR/sglang-request-metrics-YYYYmmdd_HH.log`, `{"request_parameters": "<JSON string>", **meta_info}`,
  appended with one `write` per line (O_APPEND) so several processes may share a directory.

Torch-free.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specctl.schemas.role_config import RoleConfig

EXPORT_DIR_ENV = "SPECCTL_EXPORT_METRICS_TO_FILE_DIR"


def launch_steps(role: RoleConfig) -> int | None:
    """The launch-time draft length of a serving role (None: no speculation, or unknown)."""
    spec = role.speculative
    if spec.algorithm == "none":
        return None
    steps = spec.num_steps
    return steps if steps is not None and steps > 0 else None


def spec_meta(accepts: Sequence[int], completion_tokens: int, launch: int | None) -> dict[str, Any]:
    """SGLang's speculative `meta_info` keys for one finished request (module docstring)."""
    if not accepts:
        return {}
    verify_ct = len(accepts)
    correct = int(sum(accepts))
    hist = [0] * (max(accepts) + 1)
    for a in accepts:
        hist[a] += 1
    out: dict[str, Any] = {}
    if launch:
        proposed = verify_ct * launch
        out["spec_accept_rate"] = correct / proposed
        out["spec_num_proposed_drafts"] = proposed
    out.update({
        "spec_accept_length": completion_tokens / verify_ct,
        "spec_num_correct_drafts": correct,
        "spec_verify_ct": verify_ct,
        "spec_correct_drafts_histogram": hist,
        "spec_accept_lengths": [int(a) for a in accepts],
    })
    return out


def request_meta(rid: str, *, prompt_tokens: int, completion_tokens: int, finish_reason: str | None,
                 accepts: Sequence[int], launch: int | None, received_ts: float | None = None,
                 first_token_latency: float | None = None, e2e_latency: float | None = None) -> dict[str, Any]:
    """A finished request's `meta_info` as SGLang writes it (ids, counts, the speculative keys, and the times
    its `--enable-metrics` adds: `request_received_ts` and `request_finished_ts` in Unix seconds,
    `first_token_latency` and `e2e_latency` in seconds)."""
    meta: dict[str, Any] = {"id": rid, "finish_reason": None if finish_reason is None else {"type": finish_reason},
                            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if received_ts is not None:
        meta["request_received_ts"] = received_ts
        if first_token_latency is not None:
            meta["first_token_latency"] = first_token_latency
        if e2e_latency is not None:
            meta["request_finished_ts"] = received_ts + e2e_latency
    meta.update(spec_meta(accepts, completion_tokens, launch))
    return meta


class RequestClock:
    """When a request arrived (Unix and monotonic seconds) and produced its first token: SGLang's request times."""

    def __init__(self) -> None:
        self.received_ts = time.time()
        self.t0 = time.perf_counter()
        self.first: float | None = None

    def tokens(self, ids: Sequence[int]) -> None:
        if ids and self.first is None:
            self.first = time.perf_counter()

    def times(self) -> dict[str, float | None]:
        """`request_meta`'s keyword arguments for a request finishing now."""
        return {"received_ts": self.received_ts, "e2e_latency": time.perf_counter() - self.t0,
                "first_token_latency": None if self.first is None else self.first - self.t0}


_DETAIL_DEFAULTS: dict[str, Any] = {
    "spec_accept_rate": 0.0, "spec_accept_length": 0.0, "spec_cap_length": 0.0, "spec_block_accept_length": 0.0,
    "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0, "spec_verify_ct": 0,
    "spec_correct_drafts_histogram": [], "spec_cap_lens_histogram": [],
}


def spec_tokens_details(meta: dict[str, Any]) -> dict[str, Any] | None:
    """`sglext.spec_tokens_details` from a `meta_info` (None when it holds no speculative key, as SGLang)."""
    if not any(k in meta for k in _DETAIL_DEFAULTS):
        return None
    return {k: meta.get(k) or default for k, default in _DETAIL_DEFAULTS.items()}


class MetricsFile:
    """SGLang's `--export-metrics-to-file` writer (module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls) -> MetricsFile | None:
        d = os.environ.get(EXPORT_DIR_ENV)
        return cls(d) if d else None

    def path(self, now: float | None = None) -> Path:
        return self.dir / f"sglang-request-metrics-{time.strftime('%Y%m%d_%H', time.localtime(now))}.log"

    def write(self, request_parameters: dict[str, Any], meta: dict[str, Any]) -> None:
        line = json.dumps({"request_parameters": json.dumps(request_parameters), **meta}) + "\n"
        fd = os.open(self.path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
