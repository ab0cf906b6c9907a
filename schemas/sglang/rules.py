"""Rules only SGLang input has (SGL1xx per command, SGL2xx per prefill/decode pair).

Each finding says when SGLang would have failed ("at start-up", "at decode's first request", "at the
first KV transfer", "never: silently ...") and quotes the SGLang error it prevents; its path is the
flag to change. `check_command(cmd, model)` and `check_pair(prefill, decode, pmodel, dmodel)` never
raise; `model` is what `families.sglang_model` made of the model's config.json, or None when the
model directory is not on this host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specctl.schemas import pd_agreement
from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.pd_agreement import agreement
from specctl.schemas.server_facts import compare_pair, normalise
from specctl.schemas.server_info import SERVER_ARGS, Key
from specctl.schemas.sglang.command import SGLangCommand
from specctl.schemas.sglang.families import POOL_MAMBA, POOL_MLA, SGLangModel
from specctl.schemas.sglang.startup import (  # noqa: F401 - adaptive_off_reason re-exported for callers
    DEFAULT_RELEASE,
    Startup,
    adaptive_off_reason,
    architectures,
    has_mtp_head,
    read_config,
    release_key,
)

_FIRST_REQ = "at decode's first request"
# disaggregation/mori/conn.py sends only these in 0.5.23; the rest is 'unknown state_type'
MORI_UNSENDABLE = ("block_scale", "block_scale_swa", "dsa_tail", "request_row")
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
     "--disaggregation-transfer-backend fake on prefill sends no KV at all (a warm-up/testing backend); SGLang "
     "refuses it on prefill.",
     "at start-up: AssertionError 'Prefill server does not support 'fake' as the transfer backend' "
     "(pd_disaggregation_hook)",
     "use the same real backend on both sides (mooncake, nixl, ...)",
     "--disaggregation-mode prefill --disaggregation-transfer-backend fake",
     "--disaggregation-mode prefill --disaggregation-transfer-backend mooncake"),
    ("SGL106", "decode radix cache forced off", "info",
     "SGLang disables the radix (prefix) cache on a decode server unless "
     "--disaggregation-decode-enable-radix-cache is given; radix settings on decode have no effect.",
     "never: silently no prefix reuse on decode",
     "add --disaggregation-decode-enable-radix-cache, or --disable-radix-cache to say it",
     "--disaggregation-mode decode", "--disaggregation-mode decode --disable-radix-cache"),
    ("SGL111", "EAGLE with an EAGLE3 draft", "error",
     "--speculative-algorithm EAGLE loads the draft as an EAGLE(-2) head; an EAGLE3 checkpoint "
     "(LlamaForCausalLMEagle3 ...) expects the target's auxiliary hidden states, which EAGLE does not capture.",
     "never fails: silently an accept length of about 1.0 (every draft rejected)",
     "use --speculative-algorithm EAGLE3 for an EAGLE3 draft", "--speculative-algorithm EAGLE "
     "--speculative-draft-model-path EAGLE3_DIR", "--speculative-algorithm EAGLE3 --speculative-draft-model-path "
     "EAGLE3_DIR"),
    ("SGL112", "mori cannot send a state type this model registers", "error",
     "The mori transfer backend sends mamba, swa, dsa, qsa, swa_ring, c128_state and MiniMax states; "
     "block_scale / block_scale_swa (--kv-cache-dtype mxfp8), dsa_tail and request_row are unknown to it.",
     _FIRST_XFER + ": 'PD state transfer failed: unknown state_type=block_scale'",
     "use --disaggregation-transfer-backend mooncake or nixl (or a KV dtype without block scales)",
     "--disaggregation-transfer-backend mori --kv-cache-dtype mxfp8", "--disaggregation-transfer-backend mooncake "
     "--kv-cache-dtype mxfp8"),
    ("SGL113", "mooncake encoder transfer with gRPC encoders", "error",
     "--encoder-transfer-backend mooncake receives embeddings over RDMA, which exists only for HTTP encoders; "
     "SGLANG_ENCODER_MM_RECEIVER_MODE=grpc (grpc:// encoder URLs) has no RDMA receive.",
     "at start-up (scheduler init): 'mooncake encoder_transfer_backend requires HTTP encoders; use "
     "zmq_to_scheduler / zmq_to_tokenizer with gRPC.'",
     "use --encoder-transfer-backend zmq_to_scheduler (or HTTP encoders)", "", ""),
    ("SGL114", "draft model missing", "error",
     "EAGLE / EAGLE3 / STANDALONE need a draft: --speculative-draft-model-path, or a model that ships its own "
     "MTP/NextN head (DeepSeek-V3/V3.2, Qwen3-Next/Qwen3.5, GLM-4.5+, MiMo, Nemotron-H ...: config.json "
     "num_nextn_predict_layers / mtp_num_hidden_layers). Without either, the draft worker loads the target itself "
     "as a draft.", "at start-up (draft worker): the target's weights do not load as a draft head",
     "add --speculative-draft-model-path DRAFT_DIR", "--speculative-algorithm EAGLE3",
     "--speculative-algorithm EAGLE3 --speculative-draft-model-path EAGLE3_DIR"),
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
    ("SGL204", "attention TP sizes differ on a model whose state cannot be resliced", "error",
     "Prefill and decode run different attention TP (--tp-size / --attn-dp-size or --enable-dp-attention "
     "--dp-size / --attn-cp-size). SGLang reslices MLA KV and plain MHA KV by heads, and Mamba state on the "
     "backends and releases that slice it (mooncake from 0.5.9, nixl from 0.5.11, mori from 0.5.12); it refuses "
     "sliding-window (SWA) state on nixl and mori (and on mooncake before 0.5.22 or with --pp-size > 1) and "
     "MXFP8 block scales everywhere.",
     _FIRST_XFER + ": 'PD Disaggregation does NOT support PD different TP sizes for non-MLA SWA hybrid models "
     "yet.'", "run the same attention TP on both sides (tp / attention DP / attention CP)", "", ""),
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
    ("SGL211", "speculative step parameters differ", "error",
     "Prefill and decode resolve different --speculative-num-steps / --speculative-eagle-topk / "
     "--speculative-num-draft-tokens (after SGLang's own choices: auto-chosen, forced to 1 by DSPARK/DFLASH, "
     "steps + 1 at topk 1); the draft KV and hidden states prefill hands over are sized for its own.",
     _FIRST_XFER + ": draft state for another step count (garbage drafts or a shape error on decode)",
     "pass the same speculative flags to both servers", "", ""),
    ("SGL212", "adaptive speculation on one side only", "warning",
     "--speculative-adaptive (or its config) differs between prefill and decode after SGLang's resolution.",
     "never fails: the two sides size draft buffers for different step sets",
     "pass the same --speculative-adaptive and --speculative-adaptive-config to both servers", "", ""),
    ("SGL214", "decode context parallelism the prefill cannot feed", "error",
     "A decode with --dcp-size > 1 needs an MLA (or hybrid-MLA) KV pool and a prefill at attention CP 1.",
     _FIRST_REQ + ": 'PD decode DCP currently requires prefill attention CP=1, got N.' / 'PD decode DCP requires "
     "an MLA or hybrid-MLA KV pool.'", "run decode at --dcp-size 1, or prefill at --attn-cp-size 1", "", ""),
    ("SGL213", "resolved page sizes differ", "error",
     "The page size each side resolves (SGLang picks it per attention backend and GPU when --page-size is not "
     "given, and raises it for trtllm/flashmla backends) differs between prefill and decode.",
     _FIRST_REQ + ": 'Page size mismatch: prefill server has page_size=..., but decode server has page_size=....'",
     "pass the same --page-size to both servers", "", ""),
)
for _d in _DOCS:
    register(RuleDoc(*_d))  # type: ignore[arg-type]

def _f(cmd: SGLangCommand, code: str, sev: str, dest: str, msg: str, fix: str) -> Finding:
    line, col = cmd.where(dest)
    return Finding(code, sev, cmd.flag_name(dest), msg, fix, line, col)  # type: ignore[arg-type]


def check_command(cmd: SGLangCommand, model: SGLangModel | None, startup: Startup | None = None) -> list[Finding]:
    """The SGLang-only findings SGLang's start-up resolution does not make (`startup` gives those): files it
    never reads, transfers it cannot make, drafts it loads wrongly."""
    out: list[Finding] = []
    resolved = startup.resolved if startup is not None else {}
    adaptive = bool(cmd.value("speculative_adaptive"))
    if cmd.given("speculative_adaptive_config") and not adaptive:
        out.append(_f(cmd, "SGL101", "warning", "speculative_adaptive_config",
                      "--speculative-adaptive-config is set but --speculative-adaptive is not: SGLang never reads the "
                      "file (never fails: silently static steps, auto-chosen)",
                      "add --speculative-adaptive"))
    if cmd.role == "decode" and not cmd.value("disaggregation_decode_enable_radix_cache") \
            and not cmd.value("disable_radix_cache"):
        out.append(_f(cmd, "SGL106", "info", "disaggregation_mode",
                      "SGLang turns the radix cache off on decode (never fails: silently no prefix reuse on decode)",
                      "add --disable-radix-cache to say so, or --disaggregation-decode-enable-radix-cache"))
    algo = str(resolved.get("speculative_algorithm", cmd.value("speculative_algorithm") or "")).upper()
    draft_archs = architectures(read_config(cmd.value("speculative_draft_model_path")))
    if algo == "EAGLE" and any(a.endswith("Eagle3") or "Eagle3" in a for a in draft_archs):
        out.append(_f(cmd, "SGL111", "error", "speculative_algorithm",
                      f"--speculative-algorithm {cmd.value('speculative_algorithm')} with an EAGLE3 draft "
                      f"({draft_archs[0]} at {cmd.value('speculative_draft_model_path')}): SGLang never fails, the "
                      "draft runs without the auxiliary hidden states it was trained on (accept length about 1.0)",
                      "use --speculative-algorithm EAGLE3"))
    target_cfg = read_config(cmd.value("model_path"))
    draft = resolved.get("speculative_draft_model_path", cmd.value("speculative_draft_model_path"))
    arch = model.architecture if model is not None else (architectures(target_cfg) or ("?",))[0]
    if algo in ("EAGLE", "EAGLE3", "STANDALONE") and draft is None and target_cfg is not None \
            and not has_mtp_head(arch, target_cfg):
        out.append(_f(cmd, "SGL114", "error", "speculative_algorithm",
                      f"--speculative-algorithm {cmd.value('speculative_algorithm')} without "
                      f"--speculative-draft-model-path, and {arch} ships no MTP/NextN head (config.json has no "
                      "num_nextn_predict_layers / mtp_num_hidden_layers): SGLang's draft worker falls back to "
                      "--model-path and fails at start-up loading the target as a draft",
                      "add --speculative-draft-model-path DRAFT_DIR (an EAGLE/EAGLE3 draft trained for this model)"))
    backend = resolved.get("disaggregation_transfer_backend", cmd.value("disaggregation_transfer_backend"))
    if cmd.role in ("prefill", "decode") and backend == "mori" and model is not None:
        bad = [t for t in state_types_of(cmd, model) if t in MORI_UNSENDABLE]
        if bad:
            out.append(_f(cmd, "SGL112", "error", "disaggregation_transfer_backend",
                          f"{model.architecture} with these flags registers state_types {', '.join(bad)}, which the "
                          f"mori backend cannot send; SGLang fails {_FIRST_XFER}: 'PD state transfer failed: unknown "
                          f"state_type={bad[0]}'", "use --disaggregation-transfer-backend mooncake or nixl"))
    if cmd.value("encoder_transfer_backend") == "mooncake":
        grpc_env = cmd.env.get("SGLANG_ENCODER_MM_RECEIVER_MODE", "http") == "grpc"
        urls = cmd.value("encoder_urls") or []
        grpc_urls = any(isinstance(u, str) and u.startswith("grpc://") for u in urls)
        if grpc_env or grpc_urls:
            why = "SGLANG_ENCODER_MM_RECEIVER_MODE=grpc" if grpc_env else "grpc:// --encoder-urls"
            out.append(_f(cmd, "SGL113", "error", "encoder_transfer_backend",
                          f"--encoder-transfer-backend mooncake with {why}: SGLang fails at start-up (scheduler "
                          "init): 'mooncake encoder_transfer_backend requires HTTP encoders; use zmq_to_scheduler / "
                          "zmq_to_tokenizer with gRPC.'", "use --encoder-transfer-backend zmq_to_scheduler, or "
                          "HTTP encoders (SGLANG_ENCODER_MM_RECEIVER_MODE=http)"))
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




# SGLang's own words when a written flag differs: (when it fails, the error it raises), per agreement row.
_QUOTES = {
    "kv_cache_dtype": (_FIRST_REQ, "KV cache dtype mismatch: prefill server has kv_cache_dtype=..."),
    "transfer_backend": (_FIRST_REQ, "no error names it: the two transfer engines never connect and requests time out"),
    "decode_allocation_policy": (_FIRST_REQ,
                                 "Disaggregation decode allocation policy mismatch: prefill=..., decode=..."),
    "kv_layout": (_FIRST_REQ,
                  "KV layout mismatch: prefill server has kv_layout=..., but decode server has kv_layout=..."),
    "mamba_ssm_dtype": (_FIRST_XFER, "Mamba slot size mismatch"),
    "disable_hybrid_swa_memory": (_FIRST_XFER, "state component count mismatch"),
    "mamba_full_memory_ratio": (_FIRST_XFER, "state component count mismatch"),
    "swa_full_tokens_ratio": (_FIRST_XFER, "state component count mismatch"),
}
# Agreement rows compared after SGLang's start-up resolution (`_resolved_pair`) or derived from the model
# (SGL201, SGL207, SGL204), not as written flags.
_RESOLVED = frozenset({"architecture", "page_size", "speculative_algorithm", "draft_model", "num_steps", "eagle_topk",
                       "num_draft_tokens", "adaptive", "adaptive_config", "attn_tp_size", "state_types"})


def _applies(name: str, pm: SGLangModel | None) -> bool:
    """Whether SGLang compares this row's flag for the prefill model `pm` (None: not on this host)."""
    if name == "kv_layout":
        return pm is None or pm.architecture.startswith("DeepseekV4")  # only DeepSeek-V4 pools report a kv_layout
    if name == "mamba_ssm_dtype":
        return pm is not None and pm.pool == POOL_MAMBA
    if name in ("disable_hybrid_swa_memory", "mamba_full_memory_ratio", "swa_full_tokens_ratio"):
        return pm is not None and pm.is_hybrid
    return True


