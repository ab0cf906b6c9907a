"""Registration info: what one PD process tells its peer in the handshake, and the itemized diff.

A `RegistrationInfo` holds every fact prefill and decode must agree on before a single request
crosses the wire (exchanged in the handshake): protocol and engine
version, role, the target model's fingerprint, page size, per-buffer KV item lengths, the ordered
`state_types` with per-component item lengths and dims, the draft model's fingerprint and KV layout
(or none), the speculative algorithm and the largest draft-token count, the transfer backend and the
endpoints where this process receives.

`compare(prefill, decode)` returns one `Difference(field, prefill, decode, fix)` for every field that
differs — all of them, not the first — so a refused decode prints the whole diff. Which row of the
agreement table (`specctl.schemas.pd_agreement`) a field belongs to, and so its fix, is the table's. Both
sides derive the info from their live `ModelRunner.layout()` (a `CacheLayout`, never from the config alone), so what
is compared is what the caches really hold.

Torch-free: it travels inside handshake messages and `specctl validate` may reuse the comparison.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from specctl.engine.pd.wire import PROTOCOL_VERSION
from specctl.schemas.pd_agreement import Difference, agreement, registration_row

if TYPE_CHECKING:
    from specctl.engine.cache_layout import CacheLayout
    from specctl.schemas.model_facts import ModelFacts
    from specctl.schemas.role_config import SpeculativeConfig

ROLES = ("prefill", "decode")
BACKENDS = ("zmq", "shm")
_STATE_LAYER_KINDS = ("mamba", "swa")


class ModelFingerprint(msgspec.Struct, frozen=True, kw_only=True):
    """Identity of a model as loaded: two processes with equal fingerprints compute the same thing."""

    architecture: str
    layer_kinds: tuple[str, ...]
    shapes: dict[str, int]  # vocab_size, hidden_size, num_layers, heads, kv_heads, head_dim, sliding_window
    dtype: str
    tokenizer: str
    weights_hash: str


class DraftInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The draft model whose KV crosses the wire with each request, and that KV's layout."""

    model: ModelFingerprint
    page_size: int
    kv_item_lens: tuple[int, ...]
    state_types: tuple[str, ...] = ()
    state_item_lens: tuple[int, ...] = ()
    state_dims: tuple[tuple[int, ...], ...] = ()


class RegistrationInfo(msgspec.Struct, frozen=True, kw_only=True):
    protocol_version: int
    engine_version: str
    role: str
    model: ModelFingerprint
    page_size: int
    kv_item_lens: tuple[int, ...]  # bytes of one token's entry, per full-attention KV buffer
    state_types: tuple[str, ...]  # ordered state components, e.g. ("mamba", "swa")
    state_item_lens: tuple[int, ...]  # bytes of one item, per state component
    state_dims: tuple[tuple[int, ...], ...]  # shape of one item, per state component
    draft: DraftInfo | None  # the draft whose KV this side produces (prefill) or consumes (decode)
    speculative_algorithm: str  # none | draft | ngram
    max_draft_tokens: int  # largest draft-token count (steps + 1) this side can run; 0 without speculation
    transfer_backend: str  # zmq | shm
    endpoints: dict[str, str]  # where this process receives transfers, e.g. {"transfer": "tcp://..."}
    host: str  # hostname; shm and ipc only work between processes on one host

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = msgspec.to_builtins(self)
        return doc

    def fingerprint(self) -> str:
        """Short hash of everything the peers must agree on (not role, endpoints or host): equal
        fingerprints on prefill and decode mean a compatible pair. Shown in /server_info and bench."""
        doc = self.to_json()
        for k in ("role", "endpoints", "host"):
            doc.pop(k, None)
        blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# --------------------------------------------------------------------------------------------- building


def _engine_version() -> str:
    from specctl import __version__

    return __version__


def max_draft_tokens(speculative: SpeculativeConfig | None) -> int:
    """Largest number of draft tokens one verify can carry: (largest selectable steps) + 1, where the
    selectable steps are the initial `num_steps` and every adaptive candidate; 0 without speculation."""
    if speculative is None or speculative.algorithm == "none":
        return 0
    top = max(speculative.selectable_steps())
    return top + 1 if top > 0 else 0


def _shapes(layout: CacheLayout, facts: ModelFacts | None) -> dict[str, int]:
    shapes = dict(layout.shapes)
    if facts is not None:
        shapes.setdefault("vocab_size", int(facts.vocab_size))
        shapes.setdefault("hidden_size", int(facts.hidden_size))
        shapes.setdefault("num_layers", int(facts.num_layers))
        shapes.setdefault("num_attention_heads", int(facts.num_attention_heads))
        shapes.setdefault("num_key_value_heads", int(facts.num_key_value_heads))
        shapes.setdefault("head_dim", int(facts.head_dim))
        shapes.setdefault("sliding_window", int(facts.sliding_window or 0))
    if layout.vocab_size:
        shapes.setdefault("vocab_size", layout.vocab_size)
    return shapes


