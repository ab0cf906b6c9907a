"""Handshake matrix: a decode that differs from prefill in exactly one registration field is refused
with exactly that field in the diff, both by `compare()` and over a real bootstrap socket."""

from __future__ import annotations

import math

import msgspec
import pytest

from specctl.engine.cache_layout import CacheLayout
from specctl.engine.pd.bootstrap import BootstrapServer, HandshakeRejected, register
from specctl.engine.pd.registration import (
    RegistrationInfo,
    build_registration,
    compare,
    max_draft_tokens,
    render_mismatches,
)
from specctl.errors import RuntimeFailure
from specctl.schemas.model_facts import load_model_facts
from specctl.schemas.role_config import SpeculativeConfig

SPEC = SpeculativeConfig.from_json({
    "algorithm": "draft",
    "draft": "builtin:tiny-draft",
    "num_steps": 3,
    "adaptive": {"buckets": {"1": {"candidate_steps": [1, 3, 5, 7]}, "8": {"candidate_steps": [0, 1, 3]}}},
})


def _layout(facts, *, weights: str) -> CacheLayout:
    kinds = list(facts.layer_kinds)
    kv_bytes = 2 * facts.num_key_value_heads * facts.head_dim * 4
    types = list(facts.state_types)
    dims = {"mamba": [kinds.count("mamba"), 4096], "swa": [kinds.count("swa"), 2, facts.num_key_value_heads, 64]}
    return CacheLayout.from_json({
        "page_size": 16,
        "dtype": "float32",
        "kv_item_lens": [kv_bytes] * kinds.count("full"),
        "state_types": types,
        "state_dims": [dims[t] for t in types],
        "state_item_lens": [4 * math.prod(dims[t]) for t in types],
        "weights_hash": weights,
        "architecture": facts.architecture,
        "layer_kinds": kinds,
        "vocab_size": facts.vocab_size,
    })


@pytest.fixture(scope="module")
def pair() -> tuple[RegistrationInfo, RegistrationInfo]:
    target = load_model_facts("builtin:tiny-hybrid")
    draft = load_model_facts("builtin:tiny-draft")
    kw = dict(
        speculative=SPEC,
        draft_layout=_layout(draft, weights="d" * 16),
        facts=target,
        draft_facts=draft,
        transfer_backend="zmq",
    )
    pre = build_registration("prefill", _layout(target, weights="t" * 16), **kw)
    dec = build_registration(
        "decode", _layout(target, weights="t" * 16), endpoints={"transfer": "tcp://127.0.0.1:7"}, **kw
    )
    return pre, dec


def R(obj, **changes):
    return msgspec.structs.replace(obj, **changes)


def _model(dec, **changes):
    return R(dec, model=R(dec.model, **changes))


def _draft(dec, **changes):
    return R(dec, draft=R(dec.draft, **changes))


# (case id, mutation of decode, field expected in the diff). Every RegistrationInfo field appears.
CASES = [
    ("protocol_version", lambda d: R(d, protocol_version=d.protocol_version + 1), "protocol_version"),
    ("engine_version", lambda d: R(d, engine_version="9.9.9"), "engine_version"),
    ("role", lambda d: R(d, role="prefill"), "role"),
    ("model.architecture", lambda d: _model(d, architecture="LlamaForCausalLM"), "model.architecture"),
    ("model.layer_kinds", lambda d: _model(d, layer_kinds=("full",) * 4), "model.layer_kinds"),
    ("model.shapes", lambda d: _model(d, shapes={**d.model.shapes, "hidden_size": 512}), "model.shapes.hidden_size"),
    ("model.dtype", lambda d: _model(d, dtype="bfloat16"), "model.dtype"),
    ("model.tokenizer", lambda d: _model(d, tokenizer="sha256:0123"), "model.tokenizer"),
    ("model.weights_hash", lambda d: _model(d, weights_hash="x" * 16), "model.weights_hash"),
    ("page_size", lambda d: R(d, page_size=32), "page_size"),
    ("kv_item_lens", lambda d: R(d, kv_item_lens=(256,)), "kv_item_lens"),
    ("state_types.none", lambda d: R(d, state_types=()), "state_types"),
    ("state_types.order", lambda d: R(d, state_types=tuple(reversed(d.state_types))), "state_types"),
    ("state_types.count", lambda d: R(d, state_types=d.state_types[:1]), "state_types"),
    ("state_item_lens", lambda d: R(d, state_item_lens=(1,) + d.state_item_lens[1:]), "state_item_lens"),
    ("state_dims", lambda d: R(d, state_dims=((1, 1),) + d.state_dims[1:]), "state_dims"),
    ("draft.none", lambda d: R(d, draft=None), "draft"),
    ("draft.model", lambda d: _draft(d, model=R(d.draft.model, weights_hash="y" * 16)), "draft.model.weights_hash"),
    ("draft.page_size", lambda d: _draft(d, page_size=8), "draft.page_size"),
    ("draft.kv_item_lens", lambda d: _draft(d, kv_item_lens=(64,)), "draft.kv_item_lens"),
    ("speculative_algorithm", lambda d: R(d, speculative_algorithm="ngram"), "speculative_algorithm"),
    ("max_draft_tokens", lambda d: R(d, max_draft_tokens=6), "max_draft_tokens"),
    ("transfer_backend", lambda d: R(d, transfer_backend="shm", host="elsewhere"), "transfer_backend"),
    ("endpoints", lambda d: R(d, endpoints={"transfer": "inproc://x"}), "endpoints.transfer"),
    ("host", lambda d: R(d, endpoints={"transfer": "ipc:///tmp/x.sock"}, host="other-host"), "host"),
]