def _state_cause(p: SGLangCommand, d: SGLangCommand) -> str:
    for dest in ("kv_cache_dtype", "disable_hybrid_swa_memory"):
        if p.value(dest) != d.value(dest):
            return dest
    return "model_path"


def state_types_of(cmd: SGLangCommand, model: SGLangModel) -> tuple[str, ...]:
    return model.state_types(kv_cache_dtype=str(cmd.value("kv_cache_dtype")),
                             disable_hybrid_swa_memory=bool(cmd.value("disable_hybrid_swa_memory")))


def check_pair(p: SGLangCommand, d: SGLangCommand, pm: SGLangModel | None, dm: SGLangModel | None,
               ps: Startup | None = None, ds: Startup | None = None, *,
               release: str = DEFAULT_RELEASE) -> list[Finding]:
    """Every disagreement SGLang finds late, as one finding on the decode command's flag. `ps`/`ds` are the
    two sides' predicted start-up resolutions: speculative parameters, page size and attention TP are compared
    as SGLang resolves them, through the agreement table (`schemas.server_facts.compare_pair`, as `specctl
    preflight` compares running servers)."""
    out: list[Finding] = []

    if pm is not None and dm is not None and pm.architecture != dm.architecture:
        out.append(_f(d, "SGL201", "error", "model_path",
                      f"prefill serves {pm.architecture} ({p.value('model_path')}), decode {dm.architecture} "
                      f"({d.value('model_path')}); SGLang fails {_FIRST_XFER}: 'state component count mismatch'",
                      agreement("architecture").fix_for()))
    for row in pd_agreement.AGREEMENTS:  # the table's SGLang flags compared as written
        if row.sglang is None or row.sglang_code is None or row.name in _RESOLVED or not _applies(row.name, pm):
            continue
        pv, dv = p.value(row.sglang), d.value(row.sglang)
        if pv != dv:
            flag = d.flag_name(row.sglang)
            when, quote = _QUOTES.get(row.name, (f"at the {row.fails}", ""))
            out.append(_f(d, row.sglang_code, row.severity, row.sglang,
                          f"{row.label} differs: prefill ({Path(p.name).name}) has {flag} {pv}, decode has {dv}; "
                          f"SGLang fails {when}" + (f": '{quote}'" if quote else ""), row.fix_for(pv)))
    early = not any(f.code in ("SGL201", "SGL202", "SGL203", "SGL209") for f in out)
    if d.value("disaggregation_decode_allocation_policy") == "prefill_complete" and early and any(
            isinstance(p.value(k), int) and p.value(k) > 1 for k in ("tp_size", "attn_cp_size", "pp_size")):
        out.append(_f(d, "SGL209", "error", "disaggregation_decode_allocation_policy",
                      f"--disaggregation-decode-allocation-policy prefill_complete needs prefill at attention "
                      f"TP1/CP1/PP1, but prefill has --tp-size {p.value('tp_size')}; SGLang fails {_FIRST_REQ}: "
                      "'prefill_complete requires peer attention TP1/CP1/PP1'",
                      "use the early policy on both sides, or run prefill at TP1"))
    if pm is not None and dm is not None:
        pst, dst = state_types_of(p, pm), state_types_of(d, dm)
        if pst != dst:
            cause = _state_cause(p, d)
            empty = "kv_args.state_types is empty but state_indices were provided" if not dst or not pst else \
                f"state component count mismatch (local={len(dst)}, remote={len(pst)})" if len(pst) != len(dst) else \
                "state type mismatch"
            out.append(_f(d, "SGL207", "error", cause,
                          f"state_types differ: prefill registers [{', '.join(pst)}], decode [{', '.join(dst)}] "
                          f"(caused by {d.flag_name(cause)}); SGLang fails {_FIRST_XFER}: '{empty}'",
                          agreement("state_types").fix_for(list(pst))))
    out.extend(_resolved_pair(p, d, pm, ps, ds, release))
    return out