def tokenizer_fingerprint(facts: ModelFacts | None, layout: CacheLayout | None = None) -> str:
    """ "bytes" for the builtin byte tokenizer, else a hash of tokenizer.json (or "unknown")."""
    if layout is not None and layout.tokenizer:
        return layout.tokenizer
    if facts is None:
        return "unknown"
    if facts.config.get("tokenizer") == "bytes":
        return "bytes"
    from specctl.schemas.model_facts import resolve_model_dir

    path = resolve_model_dir(facts.ref) / "tokenizer.json"
    try:
        return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return "unknown"


def model_fingerprint(layout: CacheLayout, facts: ModelFacts | None = None) -> ModelFingerprint:
    """Fingerprint from a `ModelRunner.layout()` (plus `ModelFacts` for shapes and tokenizer)."""
    return ModelFingerprint(
        architecture=layout.architecture or (facts.architecture if facts else "?"),
        layer_kinds=layout.layer_kinds or (tuple(facts.layer_kinds) if facts else ()),
        shapes=_shapes(layout, facts),
        dtype=layout.dtype.removeprefix("torch."),
        tokenizer=tokenizer_fingerprint(facts, layout),
        weights_hash=layout.weights_hash,
    )


def build_registration(
    role: str,
    layout: CacheLayout,
    *,
    speculative: SpeculativeConfig | None = None,
    draft_layout: CacheLayout | None = None,
    transfer_backend: str = "zmq",
    endpoints: Mapping[str, str] | None = None,
    facts: ModelFacts | None = None,
    draft_facts: ModelFacts | None = None,
    host: str | None = None,
) -> RegistrationInfo:
    """RegistrationInfo of one process from its runner's `layout()` and its speculative settings.

    `draft_layout` is the draft runner's layout() when this side produces (prefill) or consumes
    (decode) draft KV, i.e. when `speculative.algorithm == "draft"`; None otherwise.
    """
    draft = None
    if draft_layout is not None:
        draft = DraftInfo(
            model=model_fingerprint(draft_layout, draft_facts),
            page_size=draft_layout.page_size,
            kv_item_lens=draft_layout.kv_item_lens,
            state_types=draft_layout.state_types,
            state_item_lens=draft_layout.state_item_lens,
            state_dims=draft_layout.state_dims,
        )
    return RegistrationInfo(
        protocol_version=PROTOCOL_VERSION,
        engine_version=_engine_version(),
        role=role,
        model=model_fingerprint(layout, facts),
        page_size=layout.page_size,
        kv_item_lens=layout.kv_item_lens,
        state_types=layout.state_types,
        state_item_lens=layout.state_item_lens,
        state_dims=layout.state_dims,
        draft=draft,
        speculative_algorithm=speculative.algorithm if speculative is not None else "none",
        max_draft_tokens=max_draft_tokens(speculative),
        transfer_backend=transfer_backend,
        endpoints=dict(endpoints or {}),
        host=host or socket.gethostname(),
    )


# --------------------------------------------------------------------------------------------- comparing


def _diff(path: str, p: Any, d: Any, out: list[Difference]) -> None:
    """Recursive, leaf-level diff of builtins; every differing leaf is one row, fixed by its table row."""
    if isinstance(p, dict) and isinstance(d, dict):
        for key in list(p) + [k for k in d if k not in p]:
            _diff(f"{path}.{key}", p.get(key), d.get(key), out)
        return
    if p != d:
        row = registration_row(path)
        if row is None:
            raise KeyError(f"registration field {path} has no row in the agreement table")
        out.append(row.difference(p, d, field=path, detail=""))


def _state_types_mismatch(prefill: RegistrationInfo, decode: RegistrationInfo) -> Difference:
    p, d = list(prefill.state_types), list(decode.state_types)
    hybrid = [k for k in _STATE_LAYER_KINDS if k in decode.model.layer_kinds]
    if not d and hybrid:
        detail = (
            f"decode declares no state_types but its model has {'/'.join(hybrid)} layers: their state "
            "would never reach decode (SGLang: 'kv_args.state_types is empty but state_indices were provided')"
        )
    elif sorted(p) == sorted(d):
        detail = f"same components in a different order ({p} vs {d}): state would land in the wrong buffers"
    else:
        detail = f"state component count/kinds differ (prefill={len(p)}, decode={len(d)})"
    return agreement("state_types").difference(p, d, detail=detail)


