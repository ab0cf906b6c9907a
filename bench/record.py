"""The run record: one JSON object per sweep point, the unit of `--format json`, `--output` and compare.

A record is flat where SGLang's bench_serving has a field of the same meaning (`backend`,
`dataset_name`, `request_rate`, `max_concurrency`, `random_input_len`, `duration`, `completed`,
`total_input_tokens`, `total_output_tokens`, `request_throughput`, `input_throughput`,
`output_throughput`, `mean_ttft_ms`, `median_ttft_ms`, `p99_ttft_ms`, `mean_tpot_ms`, `p99_itl_ms`,
`mean_e2e_latency_ms`, `concurrency`, `accept_length`, ...), so tools reading bench_serving JSONL
read these too. Additions: p90/p95/max/std for every latency family, errors by kind, goodput, pacing
(`achieved_request_rate`, send delays), acceptance details, the adaptive step timeline, the TTFT
breakdown, `/metrics` deltas, `sampling` (temperature and every sampling field sent), the raw chunk
gap family (`mean_chunk_gap_ms`, ...; `*_itl_ms` is per token, as bench_serving), vLLM's names for the
same numbers (`VLLM_ALIASES`: `total_token_throughput`, `*_e2el_ms`, `spec_decode_*`), and for traceability the
resolved bench `config`, the launched
`deployment` (resolved config) and the server's handshake `fingerprint`; with `--output-details`,
`details` holds per-request arrays (seconds). `REQUIRED_FIELDS` is the
documented minimum every record carries (values may be null where not measurable).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any

from specctl.errors import UsageError

REQUIRED_FIELDS = (
    "specctl_version", "date", "backend", "url", "model", "endpoint", "dataset_name", "num_prompts",
    "request_rate", "max_concurrency", "burstiness", "duration", "completed", "failed", "errors",
    "total_input_tokens", "total_output_tokens", "request_throughput", "input_throughput", "output_throughput",
    "total_throughput", "concurrency", "achieved_request_rate",
    "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "std_ttft_ms", "max_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p95_itl_ms", "p99_itl_ms",
    "max_itl_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
    "mean_chunk_gap_ms", "p99_chunk_gap_ms", "sampling", "total_token_throughput", "mean_e2el_ms",
    "median_e2el_ms", "p99_e2el_ms", "spec_decode_acceptance_length", "spec_decode_num_drafts",
    "goodput", "slo", "accept_length", "accept_length_source", "adaptive", "ttft_breakdown",
    "server_metrics", "fingerprint", "deployment", "config",
    "preflight",  # the live preflight of the pair: {"ok", "prefill", "decode"} fingerprints, or null
)


# Request fields that change what is sampled: shown with the temperature in the table and the record.
SAMPLING_FIELDS = ("top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
                   "logit_bias", "stop", "n", "logprobs")

# vLLM's `vllm bench serve` name -> ours, for the same number (vLLM readers find theirs in the record).
VLLM_ALIASES = {
    "total_token_throughput": "total_throughput",
    **{f"{s}_e2el_ms": f"{s}_e2e_latency_ms" for s in ("mean", "median", "std", "p90", "p95", "p99", "max")},
    "request_goodput": "goodput",
    "spec_decode_acceptance_length": "accept_length",  # mean tokens per verify step (accepted drafts + 1)
    "spec_decode_num_drafts": "spec_verify_steps",  # one draft proposal per request per verify step
    "spec_decode_num_accepted_tokens": "spec_accepted_tokens",
}


def add_aliases(rec: dict[str, Any]) -> dict[str, Any]:
    """`rec` with every VLLM_ALIASES name set to its source field's value (None where it has none)."""
    for alias, source in VLLM_ALIASES.items():
        rec[alias] = rec.get(source)
    return rec


def json_safe(value: Any) -> Any:
    """Recursively replace non-finite floats (not valid JSON) with strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def append_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Append one line per record (creating the file and its folder)."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("a", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(json_safe(rec), sort_keys=False) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write {p}: {exc}") from None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSONL file (UsageError if unreadable, empty, or a line is not a JSON object)."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {p}: {exc}") from None
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{p}:{lineno}: not JSON: {exc.msg}") from None
        if not isinstance(rec, dict):
            raise UsageError(f"{p}:{lineno}: not a JSON object")
        out.append(rec)
    if not out:
        raise UsageError(f"{p}: no records")
    return out
