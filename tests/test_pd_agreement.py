"""The agreement table (`specctl.schemas.pd_agreement`) is the one source of what prefill and decode must
agree on: for every row, a pair differing only in that field is flagged by each check the row names --
the static deployment rules, the SGLang pair rules, the handshake's `compare` of two real
`RegistrationInfo`s and the live preflight's diff of two `ServerFacts` -- with the table's fix text; and
a row added to the table reaches all four."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_handshake_matrix import SPEC, _layout
from validate_helpers import data_copy, run_json

from specctl.engine.pd.registration import RegistrationInfo, build_registration, compare
from specctl.schemas import pd_agreement
from specctl.schemas.model_facts import load_model_facts
from specctl.schemas.pd_agreement import AGREEMENTS, FAILS, FIRST_REQUEST, Agreement, agreement
from specctl.schemas.server_facts import PAIR_FIELDS, ServerFacts, compare_pair, normalise
from specctl.schemas.sglang.mapping import in_sglang_dialect

# ------------------------------------------------------------------------------------ static rules

BASE_DEPLOYMENT = """\
version: 1
model: {target: 'builtin:tiny-hybrid', dtype: float32, device: cpu}
speculative: {algorithm: draft, draft: 'builtin:tiny-draft', num_steps: 3}
cache: {page_size: 16, max_tokens: 4096}
transfer: {backend: zmq, protocol: tcp}
serve:
  max_batch_size: 8
  graph_batch_sizes: [1, 2, 4, 8]
roles:
  prefill: {host: 127.0.0.1, port: 30001, bootstrap_port: 8998}
  decode:
    host: 127.0.0.1
    port: 30002
    %s
  router: {host: 127.0.0.1, port: 30000}
