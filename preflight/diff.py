"""Difference (prefill vs decode) and Drift (server vs deployment): one disagreeing field each, with the fix.

`compare_pair(prefill, decode)` returns a row for every `PAIR_FIELDS` field that differs (all of
them, not the first), plus a row when a server answers in the wrong PD role. `compare_with_deployment`
returns a `Drift` for every field a deployment pins that the running server resolved differently (SGLang
resolves some values itself: page size, `max_running_requests`, draft tokens under adaptive).
Each fix names the SGLang flag and the deployment key, since either engine may be behind the URL.
"""

from __future__ import annotations

from dataclasses import dataclass

from specctl.preflight.facts import PAIR_FIELDS, ServerFacts

# field -> (SGLang flag, deployment key), for the fix text.
_KNOBS: dict[str, tuple[str, str]] = {
    "model_path": ("--model-path", "model.target"),
    "architecture": ("--model-path", "model.target"),
    "dtype": ("--dtype", "model.dtype"),
    "page_size": ("--page-size", "cache.page_size"),
    "kv_cache_dtype": ("--kv-cache-dtype", "model.dtype"),
    "kv_layout": ("--enable-page-major-kv-layout / SGLANG_DSV4_KV_LAYOUT", "-"),
    "tp_size": ("--tp-size", "-"),
    "dp_size": ("--dp-size", "-"),
    "pp_size": ("--pp-size", "-"),
    "attn_tp_size": ("--tp-size / --attn-dp-size / --attn-cp-size", "-"),
    "decode_allocation_policy": ("--disaggregation-decode-allocation-policy", "-"),
    "transfer_backend": ("--disaggregation-transfer-backend", "transfer.backend"),
    "speculative_algorithm": ("--speculative-algorithm", "speculative.algorithm"),
    "draft_model": ("--speculative-draft-model-path", "speculative.draft"),
    "num_steps": ("--speculative-num-steps", "speculative.num_steps"),
    "eagle_topk": ("--speculative-eagle-topk", "speculative.topk"),
    "num_draft_tokens": ("--speculative-num-draft-tokens", "speculative.num_steps"),
    "adaptive": ("--speculative-adaptive", "speculative.adaptive"),
    "adaptive_config": ("--speculative-adaptive-config", "speculative.adaptive"),
    "disable_hybrid_swa_memory": ("--disable-hybrid-swa-memory", "-"),
    "mamba_full_memory_ratio": ("--mamba-full-memory-ratio", "-"),
    "mamba_ssm_dtype": ("--mamba-ssm-dtype", "-"),
    "swa_full_tokens_ratio": ("--swa-full-tokens-ratio", "-"),
    "state_types": ("--model-path / --disable-hybrid-swa-memory", "model.target / cache.state_types"),
    "engine": ("the same engine on both sides", "engine"),
    "version": ("the same SGLang (or specctl) version on both sides", "-"),
    "max_running_requests": ("--max-running-requests", "serve.max_batch_size"),
    "role": ("--disaggregation-mode", "roles"),
}

# When SGLang would have failed on each field (its own checks), for the detail column.
_WHEN = {
    "page_size": "decode's first request (Page size mismatch)",
    "kv_cache_dtype": "decode's first request (KV cache dtype mismatch)",
    "kv_layout": "decode's first request (KV layout mismatch)",
    "state_types": "the first KV transfer (state component count mismatch / kv_args.state_types is empty)",
    "mamba_ssm_dtype": "the first KV transfer (Mamba slot size mismatch)",
    "attn_tp_size": "the first KV transfer (head slicing)",
}

# Fields compared only when both sides report them (SGLang skips its own check on None).
_WHEN_BOTH_KNOWN = frozenset({"kv_layout", "decode_allocation_policy", "state_types", "version"})
# Model references compared as directories (`builtin:tiny-hybrid` is its package directory).
_PATHS = frozenset({"model_path", "draft_model"})
_SPECCTL_BACKENDS = frozenset({"zmq", "shm"})


@dataclass(frozen=True)
class Difference:
    """One row of the pair diff: `field`, prefill's and decode's values, how to fix it."""

    field: str
    prefill: object
    decode: object
    fix: str
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {"field": self.field, "prefill": _plain(self.prefill), "decode": _plain(self.decode),
                "fix": self.fix, "detail": self.detail}


@dataclass(frozen=True)
class Drift:
    """One field a running server resolved differently from what the deployment asked for."""

    role: str
    field: str
    asked: object
    running: object
    fix: str

    def to_json(self) -> dict[str, object]:
        return {"role": self.role, "field": self.field, "asked": _plain(self.asked),
                "running": _plain(self.running), "fix": self.fix}


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _fix(name: str, what: str) -> str:
    flag, key = _KNOBS.get(name, (name, "-"))
    where = f"SGLang: {flag}" + (f"; deployment: {key}" if key != "-" else "")
    return f"{what} ({where})"


def compare_pair(prefill: ServerFacts, decode: ServerFacts) -> list[Difference]:
    """Every field on which prefill and decode disagree, in `PAIR_FIELDS` order."""
    rows: list[Difference] = []
    for side, facts, wrong in (("prefill", prefill, "decode"), ("decode", decode, "prefill")):
        if facts.role == wrong:
            rows.append(Difference(
                "role", prefill.role, decode.role,
                _fix("role", f"point --{side} at a server started with --disaggregation-mode {side}"),
                detail=f"{facts.url} is a {wrong} server"))
    for name in PAIR_FIELDS:
        p, d = prefill.value(name), decode.value(name)
        if p == d or (name in _WHEN_BOTH_KNOWN and (p is None or d is None)):
            continue
        if name in _PATHS and isinstance(p, str) and isinstance(d, str) and _same_model(p, d):
            continue
        rows.append(Difference(name, p, d, _fix(name, "start both servers with the same value"),
                               detail=f"SGLang fails at {_WHEN[name]}" if name in _WHEN else ""))
    return rows


# Fields a deployment role pins; compared with what each running server resolved.
DEPLOYMENT_FIELDS = (
    "model_path", "dtype", "page_size", "transfer_backend", "speculative_algorithm", "draft_model",
    "num_steps", "num_draft_tokens", "adaptive", "state_types", "max_running_requests",
)


def compare_with_deployment(role: str, running: ServerFacts, asked: ServerFacts) -> list[Drift]:
    """Every field the deployment pins for `role` that the running server resolved differently."""
    rows: list[Drift] = []
    for name in DEPLOYMENT_FIELDS:
        want, got = asked.value(name), running.value(name)
        if want is None or want == got:
            continue
        if name in _PATHS and isinstance(want, str) and isinstance(got, str) and _same_model(want, got):
            continue
        if name == "state_types" and got is None:
            continue  # the server cannot say; the pair check covers what both report
        if name == "transfer_backend" and running.engine == "sglang" and want in _SPECCTL_BACKENDS:
            continue  # specctl's own backends; an SGLang server runs the one the export chose for it
        rows.append(Drift(role, name, want, got,
                          _fix(name, f"restart the {role} server with the deployment's value, or change "
                                     "the deployment to what the server resolved")))
    return rows


def _same_model(want: str, got: str) -> bool:
    """The same model directory, spelled differently (a `builtin:` name, `~`, a relative path)."""
    from specctl.errors import SpecctlError
    from specctl.schemas.model_facts import resolve_model_dir

    try:
        return resolve_model_dir(want).resolve() == resolve_model_dir(got).resolve()
    except (OSError, SpecctlError):
        return False