def test_every_registration_field_has_a_case() -> None:
    covered = {c[0].split(".")[0] for c in CASES}
    assert set(RegistrationInfo.__struct_fields__) <= covered


def test_identical_pair_is_compatible(pair) -> None:
    pre, dec = pair
    assert compare(pre, dec) == []
    assert pre.fingerprint() == dec.fingerprint()


@pytest.mark.parametrize(("mutate", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_field_differs_one_mismatch(pair, mutate, field) -> None:
    pre, dec = pair
    bad = mutate(dec)
    mismatches = compare(pre, bad)
    fields = [m.field for m in mismatches]
    # the transfer_backend case also moves the host (shm needs one host): both are reported
    expected = {field, "host"} if field == "transfer_backend" else {field}
    assert set(fields) == expected, render_mismatches(mismatches)
    m = next(m for m in mismatches if m.field == field)
    assert m.fix and m.prefill != m.decode


def test_distinct_messages_for_state_types_and_draft(pair) -> None:
    pre, dec = pair
    none = compare(pre, R(dec, state_types=()))[0]
    assert "no state_types" in none.detail and "mamba" in none.detail
    order = compare(pre, R(dec, state_types=("swa", "mamba")))[0]
    assert "different order" in order.detail
    count = compare(pre, R(dec, state_types=("mamba",)))[0]
    assert "count" in count.detail
    no_draft_on_prefill = compare(R(pre, draft=None), dec)
    assert [m.field for m in no_draft_on_prefill] == ["draft"]
    assert "prefill does not produce" in no_draft_on_prefill[0].detail
    assert "speculative.draft" in no_draft_on_prefill[0].fix
    page = compare(pre, R(dec, page_size=32))[0]
    assert "cache.page_size" in page.fix and "16" in page.fix
    dtype = compare(pre, _model(dec, dtype="bfloat16"))[0]
    assert dtype.prefill == "float32" and dtype.decode == "bfloat16"


def test_all_mismatches_reported_not_the_first(pair) -> None:
    pre, dec = pair
    bad = R(_model(dec, dtype="float16"), page_size=64, state_types=(), max_draft_tokens=2)
    fields = {m.field for m in compare(pre, bad)}
    assert fields == {"model.dtype", "page_size", "state_types", "max_draft_tokens"}
    table = render_mismatches(compare(pre, bad))
    assert table.splitlines()[0].split() == ["field", "prefill", "decode", "fix"]
    assert all(f in table for f in fields)


def test_max_draft_tokens_covers_every_selectable_step() -> None:
    assert max_draft_tokens(SPEC) == 8
    assert max_draft_tokens(SpeculativeConfig(algorithm="ngram", num_steps=4)) == 5
    assert max_draft_tokens(SpeculativeConfig(algorithm="none", num_steps=4)) == 0
    assert max_draft_tokens(None) == 0


def test_builtin_tokenizer_and_shapes_in_fingerprint(pair) -> None:
    pre, _ = pair
    assert pre.model.tokenizer == "bytes"
    assert pre.model.shapes["sliding_window"] == 64 and pre.model.shapes["num_layers"] == 4
    assert pre.draft is not None and pre.draft.model.layer_kinds == ("full",)


def test_matrix_over_the_wire(pair) -> None:
    """Each one-field variant is refused by a live bootstrap server with that field in the diff,
    and never becomes the paired peer; the good decode then pairs."""
    pre, dec = pair
    with BootstrapServer(pre) as srv:
        for _case, mutate, field in CASES:
            with pytest.raises(HandshakeRejected) as err:
                register(srv.endpoint, mutate(dec), timeout_s=5.0)
            assert field in [m.field for m in err.value.mismatches], str(err.value)
            assert field in str(err.value)  # the printed table names it
            assert isinstance(err.value, RuntimeFailure) and err.value.exit_code == 3
            assert srv.peer is None
        assert srv.stats.rejected == len(CASES)
        pairing = register(srv.endpoint, dec, timeout_s=5.0)
        assert srv.peer is not None and srv.peer.session_id == pairing.session_id
        assert pairing.prefill == pre