def _server_info(cmd: SGLangCommand, startup: Startup | None) -> dict[str, Any]:
    """The command as SGLang's /server_info would report it once resolved (the fields preflight reads)."""
    info: dict[str, Any] = {k: cmd.value(k) for k in SERVER_ARGS}
    if startup is not None:
        info.update({k: v for k, v in startup.resolved.items() if k in SERVER_ARGS})
    cfg = info.get(Key.ADAPTIVE_CONFIG)
    if isinstance(cfg, str) and not Path(cfg).is_absolute():
        info[Key.ADAPTIVE_CONFIG] = str(cmd.base_dir / cfg)
    if info.get(Key.DISAGGREGATION_MODE) is None:
        info[Key.DISAGGREGATION_MODE] = "null"
    info[Key.STATE_TYPES] = []  # compared from the model by SGL207
    return info


_SPEC_FIELDS = {"num_steps": "speculative_num_steps", "eagle_topk": "speculative_eagle_topk",
                "num_draft_tokens": "speculative_num_draft_tokens"}


def _resolved_pair(p: SGLangCommand, d: SGLangCommand, pm: SGLangModel | None, ps: Startup | None,
                   ds: Startup | None, release: str) -> list[Finding]:
    pf = normalise(p.name, _server_info(p, ps))
    df = normalise(d.name, _server_info(d, ds))
    rows = {r.field: r for r in compare_pair(pf, df)}
    out: list[Finding] = []
    pname = Path(p.name).name

    def flag_of(dest: str) -> str:
        return d.flag_name(dest)

    if "speculative_algorithm" in rows:
        out.append(_f(d, "SGL208", "error", "speculative_algorithm",
                      f"SGLang resolves the speculative algorithm to {_algo_text(pf.speculative_algorithm)} on prefill "
                      f"({pname}) but {_algo_text(df.speculative_algorithm)} on decode; SGLang fails {_FIRST_XFER}: "
                      "draft KV / hidden states are missing on decode", rows["speculative_algorithm"].fix))
        return out + _hetero_tp(p, d, pm, pf.attn_tp_size, df.attn_tp_size, release) + _decode_dcp(p, d, pm)
    if "draft_model" in rows:
        out.append(_f(d, "SGL208", "error", "speculative_draft_model_path",
                      f"draft models differ: prefill ({pname}) drafts with {pf.draft_model}, decode with "
                      f"{df.draft_model} (after SGLang's defaults); SGLang fails {_FIRST_XFER} (draft KV layouts "
                      "differ)", rows["draft_model"].fix))
    for name, dest in _SPEC_FIELDS.items():
        if name in rows:
            r = rows[name]
            out.append(_f(d, "SGL211", "error", dest,
                          f"{flag_of(dest)} resolves to {r.prefill} on prefill ({pname}) but {r.decode} on decode "
                          f"(after SGLang's own choices); SGLang fails {_FIRST_XFER}: the draft state prefill hands "
                          "over is sized for its own step parameters", r.fix))
    for name in ("adaptive", "adaptive_config"):
        if name in rows:
            dest = "speculative_adaptive" if name == "adaptive" else "speculative_adaptive_config"
            out.append(_f(d, "SGL212", "warning", dest,
                          f"{flag_of(dest)} differs after resolution: prefill ({pname}) {rows[name].prefill}, decode "
                          f"{rows[name].decode} (never fails: the two sides size draft buffers for different steps)",
                          rows[name].fix))
    if "page_size" in rows and p.value("page_size") == d.value("page_size"):
        r = rows["page_size"]  # different written values are PD503's; here SGLang's own choice differs
        out.append(_f(d, "SGL213", "error", "page_size",
                      f"SGLang resolves page size {r.prefill} on prefill ({pname}) but {r.decode} on decode (chosen "
                      f"per attention backend); SGLang fails {_FIRST_REQ}: 'Page size mismatch: prefill server has "
                      f"page_size={r.prefill}, but decode server has page_size={r.decode}. Both servers must use the "
                      "same --page-size value.'", r.fix))
    return out + _hetero_tp(p, d, pm, pf.attn_tp_size, df.attn_tp_size, release) + _decode_dcp(p, d, pm)


