"""Rule 5, PD symmetry (PD5xx): prefill and decode must agree on everything the KV/state transfer
and the handshake compare, and a hybrid model's state_types must be declared and correct.

`check(ctx)` runs the per-role state_types rules and, for a file declaring both roles, the pair
check; `check_pair(prefill, decode)` compares two `RoleRef`s (same file or two files) and returns
one finding per disagreement, on the decode side's path, naming both values.
"""

from __future__ import annotations

from typing import Any

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.model_facts import ModelFacts
from specctl.schemas.pd_agreement import Agreement, agreement, deployment_rows, show
from specctl.schemas.rules import RoleRef, RuleContext, effective_state_types, finding

_PD = "RuntimeError: PD state transfer failed / handshake refused at decode start-up"

register(RuleDoc(
    "PD501", "prefill and decode serve different target models", "error",
    "Decode continues sequences from prefill's KV cache; both must load the same target model.",
    "Handshake refusal (model fingerprint mismatch), or silently wrong continuations without a handshake.",
    "Give both roles the same model.target.",
    "roles: {decode: {model: {target: /models/llama-8b-v2}}}", "(no model override on decode)",
))
register(RuleDoc(
    "PD502", "prefill and decode dtypes differ", "error",
    "KV pages and state are copied byte for byte; dtype (and so item sizes) must match.",
    _PD + " (KV item length mismatch).", "Use one model.dtype for both roles.",
    "roles: {prefill: {model: {dtype: bfloat16}}, decode: {model: {dtype: float16}}}", "model: {dtype: bfloat16}",
))
register(RuleDoc(
    "PD503", "prefill and decode page sizes differ", "error",
    "KV is transferred page by page; page indices are meaningless across different page sizes.",
    _PD + " (page size mismatch).", "Use one cache.page_size for both roles.",
    "roles: {decode: {cache: {page_size: 32}}}", "cache: {page_size: 16}   # both roles",
))
register(RuleDoc(
    "PD504", "prefill and decode layer layouts differ", "error",
    "The per-layer kinds (full/swa/mamba) and KV shapes of both sides' models must be identical to map "
    "transferred buffers layer by layer.",
    _PD + " (kv item lens / layer count mismatch).", "Serve the same model (architecture and shapes) on both roles.",
))
register(RuleDoc(
    "PD505", "prefill and decode state_types differ", "error",
    "Hybrid models transfer state components (mamba, swa) besides KV, in a fixed order. Both sides must "
    "declare the same components in the same order.",
    "RuntimeError: PD state transfer failed: state component count mismatch (local=2, remote=1)",
    "Remove cache.state_types from both roles (it is derived from the model) or write the same list on both.",
    "roles: {prefill: {cache: {state_types: [mamba, swa]}}, decode: {cache: {state_types: [swa]}}}",
    "cache: {state_types: [mamba, swa]}   # or omit: derived from the model",
))
register(RuleDoc(
    "PD506", "prefill and decode state item sizes differ", "error",
    "Each state component is copied as fixed-size items; the sizes derived from both models must match.",
    _PD + " (state item length mismatch).", "Serve the same model on both roles.",
))
register(RuleDoc(
    "PD507", "decode's draft model has no prefill-side KV", "error",
    "With algorithm draft, prefill runs the draft model over the prompt and ships its KV; decode's draft "
    "must be the same model prefill runs.",
    "Handshake refusal (draft fingerprint mismatch) or a draft without prompt KV (near-zero acceptance).",
    "Give prefill the same speculative.algorithm: draft and speculative.draft as decode.",
    "roles: {prefill: {speculative: {algorithm: none}}, decode: {speculative: {algorithm: draft, draft: d}}}",
    "speculative: {algorithm: draft, draft: d}   # shared by both roles",
))
register(RuleDoc(
    "PD508", "prefill and decode transfer settings differ", "error",
    "Both sides of the KV/state transfer must use the same transfer.backend (and ZeroMQ protocol).",
    "Decode cannot connect to prefill's transfer endpoint; requests hang until transfer.timeout_s.",
    "Use one transfer section for both roles.",
    "roles: {decode: {transfer: {backend: shm}}}", "transfer: {backend: zmq}",
))
register(RuleDoc(
    "PD509", "hybrid model with empty state_types", "error",
    "A model with mamba or swa layers has state to transfer; cache.state_types: [] declares none.",
    "RuntimeError: PD state transfer failed: kv_args.state_types is empty but state_indices were provided",
    "Remove cache.state_types (derived from the model) or list the model's components.",
    "cache: {state_types: []}   # tiny-hybrid has mamba and swa layers", "cache: {state_types: [mamba, swa]}",
))
register(RuleDoc(
    "PD510", "state_types disagree with the model", "error",
    "Written cache.state_types must equal the components derived from the model's layers, in order "
    "(mamba before swa).",
    "RuntimeError: PD state transfer failed: state component count mismatch (local=2, remote=1)",
    "Remove cache.state_types (derived) or write the derived list.",
    "cache: {state_types: [swa, mamba]}", "cache: {state_types: [mamba, swa]}",
))
register(RuleDoc(
    "PD511", "prefill or decode validated without its partner", "info",
    "A file declares only one side of a PD pair; cross-checks need both.",
    "Mismatches with the other side surface only at the handshake.",
    "Validate both files together: specctl validate prefill.yaml decode.yaml",
))