"""

# row -> (decode's override, prefill's value as the fix shows it). Every row a deployment sets and the
# static rules report must be here.
STATIC: dict[str, tuple[str, Any]] = {
    "model_path": ("model: {target: 'builtin:tiny-draft'}", "builtin:tiny-hybrid"),
    "dtype": ("model: {dtype: bfloat16}", "float32"),
    "page_size": ("cache: {page_size: 32}", 16),
    "transfer_backend": ("transfer: {backend: shm}", "zmq"),
    "transfer_protocol": ("transfer: {protocol: ipc}", "tcp"),
    "draft_model": ("speculative: {draft: 'builtin:tiny-hybrid'}", "builtin:tiny-draft"),
    "state_types": ("cache: {state_types: [swa]}", ("mamba", "swa")),
}


def _validate_deployment(tmp_path: Path, decode_override: str, name: str = "pair") -> list[dict[str, Any]]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(BASE_DEPLOYMENT % decode_override)
    _, doc = run_json("--no-table", str(path))
    findings: list[dict[str, Any]] = doc["files"][0]["findings"]
    return findings


def test_every_static_row_has_a_case() -> None:
    assert set(STATIC) == {a.name for a in pd_agreement.deployment_rows()}


@pytest.mark.parametrize("name", sorted(STATIC))
def test_static_rules_flag_each_row_with_the_table_fix(tmp_path: Path, name: str) -> None:
    row = agreement(name)
    override, prefill_value = STATIC[name]
    findings = _validate_deployment(tmp_path, override)
    mine = [f for f in findings if f["code"] == row.code]
    assert mine, findings
    assert any(f["fix"] == row.fix_for(prefill_value) for f in mine), mine
    assert load_model_facts("builtin:tiny-hybrid").state_types == ("mamba", "swa")  # the state_types case's premise


def test_a_matched_deployment_has_no_agreement_finding(tmp_path: Path) -> None:
    findings = _validate_deployment(tmp_path, "cache: {page_size: 16}")
    codes = {a.code for a in AGREEMENTS}
    assert [f for f in findings if f["code"] in codes] == []


# ------------------------------------------------------------------------------------ SGLang pair rules

_LAUNCH = "python -m sglang.launch_server --model-path models/{model} --host 127.0.0.1 "
_PREFILL = _LAUNCH + "--disaggregation-mode prefill --port 31101 --disaggregation-bootstrap-port 31998 {flags}\n"
_DECODE = _LAUNCH + "--disaggregation-mode decode --port 31102 --disable-radix-cache {flags}\n"
_EAGLE3 = ("--speculative-algorithm EAGLE3 --speculative-draft-model-path models/llama-eagle3-draft "
           "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
_XFER = "--page-size 16 --disaggregation-transfer-backend mooncake"

# row -> (prefill model, decode model, prefill flags, decode flags): the two commands differ in that row's
# field only (SGL211's step parameters move together: SGLang resolves draft tokens from steps at top-k 1).
SGLANG: dict[str, tuple[str, str, str, str]] = {
    "architecture": ("qwen3-next", "nemotron-h", _XFER, _XFER),
    "page_size": ("llama", "llama", "--attention-backend trtllm_mha", "--attention-backend fa3"),
    "kv_cache_dtype": ("llama", "llama", _XFER, _XFER + " --kv-cache-dtype fp8_e4m3"),
    "kv_layout": ("deepseek-v4", "deepseek-v4", _XFER, _XFER + " --dsv4-attn-backend flashmla"),
    "attn_tp_size": ("gpt-oss", "gpt-oss", "--page-size 16 --disaggregation-transfer-backend nixl --tp-size 2",
                     "--page-size 16 --disaggregation-transfer-backend nixl --tp-size 4"),
    "decode_allocation_policy": ("llama", "llama", _XFER + " --disaggregation-decode-allocation-policy "
                                 "prefill_complete", _XFER),
    "transfer_backend": ("llama", "llama", _XFER, "--page-size 16 --disaggregation-transfer-backend nixl"),
    "speculative_algorithm": ("llama", "llama", _XFER + " " + _EAGLE3, _XFER),
    "draft_model": ("llama", "llama", _EAGLE3, _EAGLE3.replace("llama-eagle3-draft", "llama-eagle3")),
    "num_steps": ("llama", "llama", _EAGLE3, _EAGLE3.replace("steps 3", "steps 5").replace("tokens 4", "tokens 6")),
    "eagle_topk": ("llama", "llama", _EAGLE3, _EAGLE3.replace("topk 1", "topk 2").replace("tokens 4", "tokens 8")),
    "num_draft_tokens": ("llama", "llama", _EAGLE3,
                         _EAGLE3.replace("steps 3", "steps 5").replace("tokens 4", "tokens 6")),
    "adaptive": ("llama", "llama", _EAGLE3, _EAGLE3.replace(" --speculative-num-draft-tokens 4", "")
                 + " --speculative-adaptive"),
    "adaptive_config": ("llama", "llama", _EAGLE3.replace(" --speculative-num-draft-tokens 4", "")
                        + " --speculative-adaptive", _EAGLE3.replace(" --speculative-num-draft-tokens 4", "")
                        + " --speculative-adaptive --speculative-adaptive-config adaptive.json"),
    "disable_hybrid_swa_memory": ("qwen3-next", "qwen3-next", _XFER, _XFER + " --disable-hybrid-swa-memory"),
    "mamba_full_memory_ratio": ("qwen3-next", "qwen3-next", _XFER + " --mamba-full-memory-ratio 0.9", _XFER),
    "mamba_ssm_dtype": ("nemotron-h", "nemotron-h", _XFER, _XFER + " --mamba-ssm-dtype bfloat16"),
    "swa_full_tokens_ratio": ("qwen3-next", "qwen3-next", _XFER, _XFER + " --swa-full-tokens-ratio 0.5"),
    "state_types": ("gpt-oss", "gpt-oss", _XFER, _XFER + " --disable-hybrid-swa-memory"),
}


@pytest.fixture(scope="module")
def sglang_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = data_copy(tmp_path_factory.mktemp("agreement"))
    (root / "adaptive.json").write_text((root / "sglang" / "valid" / "adaptive.json").read_text())
    return root


def _validate_sglang(root: Path, name: str, case: tuple[str, str, str, str]) -> list[dict[str, Any]]:
    pmodel, dmodel, pflags, dflags = case
    (root / f"{name}-prefill.sh").write_text(_PREFILL.format(model=pmodel, flags=pflags))
    (root / f"{name}-decode.sh").write_text(_DECODE.format(model=dmodel, flags=dflags))
    _, doc = run_json("--no-table", f"{name}-prefill.sh", f"{name}-decode.sh")
    findings: list[dict[str, Any]] = doc["files"][1]["findings"]
    return findings


def _table_fix(row: Agreement, fix: str) -> bool:
    """`fix` is the row's own fix text in SGLang's words (prefill's value, where the row shows one, is the
    command's)."""
    return fix.startswith(in_sglang_dialect(row.action)) and fix.endswith(in_sglang_dialect(f"({row.where()})"))


def test_every_sglang_row_has_a_case() -> None:
    assert set(SGLANG) == {a.name for a in AGREEMENTS if a.sglang_code is not None}


@pytest.mark.parametrize("name", sorted(SGLANG))
def test_sglang_pair_rules_flag_each_row_with_the_table_fix(sglang_root: Path, monkeypatch: pytest.MonkeyPatch,
                                                           name: str) -> None:
    monkeypatch.chdir(sglang_root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    row = agreement(name)
    findings = _validate_sglang(sglang_root, name, SGLANG[name])
    mine = [f for f in findings if f["code"] == row.sglang_code and _table_fix(row, f["fix"])]
    assert mine, [(f["code"], f["path"], f["fix"]) for f in findings]
    if row.flag() is not None and row.sglang is not None:
        assert any(f["path"] == row.flag() for f in mine), mine


# ------------------------------------------------------------------------------------ handshake


@pytest.fixture(scope="module")
def registrations() -> tuple[RegistrationInfo, RegistrationInfo]:
    target, draft = load_model_facts("builtin:tiny-hybrid"), load_model_facts("builtin:tiny-draft")
    kw: dict[str, Any] = dict(speculative=SPEC, draft_layout=_layout(draft, weights="d" * 16), facts=target,
                              draft_facts=draft, transfer_backend="zmq", host="pd-host")
    pre = build_registration("prefill", _layout(target, weights="t" * 16), **kw)
    dec = build_registration("decode", _layout(target, weights="t" * 16),
                             endpoints={"transfer": "tcp://127.0.0.1:7"}, **kw)
    return pre, dec


def _leaf(doc: Any, path: str) -> tuple[str, Any]:
    """The first leaf at or below `path` in a builtins document: (its dotted path, its value)."""
    node = doc
    for key in path.split("."):
        node = node[key]
    while isinstance(node, dict):
        key = next(iter(node))
        path, node = f"{path}.{key}", node[key]
    return path, node


def _other(value: Any) -> Any:
    """A different value of the same shape."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.25
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], str):
            return type(value)(reversed(value)) if len(set(value)) > 1 else type(value)([*value, "swa"])
        if value and isinstance(value[0], (list, tuple)):
            return type(value)([_other(value[0]), *value[1:]])
        return type(value)([_other(value[0]) if value else 1, *value[1:]])
    raise AssertionError(f"no other value for {value!r}")


def _set(doc: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        doc = doc[key]
    doc[last] = value


def _handshake_case(pre: RegistrationInfo, dec: RegistrationInfo, row: Agreement) -> tuple[str, Any, list[Any]]:
    doc = msgspec.to_builtins(dec)
    path, value = _leaf(doc, row.registration[0])
    _set(doc, path, _other(value))
    bad = msgspec.convert(doc, RegistrationInfo)
    return path, _leaf(msgspec.to_builtins(pre), path)[1], compare(pre, bad)


def test_the_registration_pair_is_compatible(registrations: tuple[RegistrationInfo, RegistrationInfo]) -> None:
    assert compare(*registrations) == []


@pytest.mark.parametrize("name", [a.name for a in AGREEMENTS if a.registration])
def test_handshake_flags_each_row_with_the_table_fix(registrations: tuple[RegistrationInfo, RegistrationInfo],
                                                     name: str) -> None:
    row = agreement(name)
    path, prefill_value, diff = _handshake_case(*registrations, row)
    assert [d.field for d in diff] == [path], diff
    assert diff[0].fix == row.fix_for(prefill_value)


def test_every_registration_leaf_belongs_to_a_row(registrations: tuple[RegistrationInfo, RegistrationInfo]) -> None:
    def leaves(node: Any, path: str) -> list[str]:
        if isinstance(node, dict):
            return [p for k, v in node.items() for p in leaves(v, f"{path}.{k}" if path else k)]
        return [path]

    pre = msgspec.to_builtins(registrations[0])
    checked = [p for p in leaves(pre, "") if p.split(".")[0] not in ("role", "endpoints", "host")]
    assert checked and all(pd_agreement.registration_row(p) is not None for p in checked), checked


# ------------------------------------------------------------------------------------ live preflight

SGLANG_SERVER_INFO: dict[str, Any] = {
    "model_path": "/models/target", "disaggregation_mode": "prefill", "dtype": "bfloat16",
    "kv_cache_dtype": "fp8_e4m3", "page_size": 16, "kv_layout": "page_major", "tp_size": 2, "dp_size": 1,
    "pp_size": 1, "attn_tp_size": 2, "disaggregation_decode_allocation_policy": "early",
    "disaggregation_transfer_backend": "mooncake", "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "/models/draft", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4, "speculative_adaptive": True,
    "speculative_adaptive_config": "/configs/not-on-this-host.json", "disable_hybrid_swa_memory": False,
    "mamba_full_memory_ratio": 0.9, "mamba_ssm_dtype": "float32", "swa_full_tokens_ratio": 0.8,
    "state_types": ["mamba"], "version": "0.5.23", "internal_states": [{"avg_spec_accept_length": 2.5}],
}


@pytest.fixture(scope="module")
def prefill_facts() -> ServerFacts:
    facts = normalise("http://prefill", SGLANG_SERVER_INFO, {"architectures": ["LlamaForCausalLM"]})
    assert all(facts.value(f) is not None for f in PAIR_FIELDS), facts  # every compared field is known
    return facts


def test_the_server_pair_is_compatible(prefill_facts: ServerFacts) -> None:
    assert compare_pair(prefill_facts, dataclasses.replace(prefill_facts, role="decode")) == []


@pytest.mark.parametrize("name", [a.name for a in AGREEMENTS if a.server_info])
def test_preflight_flags_each_row_with_the_table_fix(prefill_facts: ServerFacts, name: str) -> None:
    row = agreement(name)
    assert row.server_info is not None
    p = prefill_facts.value(row.server_info)
    decode = dataclasses.replace(prefill_facts, role="decode", **{row.server_info: _other(p)})
    diff = compare_pair(prefill_facts, decode)
    assert [d.field for d in diff] == [row.server_info], diff
    assert diff[0].fix == row.fix_for(p)


# ------------------------------------------------------------------------------------ the table itself


def test_rows_are_well_formed() -> None:
    names = [a.name for a in AGREEMENTS]
    assert len(names) == len(set(names))
    for a in AGREEMENTS:
        assert a.fails in FAILS and a.action and a.label, a
        assert a.code or a.sglang_code or a.registration or a.server_info, f"{a.name} is read by no check"
        assert a.server_info is None or a.server_info in {f.name for f in dataclasses.fields(ServerFacts)}
        assert a.registration == () or all(p.split(".")[0] in RegistrationInfo.__struct_fields__
                                           for p in a.registration), a


def test_a_row_added_to_the_table_reaches_all_four_checks(
        tmp_path: Path, sglang_root: Path, registrations: tuple[RegistrationInfo, RegistrationInfo],
        prefill_facts: ServerFacts, monkeypatch: pytest.MonkeyPatch) -> None:
    # A new row, with a locator for each check: the batch limit (deployment, SGLang flag, server fact) and,
    # to show the handshake's rows come from the table too, the vocabulary size leaf of the registration.
    added = Agreement("max_running_requests", "batch limit", FIRST_REQUEST, "use one batch limit on both roles",
                      deployment=("serve", "max_batch_size"), sglang="max_running_requests",
                      registration=("model.shapes.vocab_size",), server_info="max_running_requests",
                      code="PD599", sglang_code="SGL299")
    monkeypatch.setattr(pd_agreement, "AGREEMENTS", (*AGREEMENTS, added))

    static = _validate_deployment(tmp_path, "serve: {max_batch_size: 4}", name="added")
    assert [f["fix"] for f in static if f["code"] == "PD599"] == [added.fix_for(8)]

    monkeypatch.chdir(sglang_root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sglang = _validate_sglang(sglang_root, "added", ("llama", "llama", _XFER + " --max-running-requests 16",
                                                    _XFER + " --max-running-requests 8"))
    assert [(f["path"], f["fix"]) for f in sglang if f["code"] == "SGL299"] == [
        ("--max-running-requests", in_sglang_dialect(added.fix_for(16)))]

    path, prefill_value, diff = _handshake_case(*registrations, added)
    assert path == "model.shapes.vocab_size"
    assert [(d.field, d.fix) for d in diff] == [(path, added.fix_for(prefill_value))]

    decode = dataclasses.replace(prefill_facts, role="decode", max_running_requests=64)
    rows = compare_pair(dataclasses.replace(prefill_facts, max_running_requests=32), decode)
    assert [(d.field, d.fix) for d in rows] == [("max_running_requests", added.fix_for(32))]