def _decode_dcp(p: SGLangCommand, d: SGLangCommand, pm: SGLangModel | None) -> list[Finding]:
    """common/conn.py: a decode with --dcp-size > 1 needs an MLA pool and prefill at attention CP 1."""
    dcp = d.value("dcp_size")
    if not isinstance(dcp, int) or dcp <= 1:
        return []
    if pm is not None and pm.pool != POOL_MLA:
        return [_f(d, "SGL214", "error", "dcp_size", f"decode runs --dcp-size {dcp} on {pm.architecture}, which has "
                   f"no MLA KV pool; SGLang fails {_FIRST_REQ}: 'PD decode DCP requires an MLA or hybrid-MLA KV pool.'",
                   "use --dcp-size 1 on decode")]
    cp = p.value("attn_cp_size")
    if isinstance(cp, int) and cp != 1:
        return [_f(d, "SGL214", "error", "dcp_size", f"decode runs --dcp-size {dcp} but prefill "
                   f"({Path(p.name).name}) --attn-cp-size {cp}; SGLang fails {_FIRST_REQ}: 'PD decode DCP currently "
                   f"requires prefill attention CP=1, got {cp}.'", "run prefill at --attn-cp-size 1")]
    return []


def _algo_text(algo: str | None) -> str:
    return "none" if algo in (None, "none") else str(algo).upper()


