"""What prefill and decode must agree on: one table, read by every check that compares the two sides.

Each `Agreement` row names one field and how each side's value is found:

- `deployment`: the (section, key) of a deployment role (`specctl validate`'s PD rules compare it);
- `sglang`: SGLang's server argument (`dest`), compared as written or as SGLang resolves it at start-up
  (the SGLang pair rules; `sglang_flag` names the flag where it is not `--<dest>`);
- `registration`: the `RegistrationInfo` attribute paths exchanged in the handshake (a leaf belongs to
  the row whose path is its longest prefix);
- `server_info`: the `ServerFacts` field the live preflight reads from a running server;

when a pair that disagrees fails with no check in front (`fails`, one of `FAILS`; `sglang_failure`
quotes SGLang's own check where it has one), the fix, and the finding codes of the static rules (`code`,
PD5xx) and of the SGLang pair rules (`sglang_code`, SGL2xx) with their severity. A locator left None
means that view cannot express the field, and that check skips the row.

`Difference` is the one row type every comparison returns: the field, both sides' values, the fix from
the table and a detail line. It crosses the handshake wire inside msgspec messages, which encode and
decode frozen dataclasses as they do structs; a dataclass keeps this module importable where msgspec is
not installed (the tool install, without the engine). `to_json()` is its report shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]

START_UP = "start-up"
HANDSHAKE = "handshake"
FIRST_REQUEST = "first request"
FIRST_TRANSFER = "first transfer"
WRONG_OUTPUT = "wrong output"
FAILS = (START_UP, HANDSHAKE, FIRST_REQUEST, FIRST_TRANSFER, WRONG_OUTPUT)


@dataclass(frozen=True, kw_only=True)
class Difference:
    """One field on which prefill and decode disagree: both values, how to fix it, and a detail line."""

    field: str
    prefill: Any
    decode: Any
    fix: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "prefill": _plain(self.prefill), "decode": _plain(self.decode),
                "fix": self.fix, "detail": self.detail}


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def show(value: object) -> str:
    """A value as findings and fixes print it: `(none)`, `[a, b]`, or str()."""
    if value is None:
        return "(none)"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


@dataclass(frozen=True)
class Agreement:
    """One field prefill and decode must agree on (see the module docstring for each locator)."""

    name: str
    label: str
    fails: str
    action: str  # the fix, without where to set it (that part comes from the locators)
    deployment: tuple[str, str] | None = None
    sglang: str | None = None
    sglang_flag: str | None = None  # the flag to name where it is not --<dest>, or where SGLang derives the value
    registration: tuple[str, ...] = ()
    server_info: str | None = None
    code: str | None = None
    sglang_code: str | None = None
    severity: Severity = "error"
    sglang_failure: str = ""
    example: bool = True  # the fix shows prefill's value as the one to copy

    def flag(self) -> str | None:
        if self.sglang_flag is not None:
            return self.sglang_flag
        return "--" + self.sglang.replace("_", "-") if self.sglang is not None else None

    def where(self) -> str:
        """Where the field is set, for the fix: the deployment key and the SGLang flag."""
        parts = []
        if self.deployment is not None:
            parts.append("deployment: " + ".".join(self.deployment))
        flag = self.flag()
        if flag is not None:
            parts.append("SGLang: " + flag)
        return "; ".join(parts)

    def fix_for(self, prefill: object = None) -> str:
        """The fix text every check prints for this field (prefill's value as the example to copy)."""
        example = f", e.g. {show(prefill)}" if self.example and prefill is not None else ""
        where = self.where()
        return f"{self.action}{example}" + (f" ({where})" if where else "")

    def difference(self, prefill: object, decode: object, *, field: str | None = None,
                   detail: str | None = None) -> Difference:
        """The row for a disagreement on this field (`field` names a registration leaf below it)."""
        if detail is None:
            detail = f"SGLang fails at {self.sglang_failure}" if self.sglang_failure else ""
        return Difference(field=field or self.name, prefill=prefill, decode=decode, fix=self.fix_for(prefill),
                          detail=detail)


_SAME_MODEL = "serve the same target model on both roles"

AGREEMENTS: tuple[Agreement, ...] = (
    Agreement("model_path", "target model", WRONG_OUTPUT, _SAME_MODEL, deployment=("model", "target"),
              sglang="model_path", registration=("model.weights_hash", "model.tokenizer", "model"),
              server_info="model_path", code="PD501"),
    Agreement("architecture", "layer layout", FIRST_TRANSFER,
              "serve the same model architecture and shapes on both roles", sglang_flag="--model-path",
              registration=("model.architecture", "model.layer_kinds", "model.shapes"),
              server_info="architecture", code="PD504", sglang_code="SGL201", example=False),
    Agreement("dtype", "dtype", FIRST_TRANSFER, "use one model dtype on both roles", deployment=("model", "dtype"),
              sglang="dtype", registration=("model.dtype",), server_info="dtype", code="PD502"),
    Agreement("page_size", "page size", FIRST_REQUEST, "use one page size on both roles",
              deployment=("cache", "page_size"), sglang="page_size", registration=("page_size",),
              server_info="page_size", code="PD503", sglang_code="SGL213",
              sglang_failure="decode's first request (Page size mismatch)"),
    Agreement("kv_cache_dtype", "KV-cache dtype", FIRST_REQUEST, "use one KV-cache dtype on both sides",
              sglang="kv_cache_dtype", server_info="kv_cache_dtype", sglang_code="SGL202",
              sglang_failure="decode's first request (KV cache dtype mismatch)"),
    Agreement("kv_item_lens", "KV item lengths", FIRST_TRANSFER,
              "the caches are laid out differently: use the same model, dtype and cache settings on both roles",
              registration=("kv_item_lens",), example=False),
    Agreement("kv_layout", "KV layout", FIRST_REQUEST, "use the same KV layout on both sides",
              sglang="dsv4_attn_backend", server_info="kv_layout", sglang_code="SGL210",
              sglang_failure="decode's first request (KV layout mismatch)"),
    Agreement("tp_size", "tensor parallel size", FIRST_TRANSFER, "run the same tensor parallelism on both sides",
              sglang="tp_size", server_info="tp_size"),
    Agreement("dp_size", "data parallel size", FIRST_TRANSFER, "run the same data parallelism on both sides",
              sglang="dp_size", server_info="dp_size"),
    Agreement("pp_size", "pipeline parallel size", FIRST_TRANSFER, "run the same pipeline parallelism on both sides",
              sglang="pp_size", server_info="pp_size"),
    Agreement("attn_tp_size", "attention TP size", FIRST_TRANSFER, "run the same attention TP on both sides",
              sglang_flag="--tp-size / --attn-dp-size / --attn-cp-size", server_info="attn_tp_size",
              sglang_code="SGL204", sglang_failure="the first KV transfer (head slicing)"),
    Agreement("decode_allocation_policy", "decode allocation policy", FIRST_REQUEST,
              "use one decode allocation policy on both sides", sglang="disaggregation_decode_allocation_policy",
              server_info="decode_allocation_policy", sglang_code="SGL209"),
    Agreement("transfer_backend", "transfer backend", FIRST_REQUEST, "use one transfer backend on both roles",
              deployment=("transfer", "backend"), sglang="disaggregation_transfer_backend",
              registration=("transfer_backend",), server_info="transfer_backend", code="PD508",
              sglang_code="SGL203"),
    Agreement("transfer_protocol", "transfer protocol", FIRST_REQUEST, "use one ZeroMQ transfer protocol on both roles",
              deployment=("transfer", "protocol"), code="PD508"),
    Agreement("speculative_algorithm", "speculative algorithm", FIRST_TRANSFER,
              "use the same speculative algorithm on both roles", deployment=("speculative", "algorithm"),
              sglang="speculative_algorithm", registration=("speculative_algorithm",),
              server_info="speculative_algorithm", sglang_code="SGL208"),
    Agreement("draft_model", "draft model", FIRST_TRANSFER,
              "give both roles the same draft model (prefill builds its prompt KV)",
              deployment=("speculative", "draft"), sglang="speculative_draft_model_path", registration=("draft",),
              server_info="draft_model",
              code="PD507", sglang_code="SGL208"),
    Agreement("num_steps", "speculative steps", FIRST_TRANSFER,
              "use the same speculative steps (and adaptive candidate steps) on both roles",
              deployment=("speculative", "num_steps"), sglang="speculative_num_steps",
              registration=("max_draft_tokens",), server_info="num_steps", sglang_code="SGL211"),
    Agreement("eagle_topk", "draft top-k", FIRST_TRANSFER, "use the same draft top-k on both roles",
              deployment=("speculative", "topk"), sglang="speculative_eagle_topk", server_info="eagle_topk",
              sglang_code="SGL211"),
    Agreement("num_draft_tokens", "draft tokens per verify", FIRST_TRANSFER,
              "use the same number of draft tokens on both roles", sglang="speculative_num_draft_tokens",
              server_info="num_draft_tokens", sglang_code="SGL211"),
    Agreement("adaptive", "adaptive speculation", WRONG_OUTPUT, "turn adaptive speculation on or off on both roles",
              deployment=("speculative", "adaptive"), sglang="speculative_adaptive", server_info="adaptive",
              sglang_code="SGL212", severity="warning", example=False),
    Agreement("adaptive_config", "adaptive config", WRONG_OUTPUT, "use the same adaptive config on both roles",
              sglang="speculative_adaptive_config", server_info="adaptive_config", sglang_code="SGL212",
              severity="warning", example=False),
    Agreement("disable_hybrid_swa_memory", "hybrid SWA memory", FIRST_TRANSFER,
              "use the same hybrid-memory flags on both sides", sglang="disable_hybrid_swa_memory",
              server_info="disable_hybrid_swa_memory", sglang_code="SGL206"),
    Agreement("mamba_full_memory_ratio", "Mamba memory ratio", FIRST_TRANSFER,
              "use the same hybrid-memory flags on both sides", sglang="mamba_full_memory_ratio",
              server_info="mamba_full_memory_ratio", sglang_code="SGL206"),
    Agreement("mamba_ssm_dtype", "Mamba SSM dtype", FIRST_TRANSFER, "use one Mamba SSM dtype on both sides",
              sglang="mamba_ssm_dtype", server_info="mamba_ssm_dtype", sglang_code="SGL205",
              sglang_failure="the first KV transfer (Mamba slot size mismatch)"),
    Agreement("swa_full_tokens_ratio", "SWA memory ratio", FIRST_TRANSFER,
              "use the same hybrid-memory flags on both sides", sglang="swa_full_tokens_ratio",
              server_info="swa_full_tokens_ratio", sglang_code="SGL206"),
    Agreement("state_types", "state_types", FIRST_TRANSFER,
              "carry the same ordered state components on both roles (omit cache.state_types: it is derived "
              "from the model)", deployment=("cache", "state_types"),
              sglang_flag="--model-path / --kv-cache-dtype / --disable-hybrid-swa-memory",
              registration=("state_types",), server_info="state_types", code="PD505", sglang_code="SGL207",
              sglang_failure="the first KV transfer (state component count mismatch / kv_args.state_types is "
                             "empty)"),
    Agreement("state_item_lens", "state item sizes", FIRST_TRANSFER, "serve the same model on both roles",
              registration=("state_item_lens", "state_dims"), code="PD506", example=False),
    Agreement("engine", "engine", HANDSHAKE, "run the same engine on both sides", server_info="engine"),
    Agreement("version", "version", HANDSHAKE, "run the same SGLang (or specctl) version on both sides",
              registration=("protocol_version", "engine_version"), server_info="version"),
)

def agreement(name: str) -> Agreement:
    """The row named `name` (KeyError names the rows)."""
    for a in AGREEMENTS:
        if a.name == name:
            return a
    raise KeyError(f"no agreement row {name!r}; rows: {', '.join(a.name for a in AGREEMENTS)}")


def deployment_rows() -> tuple[Agreement, ...]:
    """Rows a deployment sets and the static rules report (`code`), in table order."""
    return tuple(a for a in AGREEMENTS if a.deployment is not None and a.code is not None)


def server_info_fields() -> tuple[str, ...]:
    """The `ServerFacts` fields the live preflight compares, in table order."""
    return tuple(a.server_info for a in AGREEMENTS if a.server_info is not None)


def registration_row(path: str) -> Agreement | None:
    """The row a registration leaf (`model.dtype`, `draft.page_size`) belongs to: the longest prefix."""
    best: tuple[int, Agreement] | None = None
    for a in AGREEMENTS:
        for prefix in a.registration:
            if (path == prefix or path.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), a)
    return best[1] if best is not None else None


def compare_values(value_of: Callable[[Agreement, str], tuple[object, object]],
                   locator: Callable[[Agreement], str | None], *,
                   skip: Callable[[Agreement, object, object], bool] = lambda a, p, d: False) -> list[Difference]:
    """A `Difference` for each row whose two values (`value_of(row, locator(row))`) differ, in table order;
    rows without a locator, and rows `skip` excuses, are passed over. The table is read at call time."""
    out: list[Difference] = []
    for a in AGREEMENTS:
        key = locator(a)
        if key is None:
            continue
        p, d = value_of(a, key)
        if p != d and not skip(a, p, d):
            out.append(a.difference(p, d))
    return out
