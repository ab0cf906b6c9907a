"""A server's self-description (`/server_info`): the one list of its keys, specctl's writer, tolerant readers.

`Key` names every key specctl's own servers write and that preflight (`specctl.schemas.server_facts`) and
bench read, by SGLang's names where SGLang has the key (specctl's servers answer in SGLang's shape);
`SERVER_ARGS` are SGLang's resolved server arguments among them, in the order SGLang lists them.
`sglang_server_args(role, role_name, accept_length=...)` is specctl's writer of those keys (the engine's
`/server_info` handler adds its live state on top), and the SGLang pair rules predict an SGLang server's
document over the same `SERVER_ARGS`.

Servers differ (specctl, SGLang's `/get_server_info`, none at all), so the bench's readers search the
JSON for a few known key names at any depth and return None when they find nothing; the report then
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

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from specctl.schemas.model_facts import resolve_model_dir


class Key:
    """The `/server_info` keys, by name."""

    # SGLang's resolved server arguments (flat, top level)
    MODEL_PATH = "model_path"
    TOKENIZER_PATH = "tokenizer_path"
    SERVED_MODEL_NAME = "served_model_name"
    DTYPE = "dtype"
    DEVICE = "device"
    PAGE_SIZE = "page_size"
    MAX_RUNNING_REQUESTS = "max_running_requests"
    DISAGGREGATION_MODE = "disaggregation_mode"
    BOOTSTRAP_PORT = "disaggregation_bootstrap_port"
    TRANSFER_BACKEND = "disaggregation_transfer_backend"
    ALLOCATION_POLICY = "disaggregation_decode_allocation_policy"
    KV_CACHE_DTYPE = "kv_cache_dtype"
    KV_LAYOUT = "kv_layout"
    TP_SIZE = "tp_size"
    DP_SIZE = "dp_size"
    PP_SIZE = "pp_size"
    ATTN_DP_SIZE = "attn_dp_size"
    ATTN_CP_SIZE = "attn_cp_size"
    ATTN_TP_SIZE = "attn_tp_size"
    ENABLE_DP_ATTENTION = "enable_dp_attention"
    SPECULATIVE_ALGORITHM = "speculative_algorithm"
    DRAFT_MODEL_PATH = "speculative_draft_model_path"
    NUM_STEPS = "speculative_num_steps"
    EAGLE_TOPK = "speculative_eagle_topk"
    NUM_DRAFT_TOKENS = "speculative_num_draft_tokens"
    ADAPTIVE = "speculative_adaptive"
    ADAPTIVE_CONFIG = "speculative_adaptive_config"
    DISABLE_HYBRID_SWA_MEMORY = "disable_hybrid_swa_memory"
    MAMBA_FULL_MEMORY_RATIO = "mamba_full_memory_ratio"
    MAMBA_SSM_DTYPE = "mamba_ssm_dtype"
    SWA_FULL_TOKENS_RATIO = "swa_full_tokens_ratio"
    STATE_TYPES = "state_types"
    VERSION = "version"
    # SGLang's live state
    INTERNAL_STATES = "internal_states"  # one dict per DP rank
    AVG_SPEC_ACCEPT_LENGTH = "avg_spec_accept_length"
    # prefill's bootstrap `/route` answer (its other keys are the server arguments' names)
    ROUTE_ALLOCATION_POLICY = "decode_allocation_policy"
    # /model_info
    ARCHITECTURES = "architectures"
    MODEL_TYPE = "model_type"
    # specctl's own, on top of SGLang's
    ROLE = "role"
    RESOLVED_ROLE = "resolved_role"  # the merged deployment role the server runs
    ENGINE = "engine"  # the engine's stats (a dict), or the engine's name
    FINGERPRINTS = "fingerprints"  # {"target": {...}, "registration": "<hash>"}
    REGISTRATION = "registration"
    SPECCTL_BOOTSTRAP_PORT = "specctl_bootstrap_port"
    SPECCTL_VERSION = "specctl_version"
    ADAPTIVE_STATE = "adaptive"  # the live adaptive snapshot
    MEAN_TOKENS_PER_VERIFY = "mean_tokens_per_verify"


SERVER_ARGS = (
    Key.MODEL_PATH, Key.TOKENIZER_PATH, Key.SERVED_MODEL_NAME, Key.DTYPE, Key.DEVICE, Key.PAGE_SIZE,
    Key.MAX_RUNNING_REQUESTS, Key.DISAGGREGATION_MODE, Key.BOOTSTRAP_PORT, Key.TRANSFER_BACKEND,
    Key.ALLOCATION_POLICY, Key.KV_CACHE_DTYPE, Key.TP_SIZE, Key.DP_SIZE, Key.PP_SIZE, Key.ATTN_DP_SIZE,
    Key.ATTN_CP_SIZE, Key.ENABLE_DP_ATTENTION, Key.SPECULATIVE_ALGORITHM, Key.DRAFT_MODEL_PATH, Key.NUM_STEPS,
    Key.EAGLE_TOPK, Key.NUM_DRAFT_TOKENS, Key.ADAPTIVE, Key.ADAPTIVE_CONFIG, Key.DISABLE_HYBRID_SWA_MEMORY,
    Key.MAMBA_FULL_MEMORY_RATIO, Key.MAMBA_SSM_DTYPE, Key.SWA_FULL_TOKENS_RATIO,
)
SPECCTL_VERSION = "specctl-0.1.0"  # what specctl's servers answer for SGLang's `version`


def tokenizer_dir(model_dir: Path) -> Path:
    """The directory with only the tokenizer files (builtin models ship one), else the model directory."""
    sub = model_dir / "tokenizer"
    return sub if (sub / "tokenizer.json").is_file() else model_dir


def model_paths(model_ref: str) -> tuple[str, str]:
    """(model directory, tokenizer directory) of a model reference, as local absolute paths."""
    model_dir = Path(resolve_model_dir(model_ref)).resolve()
    return str(model_dir), str(tokenizer_dir(model_dir))


def sglang_server_args(role: Mapping[str, Any], role_name: str, *, accept_length: float | None) -> dict[str, Any]:
    """The SGLang-shaped keys of a specctl server's `/server_info`, from its merged deployment role."""
    model = role.get("model") or {}
    spec = role.get("speculative") or {}
    cache = role.get("cache") or {}
    serve = role.get("serve") or {}
    ref = str(model.get("target") or "")
    try:
        model_path, tok_path = model_paths(ref)
    except Exception:  # an unreadable model must not make /server_info fail: it reports what it knows
        model_path = tok_path = ref
    algo = str(spec.get("algorithm") or "none")
    draft_path = None
    if algo == "draft" and spec.get("draft"):
        try:
            draft_path = model_paths(str(spec["draft"]))[0]
        except Exception:
            draft_path = str(spec["draft"])
    adaptive = spec.get("adaptive")
    return {
        Key.MODEL_PATH: model_path,
        Key.TOKENIZER_PATH: tok_path,
        Key.SERVED_MODEL_NAME: ref,
        Key.DTYPE: model.get("dtype"),
        Key.DEVICE: model.get("device"),
        Key.PAGE_SIZE: cache.get("page_size"),
        Key.MAX_RUNNING_REQUESTS: serve.get("max_batch_size"),
        Key.DISAGGREGATION_MODE: role_name if role_name in ("prefill", "decode") else "null",
        # Not `disaggregation_bootstrap_port`: SGLang's bootstrap answers HTTP `/route` there, specctl's is the
        # ZMQ handshake, and a client of SGLang's key would wait on it for HTTP.
        Key.SPECCTL_BOOTSTRAP_PORT: role.get("bootstrap_port"),
        Key.TRANSFER_BACKEND: (role.get("transfer") or {}).get("backend"),
        Key.SPECULATIVE_ALGORITHM: None if algo == "none" else algo.upper(),
        Key.NUM_STEPS: spec.get("num_steps") if algo != "none" else None,
        Key.ADAPTIVE: bool(adaptive),
        # SGLang passes a file path; specctl's adaptive config is inline: its canonical JSON.
        Key.ADAPTIVE_CONFIG: json.dumps(adaptive, sort_keys=True) if adaptive else None,
        Key.DRAFT_MODEL_PATH: draft_path,
        Key.NUM_DRAFT_TOKENS: (int(spec.get("num_steps") or 0) + 1) if algo != "none" else None,
        Key.KV_CACHE_DTYPE: "auto",
        Key.TP_SIZE: 1,
        Key.DP_SIZE: 1,
        Key.PP_SIZE: 1,
        Key.STATE_TYPES: list(cache.get("state_types") or []) or None,
        Key.INTERNAL_STATES: [{Key.AVG_SPEC_ACCEPT_LENGTH: accept_length}],
        Key.VERSION: SPECCTL_VERSION,
    }

# Echoes of the configuration, not runtime state: a config's `adaptive` block is not the live one.
_SKIP = frozenset({"deployment", "raw", Key.RESOLVED_ROLE, "config", Key.REGISTRATION})


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
    value = find_key(info, ("fingerprint", "handshake_fingerprint", Key.FINGERPRINTS))
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
    value = find_key(info, (Key.AVG_SPEC_ACCEPT_LENGTH, "avg_accept_length", "accept_length",
                            Key.MEAN_TOKENS_PER_VERIFY))
    return float(value) if _is_number(value) else None


def sglang_accept_lengths(info: object) -> list[float]:
    """`avg_spec_accept_length` of each DP rank in SGLang's `internal_states` (empty when absent)."""
    states = info.get(Key.INTERNAL_STATES) if isinstance(info, Mapping) else None
    if not isinstance(states, list):
        return []
    values = [s.get(Key.AVG_SPEC_ACCEPT_LENGTH) for s in states if isinstance(s, dict)]
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
    value = find_key(info, (Key.ADAPTIVE_STATE,))
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
