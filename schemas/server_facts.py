"""ServerFacts: what one running server will do, normalised from whatever shape it describes itself in.

Two shapes are read (the shape is recognised by content, never configured):

- **SGLang 0.5.23**: `GET /server_info` is every resolved server argument, flat
  (`model_path`, `dtype`, `page_size`, `kv_cache_dtype`, `tp_size`, `disaggregation_mode`,
  `speculative_algorithm`, ...), plus `internal_states` (one dict per DP rank) and `version`;
  `GET /model_info` adds `architectures`; prefill's bootstrap `GET /route?...=-1` adds what decode
  would learn only at its first request (`page_size`, `kv_cache_dtype`, `kv_layout`,
  `attn_tp_size`, `decode_allocation_policy` ...).
- **specctl today**: `/server_info` carries `role`, `resolved_role` (the merged deployment role),
  `fingerprints` and, on PD roles, `registration` (the handshake's RegistrationInfo). When
  specctl's servers move to SGLang's shape their extra keys (`registration`, `fingerprints`) are
  still read on top of it.

Values are normalised so the two engines compare: speculative algorithm names in specctl's
vocabulary (`none`, `draft` for SGLang's STANDALONE, `ngram`, `eagle`, ...), `kv_cache_dtype`
`auto` resolved to the model dtype, `torch.` prefixes dropped, paths without a trailing slash.
`state_types` is what the server reports (specctl's registration) or else predicted from the
model's `config.json` by `specctl.schemas.model_facts` and the resolved hybrid-memory flags.
A field a server cannot express (`kv_layout` on specctl, hybrid-memory flags) is None.

`compare_pair(prefill, decode)` is the pair's diff over the agreement table (`PAIR_FIELDS`, all of them,
not the first), plus a row when a server answers in the wrong PD role: the live preflight diffs two
running servers with it, and the SGLang pair rules two commands' predicted resolutions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

from specctl.errors import SpecctlError, UsageError
from specctl.schemas.loader import read_text
from specctl.schemas.model_facts import load_model_facts, model_available, resolve_model_dir
from specctl.schemas.pd_agreement import Agreement, Difference, agreement, compare_values, server_info_fields
from specctl.schemas.server_info import Key as K
from specctl.schemas.server_info import sglang_accept_lengths

JsonDoc = Mapping[str, object]

# The fields two servers of one PD pair must agree on, in report order: the agreement table's.
PAIR_FIELDS = server_info_fields()

# SGLang's `--speculative-algorithm` choices in specctl's words; unknown names are lowercased.
_SGLANG_ALGORITHMS = {"STANDALONE": "draft", "NGRAM": "ngram", "EAGLE": "eagle", "EAGLE3": "eagle3",
                      "NEXTN": "eagle"}


@dataclass(frozen=True)
class ServerFacts:
    """One server, normalised. Every field may be None where the server does not say."""

    url: str
    shape: str  # "sglang" | "specctl"
    role: str | None  # prefill | decode | colocated
    engine: str | None  # sglang | specctl
    version: str | None
    model_path: str | None
    architecture: str | None
    dtype: str | None
    kv_cache_dtype: str | None
    page_size: int | None
    kv_layout: str | None
    tp_size: int | None
    dp_size: int | None
    pp_size: int | None
    attn_tp_size: int | None
    decode_allocation_policy: str | None
    transfer_backend: str | None
    speculative_algorithm: str | None
    draft_model: str | None
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None
    adaptive: bool | None
    adaptive_config: str | None  # canonical JSON of the config, or its path when unreadable here
    disable_hybrid_swa_memory: bool | None
    mamba_full_memory_ratio: float | None
    mamba_ssm_dtype: str | None
    swa_full_tokens_ratio: float | None
    state_types: tuple[str, ...] | None
    state_types_source: str | None  # "reported" | "predicted"
    max_running_requests: int | None
    bootstrap_port: int | None
    reported_fingerprint: str | None  # specctl's registration fingerprint, when the server has one
    accept_length: float | None  # server-wide, for the record; never compared
    notes: tuple[str, ...] = field(default=())

    def value(self, name: str) -> object:
        return getattr(self, name)

    def fingerprint(self) -> str:
        """Short hash of every pair field: two servers with equal fingerprints passed the same checks."""
        doc = {name: _jsonable(getattr(self, name)) for name in PAIR_FIELDS}
        blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {k: _jsonable(v) for k, v in asdict(self).items()}
        out["fingerprint"] = self.fingerprint()
        return out


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


# ------------------------------------------------------------------------------------------ readers


def _at(doc: object, *keys: str) -> object:
    node = doc
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _str(value: object) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value)
    return text if text and text != "None" else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _first(*values: object) -> object:
    for v in values:
        if v is not None:
            return v
    return None


def _dtype(value: object) -> str | None:
    text = _str(value)
    return text.removeprefix("torch.") if text is not None else None


def _path(value: object) -> str | None:
    text = _str(value)
    if text is None:
        return None
    return text.rstrip("/") or text


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _state_types(value: object) -> tuple[str, ...] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(str(v) for v in value)
    return None


def predict_state_types(model_path: str | None, *, disable_hybrid_swa_memory: bool | None) -> \
        tuple[tuple[str, ...] | None, str | None]:
    """(state_types, why-not) predicted from the model's config.json (readable on this host) and the
    resolved flags, by the same `specctl.schemas.model_facts` that validate uses. SGLang backs
    sliding-window layers with full-attention KV under `--disable-hybrid-swa-memory`, so `swa` is
    not a state component then."""
    if model_path is None:
        return None, "the server reports no model path"
    if not model_available(model_path):
        return None, f"state_types not predicted: {model_path}/config.json is not readable on this host"
    try:
        facts = load_model_facts(model_path)
    except SpecctlError as exc:
        return None, f"state_types not predicted: {exc}"
    types = facts.state_types
    if disable_hybrid_swa_memory:
        types = tuple(t for t in types if t != "swa")
    return types, None


def _reported_or_predicted(reported: tuple[str, ...] | None, model_path: str | None, no_swa: bool | None,
                           notes: list[str]) -> tuple[tuple[str, ...] | None, str | None]:
    """(state_types, "reported" | "predicted" | None): the server's own list, else the model's prediction
    (why not, appended to `notes`)."""
    if reported is not None:
        return reported, "reported"
    types, why = predict_state_types(model_path, disable_hybrid_swa_memory=no_swa)
    if why:
        notes.append(why)
    return types, ("predicted" if types is not None else None)


# ------------------------------------------------------------------------------------------ shapes


def shape_of(server_info: JsonDoc) -> str:
    """"sglang" when the document has SGLang's flat resolved arguments, else "specctl"."""
    if K.MODEL_PATH in server_info and (K.INTERNAL_STATES in server_info or K.DISAGGREGATION_MODE in server_info):
        return "sglang"
    if K.RESOLVED_ROLE in server_info or K.REGISTRATION in server_info or K.FINGERPRINTS in server_info:
        return "specctl"
    return "unknown"


