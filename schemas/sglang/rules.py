"""Rules only SGLang input has (SGL1xx per command, SGL2xx per prefill/decode pair).

Each finding says when SGLang would have failed ("at start-up", "at decode's first request", "at the
first KV transfer", "never: silently ...") and quotes the SGLang error it prevents; its path is the
flag to change. `check_command(cmd, model)` and `check_pair(prefill, decode, pmodel, dmodel)` never
raise; `model` is what `families.sglang_model` made of the model's config.json, or None when the
model directory is not on this host.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.sglang.command import SGLangCommand
from specctl.schemas.sglang.families import POOL_MAMBA, POOL_MLA, SGLangModel

_FIRST_REQ = "at decode's first request"
_FIRST_XFER = "at the first KV transfer"

_DOCS = (
    ("SGL101", "adaptive config without --speculative-adaptive", "warning",
     "SGLang reads --speculative-adaptive-config only when --speculative-adaptive is also passed; alone, the file "
     "is silently ignored, adaptive stays off and static steps are auto-chosen.",
     "never: silently static speculation (no error, no log line about the ignored file)",
     "add --speculative-adaptive (or drop --speculative-adaptive-config)",
     "--speculative-adaptive-config a.json", "--speculative-adaptive --speculative-adaptive-config a.json"),
    ("SGL102", "adaptive speculation silently downgraded", "warning",
     "SGLang turns adaptive speculation off (static steps) for --speculative-eagle-topk > 1, algorithms other "
     "than EAGLE/EAGLE3 (NGRAM, STANDALONE ...), attention DP, multi-layer EAGLE, two-batch overlap and pdmux "
     "(adaptive_spec_params.adaptive_unsupported_reason).",
     "never: silently ('speculative_adaptive disabled: ... Falling back to static speculative params.' in the log)",
     "remove the flag that disables adaptive, or drop --speculative-adaptive",
     "--speculative-adaptive --speculative-eagle-topk 4", "--speculative-adaptive --speculative-eagle-topk 1"),
    ("SGL103", "--speculative-num-draft-tokens overridden under adaptive", "warning",
     "With adaptive speculation SGLang sets --speculative-num-draft-tokens to --speculative-num-steps + 1 "
     "(_init_adaptive_speculative_params); another value is silently replaced.",
     "never: silently replaced by num_steps + 1",
     "remove --speculative-num-draft-tokens, or set it to num_steps + 1",
     "--speculative-num-steps 3 --speculative-num-draft-tokens 8", "--speculative-num-steps 3"),
    ("SGL104", "adaptive config file unreadable", "error",
     "--speculative-adaptive-config names a file (relative to the command file here) that cannot be read as an "
     "SGLang adaptive JSON object.",
     "at start-up: FileNotFoundError / json.JSONDecodeError in adaptive_spec_params._load_adaptive_config",
     "point it at the adaptive JSON file", "--speculative-adaptive-config missing.json",
     "--speculative-adaptive-config adaptive.json"),
    ("SGL105", "prefill with the fake transfer backend", "error",
     "--disaggregation-transfer-backend fake on prefill sends no KV at all (a warm-up/testing backend); a real "
     "decode waits for KV that never arrives.",
     "at decode's first request: the request hangs until the transfer timeout",
     "use the same real backend on both sides (mooncake, nixl, ...)",
     "--disaggregation-mode prefill --disaggregation-transfer-backend fake",
     "--disaggregation-mode prefill --disaggregation-transfer-backend mooncake"),
    ("SGL106", "decode radix cache forced off", "info",
     "SGLang disables the radix (prefix) cache on a decode server unless "
     "--disaggregation-decode-enable-radix-cache is given; radix settings on decode have no effect.",
     "never: silently no prefix reuse on decode",
     "add --disaggregation-decode-enable-radix-cache, or --disable-radix-cache to say it",
     "--disaggregation-mode decode", "--disaggregation-mode decode --disable-radix-cache"),
    ("SGL201", "prefill and decode serve different architectures", "error",
     "The two model directories' config.json name different architectures (or one side is a different family).",
     _FIRST_XFER + ": KV/state layouts differ ('state component count mismatch' or garbage continuations)",
     "serve the same model on both sides", "", ""),
    ("SGL202", "KV-cache dtypes differ", "error",
     "--kv-cache-dtype differs between prefill and decode; KV pages are copied byte for byte.",
     _FIRST_REQ + ": 'KV cache dtype mismatch: prefill server has kv_cache_dtype=...' "
     "(disaggregation/common/conn.py)", "use one --kv-cache-dtype on both sides",
     "prefill: --kv-cache-dtype fp8_e4m3 / decode: (auto)", "both: --kv-cache-dtype fp8_e4m3"),
    ("SGL203", "transfer backends differ", "error",
     "--disaggregation-transfer-backend differs; the two sides cannot talk.",
     _FIRST_REQ + ": bootstrap/transfer failure (no common transfer engine)",
     "use one --disaggregation-transfer-backend on both sides", "", ""),
    ("SGL204", "TP sizes differ on a hybrid non-MLA model", "error",
     "Mamba/SWA state slots are sharded by tensor parallelism; with different --tp-size the per-rank state "
     "items differ (SGLang supports heterogeneous TP only for MLA KV).",
     _FIRST_XFER + ": 'Mamba slot size mismatch' / state item length mismatch",
     "use one --tp-size on both sides", "", ""),
    ("SGL205", "Mamba SSM dtypes differ", "error",
     "--mamba-ssm-dtype differs, so the Mamba state items have different sizes.",
     _FIRST_XFER + ": 'Mamba slot size mismatch'", "use one --mamba-ssm-dtype on both sides", "", ""),
    ("SGL206", "hybrid-memory flags differ", "error",
     "--disable-hybrid-swa-memory / --mamba-full-memory-ratio / --swa-full-tokens-ratio change the KV pool "
     "class and state layout; they must agree for a hybrid model.",
     _FIRST_XFER + ": 'state component count mismatch' or "
     "'kv_args.state_types is empty but state_indices were provided'",
     "use the same hybrid-memory flags on both sides", "", ""),
    ("SGL207", "state_types differ between prefill and decode", "error",
     "The ordered state_types SGLang registers (setup_state_kv_args: mamba, swa, block_scale ...) follow from the "
     "model and the KV-pool flags; the two sides predict different lists.",
     _FIRST_XFER + ": 'state component count mismatch (local=N, remote=M)' or "
     "'kv_args.state_types is empty but state_indices were provided'",
     "make the flag named in the finding equal on both sides", "", ""),
    ("SGL208", "speculative decoding on one side only", "error",
     "Speculative algorithms and draft models must be set on both sides: prefill computes the draft's KV and "
     "hidden states that decode's drafter continues from.",
     _FIRST_XFER + ": missing draft KV / hidden states on decode (or a draft run without its prefix)",
     "pass the same --speculative-algorithm and --speculative-draft-model-path to both servers", "", ""),
    ("SGL209", "decode allocation policies differ", "error",
     "--disaggregation-decode-allocation-policy is registered by prefill and compared by decode per request; "
     "`prefill_complete` also requires prefill at attention TP1/CP1/PP1.",
     _FIRST_REQ + ": 'Disaggregation decode allocation policy mismatch: prefill=..., decode=.... Set "
     "--disaggregation-decode-allocation-policy identically on both roles.' (the request fails)",
     "pass the same --disaggregation-decode-allocation-policy to both servers", "", ""),
    ("SGL210", "KV layouts differ", "error",
     "--dsv4-attn-backend selects the KV layout of DeepSeek-V4 pools; prefill and decode must agree.",
     _FIRST_REQ + ": 'KV layout mismatch: prefill server has kv_layout=..., but decode server has kv_layout=.... "
     "Both servers must use the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT.'",
     "pass the same --dsv4-attn-backend to both servers", "", ""),
)
for _d in _DOCS:
    register(RuleDoc(*_d))  # type: ignore[arg-type]

DOWNGRADE_REASONS: tuple[tuple[str, Callable[[SGLangCommand], bool], str], ...] = (
    ("speculative_eagle_topk", lambda c: isinstance(c.value("speculative_eagle_topk"), int)
     and c.value("speculative_eagle_topk") != 1, "only topk=1 is supported"),
    # attention DP: attn_dp_size > 1 once resolved (--attn-dp-size, or --enable-dp-attention with --dp-size > 1)
    ("attn_dp_size", lambda c: isinstance(c.value("attn_dp_size"), int) and c.value("attn_dp_size") > 1,
     "attention DP is not supported"),
    ("enable_dp_attention", lambda c: bool(c.value("enable_dp_attention")) and isinstance(c.value("dp_size"), int)
     and c.value("dp_size") > 1, "attention DP is not supported"),
    ("enable_multi_layer_eagle", lambda c: bool(c.value("enable_multi_layer_eagle")),
     "enable_multi_layer_eagle=True is not supported"),
    ("enable_two_batch_overlap", lambda c: bool(c.value("enable_two_batch_overlap")),
     "enable_two_batch_overlap=True is not supported"),
    ("enable_pdmux", lambda c: bool(c.value("enable_pdmux")), "enable_pdmux=True is not supported"),
)


def _f(cmd: SGLangCommand, code: str, sev: str, dest: str, msg: str, fix: str) -> Finding:
    line, col = cmd.where(dest)
    return Finding(code, sev, cmd.flag_name(dest), msg, fix, line, col)  # type: ignore[arg-type]


def adaptive_off_reason(cmd: SGLangCommand) -> tuple[str, str] | None:
    """(dest, SGLang's reason) when SGLang would silently turn --speculative-adaptive off."""
    algo = cmd.value("speculative_algorithm")
    if str(algo).upper() not in ("EAGLE", "EAGLE3"):
        return "speculative_algorithm", f"speculative_algorithm={algo} (only EAGLE/EAGLE3 are supported)"
    for dest, test, why in DOWNGRADE_REASONS:
        if test(cmd):
            return dest, f"{dest}={cmd.value(dest)} ({why})"
    return None


def check_command(cmd: SGLangCommand, model: SGLangModel | None) -> list[Finding]:
    out: list[Finding] = []
    adaptive = bool(cmd.value("speculative_adaptive"))
    if cmd.given("speculative_adaptive_config") and not adaptive:
        out.append(_f(cmd, "SGL101", "warning", "speculative_adaptive_config",
                      "--speculative-adaptive-config is set but --speculative-adaptive is not: SGLang never reads the "
                      "file (never fails: silently static steps, auto-chosen)",
                      "add --speculative-adaptive"))
    if adaptive:
        why = adaptive_off_reason(cmd)
        if why is not None:
            out.append(_f(cmd, "SGL102", "warning", why[0],
                          f"--speculative-adaptive is silently turned off: {why[1]} (never fails: SGLang logs "
                          "'speculative_adaptive disabled: ... Falling back to static speculative params.')",
                          f"change {cmd.flag_name(why[0])}, or drop --speculative-adaptive"))
        elif cmd.given("speculative_num_draft_tokens"):
            steps = cmd.value("speculative_num_steps")
            ndt = cmd.value("speculative_num_draft_tokens")
            if isinstance(steps, int) and ndt != steps + 1:
                out.append(_f(cmd, "SGL103", "warning", "speculative_num_draft_tokens",
                              f"--speculative-num-draft-tokens {ndt} is replaced by {steps + 1} "
                              "(--speculative-num-steps + 1) under adaptive speculation (never fails: silently)",
                              "remove --speculative-num-draft-tokens"))
    if cmd.role == "prefill" and cmd.value("disaggregation_transfer_backend") == "fake":
        out.append(_f(cmd, "SGL105", "error", "disaggregation_transfer_backend",
                      "prefill uses --disaggregation-transfer-backend fake, which transfers nothing; a real decode "
                      "hangs at its first request until the transfer times out",
                      "use mooncake (or the backend decode uses)"))
    if cmd.role == "decode" and not cmd.value("disaggregation_decode_enable_radix_cache") \
            and not cmd.value("disable_radix_cache"):
        out.append(_f(cmd, "SGL106", "info", "disaggregation_mode",
                      "SGLang turns the radix cache off on decode (never fails: silently no prefix reuse on decode)",
                      "add --disable-radix-cache to say so, or --disaggregation-decode-enable-radix-cache"))
    return out


# When SGLang would hit what specctl's general PD rules find, for findings on SGLang commands.
SGLANG_WHEN: dict[str, str] = {
    "PD501": "never fails: SGLang does not compare the models; decode silently continues another model's KV",
    "PD502": _FIRST_XFER + ": KV item lengths differ ('... item length mismatch')",
    "PD503": _FIRST_REQ + ": 'Page size mismatch: prefill server has page_size=..., but decode server has "
             "page_size=.... Both servers must use the same --page-size value.'",
    "PD504": _FIRST_XFER + ": 'state component count mismatch' / item length mismatch",
    "PD505": _FIRST_XFER + ": 'state component count mismatch (local=N, remote=M)'",
    "PD506": _FIRST_XFER + ": 'Prefill/Decode Mamba slot size mismatch' / state item length mismatch",
    "PD507": _FIRST_XFER + ": the draft's KV is missing on decode",
}


def _state_cause(p: SGLangCommand, d: SGLangCommand) -> str:
    for dest in ("kv_cache_dtype", "disable_hybrid_swa_memory"):
        if p.value(dest) != d.value(dest):
            return dest
    return "model_path"


def state_types_of(cmd: SGLangCommand, model: SGLangModel) -> tuple[str, ...]:
    return model.state_types(kv_cache_dtype=str(cmd.value("kv_cache_dtype")),
                             disable_hybrid_swa_memory=bool(cmd.value("disable_hybrid_swa_memory")))


def check_pair(p: SGLangCommand, d: SGLangCommand, pm: SGLangModel | None, dm: SGLangModel | None) -> list[Finding]:
    """Every disagreement SGLang finds late, as one finding on the decode command's flag."""
    out: list[Finding] = []

    def differ(code: str, dest: str, label: str, when: str, quote: str, *, pv: Any = None, dv: Any = None) -> None:
        pv = p.value(dest) if pv is None else pv
        dv = d.value(dest) if dv is None else dv
        if pv != dv:
            flag = d.flag_name(dest)
            fix = f"set {flag} {pv} on decode (or change prefill)" if p.given(dest) else \
                f"remove {flag} from decode (prefill uses SGLang's default {pv}), or pass it to both"
            out.append(_f(d, code, "error", dest,
                          f"{label}: prefill ({Path(p.name).name}) has {flag} {pv}, decode has {dv}; SGLang fails "
                          f"{when}: '{quote}'", fix))

    if pm is not None and dm is not None and pm.architecture != dm.architecture:
        out.append(_f(d, "SGL201", "error", "model_path",
                      f"prefill serves {pm.architecture} ({p.value('model_path')}), decode {dm.architecture} "
                      f"({d.value('model_path')}); SGLang fails {_FIRST_XFER}: 'state component count mismatch'",
                      "serve the same model on both sides"))
    differ("SGL202", "kv_cache_dtype", "KV-cache dtypes differ", _FIRST_REQ,
           "KV cache dtype mismatch: prefill server has kv_cache_dtype=...")
    differ("SGL203", "disaggregation_transfer_backend", "transfer backends differ", _FIRST_REQ,
           "no error names it: the two transfer engines never connect and requests time out")
    differ("SGL209", "disaggregation_decode_allocation_policy", "decode allocation policies differ", _FIRST_REQ,
           "Disaggregation decode allocation policy mismatch: prefill=..., decode=...")
    if d.value("disaggregation_decode_allocation_policy") == "prefill_complete" and not out and any(
            isinstance(p.value(k), int) and p.value(k) > 1 for k in ("tp_size", "attn_cp_size", "pp_size")):
        out.append(_f(d, "SGL209", "error", "disaggregation_decode_allocation_policy",
                      f"--disaggregation-decode-allocation-policy prefill_complete needs prefill at attention "
                      f"TP1/CP1/PP1, but prefill has --tp-size {p.value('tp_size')}; SGLang fails {_FIRST_REQ}: "
                      "'prefill_complete requires peer attention TP1/CP1/PP1'",
                      "use the early policy on both sides, or run prefill at TP1"))
    if pm is None or pm.architecture.startswith("DeepseekV4"):  # only DeepSeek-V4 pools report a kv_layout
        differ("SGL210", "dsv4_attn_backend", "KV layouts differ", _FIRST_REQ,
               "KV layout mismatch: prefill server has kv_layout=..., but decode server has kv_layout=...")
    hybrid = pm is not None and pm.is_hybrid and pm.pool != POOL_MLA
    if hybrid:
        differ("SGL204", "tp_size", "TP sizes differ on a hybrid non-MLA model", _FIRST_XFER,
               "Mamba slot size mismatch")
    if pm is not None and pm.pool == POOL_MAMBA:
        differ("SGL205", "mamba_ssm_dtype", "Mamba SSM dtypes differ", _FIRST_XFER, "Mamba slot size mismatch")
    if pm is not None and pm.is_hybrid:
        for dest in ("disable_hybrid_swa_memory", "mamba_full_memory_ratio", "swa_full_tokens_ratio"):
            differ("SGL206", dest, "hybrid-memory flags differ", _FIRST_XFER, "state component count mismatch")
    if pm is not None and dm is not None:
        ps, ds = state_types_of(p, pm), state_types_of(d, dm)
        if ps != ds:
            cause = _state_cause(p, d)
            empty = "kv_args.state_types is empty but state_indices were provided" if not ds or not ps else \
                f"state component count mismatch (local={len(ds)}, remote={len(ps)})" if len(ps) != len(ds) else \
                "state type mismatch"
            out.append(_f(d, "SGL207", "error", cause,
                          f"state_types differ: prefill registers [{', '.join(ps)}], decode [{', '.join(ds)}] "
                          f"(caused by {d.flag_name(cause)}); SGLang fails {_FIRST_XFER}: '{empty}'",
                          f"make {d.flag_name(cause)} equal on both sides"))
    pa, da = p.value("speculative_algorithm"), d.value("speculative_algorithm")
    if (pa is None) != (da is None) or (pa and da and str(pa).upper() != str(da).upper()):
        out.append(_f(d, "SGL208", "error", "speculative_algorithm",
                      f"--speculative-algorithm is {pa} on prefill but {da} on decode; SGLang fails {_FIRST_XFER}: "
                      "draft KV / hidden states are missing on decode",
                      "pass the same --speculative-algorithm (and draft model) to both servers"))
    elif pa and p.value("speculative_draft_model_path") != d.value("speculative_draft_model_path"):
        out.append(_f(d, "SGL208", "error", "speculative_draft_model_path",
                      f"draft models differ: prefill {p.value('speculative_draft_model_path')}, decode "
                      f"{d.value('speculative_draft_model_path')}; SGLang fails {_FIRST_XFER} "
                      "(draft KV layouts differ)",
                      "pass the same --speculative-draft-model-path to both servers"))
    return out