def _layout(f: ModelFacts) -> dict[str, Any]:
    return {"layer_kinds": list(f.layer_kinds), "kv_heads": f.num_key_value_heads, "head_dim": f.head_dim}


def state_item_sizes(f: ModelFacts) -> dict[str, int]:
    """Elements per request of each state component (dtype-independent), derived from config.json."""
    cfg = f.config
    out: dict[str, int] = {}
    n_mamba = f.layer_kinds.count("mamba")
    if n_mamba:
        d_inner = int(cfg.get("mamba_expand", 2)) * f.hidden_size
        conv = d_inner * int(cfg.get("mamba_d_conv", 4))
        ssm = d_inner * int(cfg.get("mamba_d_state", 16))
        out["mamba"] = n_mamba * (conv + ssm)
    n_swa = f.layer_kinds.count("swa")
    if n_swa:
        out["swa"] = n_swa * 2 * (f.sliding_window or 0) * f.num_key_value_heads * f.head_dim
    return out


def check(ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    for role, cfg in ctx.engine_roles("model", "cache"):
        facts = ctx.facts(cfg["model"].get("target"))
        written = cfg["cache"].get("state_types")
        if facts is None or not isinstance(written, list):
            continue
        path = ctx.path(role, "cache", "state_types")
        if facts.is_hybrid and not written:
            out.append(finding(
                "PD509", "error", path,
                f"{facts.ref} has {'/'.join(facts.state_types)} layers but cache.state_types is empty",
                f"remove cache.state_types (derived: {show(facts.state_types)}) or set it to "
                f"{show(facts.state_types)}",
            ))
        elif tuple(written) != facts.state_types:
            out.append(finding(
                "PD510", "error", path,
                f"cache.state_types is {show(written)} but {facts.ref}'s layers give {show(facts.state_types)}",
                f"remove cache.state_types (it is derived) or set it to {show(facts.state_types)}",
            ))
    if "prefill" in ctx.roles and "decode" in ctx.roles and ctx.clean("prefill") and ctx.clean("decode"):
        out.extend(check_pair(RoleRef(ctx, "prefill"), RoleRef(ctx, "decode")))
    return out


def check_pair(p: RoleRef, d: RoleRef) -> list[Finding]:
    """Every prefill/decode disagreement, one finding each, on decode's path; the fields, labels and fixes
    are the agreement table's (`specctl.schemas.pd_agreement`)."""
    out: list[Finding] = []
    same_file = p.ctx is d.ctx

    def add(row: Agreement, keys: tuple[str, ...], pv: Any, dv: Any, label: str | None = None) -> None:
        where = "" if same_file else f" ({p.ctx.name})"
        assert row.code is not None
        out.append(finding(
            row.code, row.severity, d.path(*keys),
            f"{label or row.label}: prefill{where} has {show(pv)}, decode has {show(dv)}",
            row.fix_for(pv),
        ))

    pc, dc = p.cfg, d.cfg
    pf, df = p.ctx.facts(pc["model"].get("target")), d.ctx.facts(dc["model"].get("target"))
    two_models = pf is not None and df is not None and pf is not df  # one facts object (same ref) agrees with itself
    for row in deployment_rows():
        assert row.deployment is not None
        section, key = row.deployment
        pv, dv = pc[section].get(key), dc[section].get(key)
        if row.name == "state_types":
            p_st, p_written = effective_state_types(pc, pf)
            d_st, d_written = effective_state_types(dc, df)
            if p_st is not None and d_st is not None and p_st != d_st:
                add(row, row.deployment if d_written or not p_written else ("model", "target"), p_st, d_st)
            elif two_models and p_st == d_st:
                assert pf is not None and df is not None
                ps, ds = state_item_sizes(pf), state_item_sizes(df)
                if ps != ds:
                    add(agreement("state_item_lens"), ("model", "target"),
                        ", ".join(f"{k}={v}" for k, v in ps.items()), ", ".join(f"{k}={v}" for k, v in ds.items()),
                        "state item sizes (elements per request)")
        elif row.name == "draft_model":
            ds_, ps_ = dc["speculative"], pc["speculative"]
            if ds_.get("algorithm") == "draft" and ds_.get("draft"):
                p_draft = ps_.get("draft") if ps_.get("algorithm") == "draft" else None
                if p_draft != ds_["draft"]:
                    add(row, row.deployment, p_draft, ds_["draft"],
                        "draft model (prefill must build its prompt KV)")
        elif row.name == "transfer_protocol":
            if pv != dv and "shm" not in (pc["transfer"].get("backend"), dc["transfer"].get("backend")):
                add(row, row.deployment, pv, dv)  # shm has no ZeroMQ protocol
        elif pv != dv:
            add(row, row.deployment, pv, dv)
        if row.name == "model_path" and two_models:
            assert pf is not None and df is not None
            if _layout(pf) != _layout(df):
                diff = {k: (v, _layout(df)[k]) for k, v in _layout(pf).items() if v != _layout(df)[k]}
                detail = "; ".join(f"{k} {show(a)} vs {show(b)}" for k, (a, b) in diff.items())
                add(agreement("architecture"), ("model", "target"), pf.ref, df.ref, f"layer layout ({detail})")
    return out