def normalise(url: str, server_info: JsonDoc, model_info: JsonDoc | None = None,
              route: JsonDoc | None = None) -> ServerFacts:
    """ServerFacts from one server's documents (any of SGLang's or specctl's shape).

    Raises ValueError when `server_info` is neither shape (the caller turns it into a clear error)."""
    shape = shape_of(server_info)
    if shape == "sglang":
        return _from_sglang(url, server_info, model_info or {}, route)
    if shape == "specctl":
        return _from_specctl(url, server_info, model_info or {}, route)
    keys = ", ".join(sorted(server_info)[:8]) or "none"
    raise ValueError(f"its /server_info is neither SGLang's nor specctl's (top-level keys: {keys})")


def _adaptive_config_sglang(info: JsonDoc) -> str | None:
    path = _str(info.get(K.ADAPTIVE_CONFIG))
    if path is None:
        return None
    try:
        # A path readable here (same host, shared filesystem): compare contents, not spellings. The path
        # comes from the server: read_text refuses FIFOs, devices and huge files instead of hanging on them.
        return canonical_json(json.loads(read_text(path)))
    except (UsageError, ValueError, RecursionError):  # RecursionError: JSON nested too deep to parse
        return path


def _accept_length(info: JsonDoc) -> float | None:
    values = sglang_accept_lengths(info)  # SGLang's internal_states, one entry per DP rank: their mean
    if values:
        return sum(values) / len(values)
    return _float(_first(info.get(K.AVG_SPEC_ACCEPT_LENGTH), _at(info, K.ADAPTIVE_STATE, K.MEAN_TOKENS_PER_VERIFY)))