def _tp_dest(p: SGLangCommand, d: SGLangCommand) -> str:
    """The flag behind decode's attention TP to name: the attention-DP / CP flag either side gives, else --tp-size."""
    for dest in ("enable_dp_attention", "attn_dp_size", "attn_cp_size"):
        if p.given(dest) or d.given(dest):
            return dest
    return "tp_size"


def _attn_tp_text(cmd: SGLangCommand, tp: int) -> str:
    parts = [f"--tp-size {cmd.value('tp_size')}"]
    if cmd.value("enable_dp_attention"):
        parts.append(f"--enable-dp-attention --dp-size {cmd.value('dp_size')}")
    for dest in ("attn_dp_size", "attn_cp_size"):
        if cmd.given(dest):
            parts.append(f"{cmd.flag_name(dest)} {cmd.value(dest)}")
    return f"{tp} ({' '.join(parts)})"


def _hetero_tp(p: SGLangCommand, d: SGLangCommand, pm: SGLangModel | None, ptp: int | None, dtp: int | None,
               release: str) -> list[Finding]:
    """Different attention TP: what the transfer backend of `release` does with this model's KV and state."""
    if ptp is None or dtp is None or ptp == dtp or pm is None:
        return []
    dest = _tp_dest(p, d)
    backend = d.value("disaggregation_transfer_backend")
    if backend == "mooncake_tcp":
        backend = "mooncake"
    rel = release_key(release)
    what = (f"attention TP differs: prefill ({Path(p.name).name}) runs {_attn_tp_text(p, ptp)}, decode "
            f"{_attn_tp_text(d, dtp)}")
    fix = agreement("attn_tp_size").fix_for(ptp)
    types = state_types_of(d, pm)
    if pm.pool == POOL_MLA:
        return []
    if any(t.startswith("minimax_") for t in types):
        return [_f(d, "SGL204", "error", dest, f"{what}; SGLang fails {_FIRST_REQ}: 'MiniMax sparse PD requires "
                   f"matching attention TP sizes: prefill={ptp}, decode={dtp}.'", fix)]
    scales = [t for t in types if t.startswith("block_scale")]
    if scales:
        return [_f(d, "SGL204", "error", dest, f"{what}; SGLang fails {_FIRST_REQ}: 'PD Disaggregation does NOT "
                   f"support different attention TP sizes with MXFP8 KV cache: prefill attn_tp_size={ptp}, decode "
                   f"attn_tp_size={dtp}, state types {scales}.'", fix)]
    if "swa" in types:
        pp = d.value("pp_size")
        if backend == "nixl":
            quote = "PD Disaggregation does NOT support PD different TP sizes for non-MLA SWA hybrid models yet."
        elif backend == "mori":
            quote = (f"PD state transfer does not support TP-mismatched non-MLA SWA models (prefill_tp_size={ptp}, "
                     f"decode_tp_size={dtp})")
        elif rel < (0, 5, 22):  # mooncake slices SWA KV by heads from 0.5.22
            quote = "PD Disaggregation does NOT support PD different TP sizes for non-MLA SWA hybrid models yet."
        elif isinstance(pp, int) and pp > 1:
            quote = ("PD Disaggregation does NOT support PD different TP sizes for non-MLA SWA hybrid models with "
                     "pipeline parallelism yet.")
        else:
            return [_f(d, "SGL204", "info", dest, f"{what}; SGLang {release}'s {backend} backend slices the "
                       "sliding-window KV by heads ('Performance is NOT guaranteed when using different TP sizes for "
                       "non-MLA models.')", "nothing to do; the same attention TP on both sides transfers whole pages")]
        return [_f(d, "SGL204", "error", dest, f"{what} on a sliding-window (SWA) hybrid model over {backend}; "
                   f"SGLang fails {_FIRST_XFER} ({release}): '{quote}'", fix)]
    if "mamba" in types:
        # the release each backend's state transfer learned 'Mamba state slice' (read from each wheel)
        slices = rel >= {"mooncake": (0, 5, 9), "nixl": (0, 5, 11), "mori": (0, 5, 12)}.get(str(backend), (99,))
        if slices:
            return [_f(d, "SGL204", "info", dest, f"{what}; SGLang {release}'s {backend} backend slices the Mamba "
                       "state per rank ('Using Mamba state slice transfer for different TP sizes')",
                       "nothing to do; the same attention TP on both sides transfers whole state slots")]
        return [_f(d, "SGL204", "error", dest, f"{what} on a Mamba hybrid model over {backend}, which does not slice "
                   f"Mamba state in SGLang {release}; SGLang fails {_FIRST_XFER}: 'Prefill/Decode Mamba slot size "
                   "mismatch'", fix + ", or --disaggregation-transfer-backend mooncake (SGLang 0.5.9 or later)")]
    return []