def _draft_mismatches(prefill: RegistrationInfo, decode: RegistrationInfo, out: list[Difference]) -> None:
    p, d = prefill.draft, decode.draft
    if p is None and d is None:
        return
    if p is None:
        assert d is not None
        out.append(agreement("draft_model").difference(
            None, d.model.architecture + f" ({d.model.weights_hash or 'no hash'})", field="draft",
            detail="decode speculates with a draft model whose KV prefill does not produce"))
        return
    if d is None:
        out.append(agreement("draft_model").difference(
            p.model.architecture + f" ({p.model.weights_hash or 'no hash'})", None, field="draft",
            detail="prefill sends draft KV that decode has no buffers for"))
        return
    _diff("draft", msgspec.to_builtins(p), msgspec.to_builtins(d), out)


def _endpoint_mismatches(prefill: RegistrationInfo, decode: RegistrationInfo, out: list[Difference]) -> None:
    ep = decode.endpoints.get("transfer", "")
    scheme = ep.split("://", 1)[0] if "://" in ep else ""
    if scheme not in ("tcp", "ipc"):
        out.append(
            Difference(
                field="endpoints.transfer",
                prefill="tcp://... or ipc://...",
                decode=ep or None,
                fix="decode must advertise the tcp:// or ipc:// endpoint it receives transfers on",
            )
        )
    needs_host = decode.transfer_backend == "shm" or scheme == "ipc"
    if needs_host and prefill.host != decode.host:
        out.append(
            Difference(
                field="host",
                prefill=prefill.host,
                decode=decode.host,
                fix="shm and ipc transfers need both processes on one host: use transfer.backend zmq over tcp",
            )
        )


def compare(prefill: RegistrationInfo, decode: RegistrationInfo) -> list[Difference]:
    """Every field on which `decode` cannot pair with `prefill`; empty means compatible."""
    out: list[Difference] = []
    if prefill.protocol_version != decode.protocol_version:
        _diff("protocol_version", prefill.protocol_version, decode.protocol_version, out)
    if prefill.engine_version != decode.engine_version:
        _diff("engine_version", prefill.engine_version, decode.engine_version, out)
    if decode.role != "decode":
        out.append(
            Difference(
                field="role",
                prefill="decode",
                decode=decode.role,
                fix="only a process started with --role decode may register with prefill's bootstrap endpoint",
                detail=f"prefill ({prefill.role}) pairs with a decode peer; this peer says it is {decode.role!r}",
            )
        )
    _diff("model", msgspec.to_builtins(prefill.model), msgspec.to_builtins(decode.model), out)
    _diff("page_size", prefill.page_size, decode.page_size, out)
    _diff("kv_item_lens", list(prefill.kv_item_lens), list(decode.kv_item_lens), out)
    if prefill.state_types != decode.state_types:
        out.append(_state_types_mismatch(prefill, decode))
    else:
        _diff("state_item_lens", list(prefill.state_item_lens), list(decode.state_item_lens), out)
        _diff("state_dims", [list(x) for x in prefill.state_dims], [list(x) for x in decode.state_dims], out)
    _draft_mismatches(prefill, decode, out)
    _diff("speculative_algorithm", prefill.speculative_algorithm, decode.speculative_algorithm, out)
    _diff("max_draft_tokens", prefill.max_draft_tokens, decode.max_draft_tokens, out)
    _diff("transfer_backend", prefill.transfer_backend, decode.transfer_backend, out)
    _endpoint_mismatches(prefill, decode, out)
    return out


WITHHELD_FIX = ("make this field equal on both roles (prefill's value is withheld from a peer that proved no shared "
                "secret: read it from prefill's deployment, or set transfer.secret_env on both roles)")


def withheld(mismatches: list[Difference]) -> list[Difference]:
    """The mismatches as a peer that proved no shared secret may see them: the differing fields and the peer's
    own values, never prefill's (they would tell a stranger what to claim)."""
    return [Difference(field=m.field, prefill=None, decode=m.decode, fix=WITHHELD_FIX) for m in mismatches]


def _short(v: Any, width: int = 28) -> str:
    s = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    return s if len(s) <= width else s[: width - 1] + "…"


def render_mismatches(mismatches: list[Difference]) -> str:
    """Plain-text table: field | prefill | decode | fix (details indented under their row)."""
    rows = [("field", "prefill", "decode", "fix")]
    rows += [(m.field, _short(m.prefill), _short(m.decode), m.fix) for m in mismatches]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, r in enumerate(rows):
        lines.append(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}")
        if i == 0:
            lines.append("-" * min(120, sum(w) + 6 + len(r[3])))
        elif mismatches[i - 1].detail:
            lines.append(" " * (w[0] + 2) + "↳ " + mismatches[i - 1].detail)
    return "\n".join(lines)