def _from_sglang(url: str, info: JsonDoc, model_info: JsonDoc, route: JsonDoc | None) -> ServerFacts:
    r: JsonDoc = route or {}
    notes: list[str] = []
    mode = _str(info.get(K.DISAGGREGATION_MODE))
    role = "colocated" if mode in (None, "null") else mode
    dtype = _dtype(info.get(K.DTYPE))
    kv_dtype = _dtype(_first(r.get(K.KV_CACHE_DTYPE), info.get(K.KV_CACHE_DTYPE)))
    if kv_dtype in (None, "auto"):
        kv_dtype = dtype  # SGLang: `auto` = the model's dtype
    algorithm_raw = _str(info.get(K.SPECULATIVE_ALGORITHM))
    algorithm = "none" if algorithm_raw is None else _SGLANG_ALGORITHMS.get(algorithm_raw.upper(),
                                                                            algorithm_raw.lower())
    tp = _int(info.get(K.TP_SIZE))
    attn_dp = _int(info.get(K.ATTN_DP_SIZE))
    if attn_dp is None:
        attn_dp = _int(info.get(K.DP_SIZE)) if info.get(K.ENABLE_DP_ATTENTION) else 1
    attn_cp = _int(info.get(K.ATTN_CP_SIZE)) or 1
    attn_tp = _int(_first(r.get(K.ATTN_TP_SIZE), info.get(K.ATTN_TP_SIZE)))
    if attn_tp is None and tp is not None and attn_dp:
        attn_tp = max(1, tp // attn_dp // attn_cp)
    adaptive = _bool(info.get(K.ADAPTIVE))
    if adaptive is None and algorithm != "none":
        adaptive = False
    # SGLang ignores --speculative-adaptive-config without --speculative-adaptive.
    adaptive_config = _adaptive_config_sglang(info) if adaptive and algorithm != "none" else None
    no_swa = _bool(info.get(K.DISABLE_HYBRID_SWA_MEMORY))
    model_path = _path(info.get(K.MODEL_PATH))
    state_types, source = _reported_or_predicted(
        _state_types(_first(info.get(K.STATE_TYPES), _at(info, K.REGISTRATION, K.STATE_TYPES))), model_path,
        no_swa, notes)
    archs = model_info.get(K.ARCHITECTURES)
    architecture = _str(archs[0]) if isinstance(archs, list) and archs else _str(model_info.get(K.MODEL_TYPE))
    return ServerFacts(
        url=url, shape="sglang", role=role, engine=_engine_of(info),
        version=_str(info.get(K.VERSION)), model_path=model_path, architecture=architecture,
        dtype=dtype, kv_cache_dtype=kv_dtype, page_size=_int(_first(r.get(K.PAGE_SIZE), info.get(K.PAGE_SIZE))),
        kv_layout=_str(_first(r.get(K.KV_LAYOUT), info.get(K.KV_LAYOUT))),
        tp_size=tp, dp_size=_int(info.get(K.DP_SIZE)), pp_size=_int(_first(r.get(K.PP_SIZE), info.get(K.PP_SIZE))),
        attn_tp_size=attn_tp,
        decode_allocation_policy=_str(_first(r.get(K.ROUTE_ALLOCATION_POLICY),
                                             info.get(K.ALLOCATION_POLICY))),
        transfer_backend=_str(info.get(K.TRANSFER_BACKEND)),
        speculative_algorithm=algorithm,
        draft_model=_path(info.get(K.DRAFT_MODEL_PATH)) if algorithm != "none" else None,
        num_steps=_int(info.get(K.NUM_STEPS)) if algorithm != "none" else None,
        eagle_topk=_int(info.get(K.EAGLE_TOPK)) if algorithm != "none" else None,
        num_draft_tokens=_int(info.get(K.NUM_DRAFT_TOKENS)) if algorithm != "none" else None,
        adaptive=adaptive if algorithm != "none" else None, adaptive_config=adaptive_config,
        disable_hybrid_swa_memory=no_swa, mamba_full_memory_ratio=_float(info.get(K.MAMBA_FULL_MEMORY_RATIO)),
        mamba_ssm_dtype=_dtype(info.get(K.MAMBA_SSM_DTYPE)),
        swa_full_tokens_ratio=_float(info.get(K.SWA_FULL_TOKENS_RATIO)),
        state_types=state_types, state_types_source=source,
        max_running_requests=_int(info.get(K.MAX_RUNNING_REQUESTS)),
        bootstrap_port=_int(info.get(K.BOOTSTRAP_PORT)),
        reported_fingerprint=_str(_at(info, K.FINGERPRINTS, K.REGISTRATION)),
        accept_length=_accept_length(info), notes=tuple(notes),
    )


def _from_specctl(url: str, info: JsonDoc, model_info: JsonDoc, route: JsonDoc | None) -> ServerFacts:
    role_cfg = info.get(K.RESOLVED_ROLE)
    cfg: JsonDoc = role_cfg if isinstance(role_cfg, Mapping) else {}
    reg_doc = info.get(K.REGISTRATION)
    reg: JsonDoc = reg_doc if isinstance(reg_doc, Mapping) else {}
    target_fp = _at(info, K.FINGERPRINTS, "target")
    fp: JsonDoc = target_fp if isinstance(target_fp, Mapping) else {}
    r: JsonDoc = route or {}
    spec = cfg.get("speculative")
    s: JsonDoc = spec if isinstance(spec, Mapping) else {}
    algorithm = _str(_first(s.get("algorithm"), reg.get("speculative_algorithm"))) or "none"
    speculating = algorithm != "none"
    steps = _int(s.get("num_steps")) if speculating else None
    adaptive_cfg = s.get("adaptive")
    dtype = _dtype(_first(_at(cfg, "model", "dtype"), _at(reg, "model", "dtype"), fp.get("dtype")))
    notes: list[str] = []
    model_path = _path(_first(_at(cfg, "model", "target"), model_info.get(K.MODEL_PATH)))
    state_types, source = _reported_or_predicted(
        _state_types(_first(reg.get("state_types"), fp.get("state_types"))), model_path, None, notes)
    fingerprints = info.get(K.FINGERPRINTS)
    reg_fp = _str(_at(fingerprints, K.REGISTRATION)) if isinstance(fingerprints, Mapping) else None
    role = _str(info.get(K.ROLE))
    return ServerFacts(
        url=url, shape="specctl", role=role, engine="specctl",
        version=_str(_first(reg.get("engine_version"), info.get(K.SPECCTL_VERSION), info.get(K.VERSION))),
        model_path=model_path,
        architecture=_str(_first(_at(reg, "model", "architecture"), fp.get("architecture"))),
        dtype=dtype,
        # specctl's KV cache is held in the model dtype.
        kv_cache_dtype=_dtype(_first(r.get(K.KV_CACHE_DTYPE), dtype)),
        page_size=_int(_first(r.get(K.PAGE_SIZE), reg.get("page_size"), _at(cfg, "cache", "page_size"),
                              fp.get("page_size"), _at(info, K.ENGINE, K.PAGE_SIZE))),
        kv_layout=_str(r.get(K.KV_LAYOUT)),
        # specctl's engine runs one process per role: no tensor, data or pipeline parallelism.
        tp_size=1, dp_size=1, pp_size=1, attn_tp_size=1,
        decode_allocation_policy=_str(r.get(K.ROUTE_ALLOCATION_POLICY)),
        transfer_backend=_str(_first(reg.get("transfer_backend"), _at(cfg, "transfer", "backend"))),
        speculative_algorithm=algorithm,
        draft_model=_path(s.get("draft")) if algorithm == "draft" else None,
        num_steps=steps,
        eagle_topk=_int(s.get("topk")) if speculating else None,
        num_draft_tokens=steps + 1 if steps is not None else None,
        adaptive=isinstance(adaptive_cfg, Mapping) if speculating else None,
        adaptive_config=canonical_json(adaptive_cfg) if speculating and isinstance(adaptive_cfg, Mapping) else None,
        disable_hybrid_swa_memory=None, mamba_full_memory_ratio=None, mamba_ssm_dtype=None,
        swa_full_tokens_ratio=None,
        state_types=state_types, state_types_source=source,
        max_running_requests=_int(_at(cfg, "serve", "max_batch_size")),
        bootstrap_port=_int(cfg.get("bootstrap_port")),
        reported_fingerprint=reg_fp, accept_length=_accept_length(info), notes=tuple(notes),
    )


def expected_facts(role: JsonDoc, *, url: str = "deployment") -> ServerFacts:
    """The facts a deployment role asks for (a `Deployment.role(name).to_json()` dict), in the same vocabulary,
    so a running server compares against it field by field. Fields the deployment does not pin are None."""
    info = {K.ROLE: role.get("name"), K.RESOLVED_ROLE: role}
    facts = _from_specctl(url, info, {}, None)
    declared = _state_types(_at(role, "cache", "state_types"))
    # Not asked for by a deployment file: the engine decides these.
    return replace(facts, version=None, engine=None, architecture=None, tp_size=None, dp_size=None,
                   pp_size=None, attn_tp_size=None, notes=(),
                   state_types=declared if declared is not None else facts.state_types)


def _engine_of(info: JsonDoc) -> str:
    """specctl's servers answer in SGLang's shape too; their registration fingerprint tells them apart."""
    return _str(info.get(K.ENGINE)) or ("specctl" if K.FINGERPRINTS in info else "sglang")


# ------------------------------------------------------------------------------------------ pairs

# Fields compared only when both sides report them (SGLang skips its own check on None).
_WHEN_BOTH_KNOWN = frozenset({"kv_layout", "decode_allocation_policy", "state_types", "version"})
# Model references compared as directories (`builtin:tiny-hybrid` is its package directory).
MODEL_PATH_FIELDS = frozenset({"model_path", "draft_model"})
# Where the fields outside the agreement table are set, for their fixes.
_WHERE = {"max_running_requests": "deployment: serve.max_batch_size; SGLang: --max-running-requests",
          "role": "deployment: roles; SGLang: --disaggregation-mode"}


def fix_text(name: str, what: str) -> str:
    """`what` to do about field `name`, with where it is set (the agreement table's locators)."""
    where = _WHERE[name] if name in _WHERE else agreement(name).where()
    return f"{what} ({where})" if where else what


def compare_pair(prefill: ServerFacts, decode: ServerFacts) -> list[Difference]:
    """Every field on which prefill and decode disagree, in the agreement table's order."""
    rows: list[Difference] = []
    for side, facts, wrong in (("prefill", prefill, "decode"), ("decode", decode, "prefill")):
        if facts.role == wrong:
            rows.append(Difference(
                field="role", prefill=prefill.role, decode=decode.role,
                fix=fix_text("role", f"point --{side} at a server started with --disaggregation-mode {side}"),
                detail=f"{facts.url} is a {wrong} server"))

    def excused(a: Agreement, p: object, d: object) -> bool:
        if a.name in _WHEN_BOTH_KNOWN and (p is None or d is None):
            return True
        return a.name in MODEL_PATH_FIELDS and isinstance(p, str) and isinstance(d, str) and same_model(p, d)

    rows += compare_values(lambda a, key: (prefill.value(key), decode.value(key)), lambda a: a.server_info,
                           skip=excused)
    return rows


def same_model(want: str, got: str) -> bool:
    """The same model directory, spelled differently (a `builtin:` name, `~`, a relative path)."""
    try:
        return resolve_model_dir(want).resolve() == resolve_model_dir(got).resolve()
    except (OSError, SpecctlError):
        return False
