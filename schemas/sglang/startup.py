"""What SGLang decides at start-up from flags, environment and config.json alone, predicted without SGLang.

Contract: `predict_startup(cmd, model, gpu=..., release=...)` never raises and returns a `Startup`:
- `errors`: one finding (severity error) per check SGLang's start-up would raise for this command
  (`ServerArgs` post-init, `resolve_once()` and its hooks); SGLang stops at the first, specctl lists all;
- `warnings`: silent downgrades and overrides (adaptive turned off, values replaced), as findings;
- `resolved`: the values SGLang resolves silently, by `ServerArgs` field name (`speculative_algorithm`
  after NEXTN -> EAGLE, `speculative_num_draft_tokens`, `page_size` ...), only for the fields predicted.

Inputs: the command's flags (SGLang's defaults where not given), its environment (`VAR=value` prefixes
and `export` lines, `SGLangCommand.env`), the model's `SGLangModel` (families), and the `config.json`
of the model and draft directories when they are readable on this host (SGLang reads the draft's
`architectures` to resolve the algorithm). The order of the checks follows SGLang's resolution pipeline
(`arg_groups/pipeline.py`): DP-attention layout, PD disaggregation, model overrides, attention backend
and page size, speculative decoding (alias, per-algorithm handler, adaptive).

`release` is the SGLang release the command runs on (default 0.5.23): the checks known to differ between
releases (SGLANG_ENABLE_SPEC_V2 with a draft tree, the decode radix cache) follow it; the rest is 0.5.23's.
`gpu` picks the platform SGLang chooses backends for (H100/H200: SM90, B200: SM100).

Every finding's path is the flag to change (or the environment variable); its message quotes SGLang's own
words; its fix names flags. SGLang's own resolution, recorded over a generated corpus of commands
(tests/data/sglang/startup_cases.json), is the oracle: the prediction must give the same verdict (error /
no error) and the same value for every key in `resolved` (tests/test_sglang_startup.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.adaptive import SGLANG_DEFAULT_CONFIG
from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.loader import read_text
from specctl.schemas.sglang.command import SGLangCommand
from specctl.schemas.sglang.families import POOL_MLA, SGLangModel

GPUS = ("H100", "H200", "B200")
DEFAULT_RELEASE = "0.5.23"
_SM = {"H100": 90, "H200": 90, "B200": 100}

_START = "at start-up"
for _doc in (
    ("SGL300", "SGLang refuses the command at start-up", "error",
     "One of SGLang's own start-up checks (ServerArgs post-init and the resolution hooks: speculative "
     "decoding, PD disaggregation, model overrides) refuses this combination of flags, environment and model.",
     _START + ": ValueError from ServerArgs (the message is quoted in the finding)",
     "change the flag the finding names", "", ""),
    ("SGL301", "only some of the speculative step parameters given", "error",
     "Without --speculative-adaptive, SGLang auto-chooses --speculative-num-steps, --speculative-eagle-topk and "
     "--speculative-num-draft-tokens together, only when none of them is given; giving topk or draft tokens "
     "without steps trips its assertion, and steps without topk leaves topk unset.",
     _START + ": AssertionError in _handle_eagle_family (or a TypeError comparing topk None)",
     "give --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens together, or none",
     "--speculative-eagle-topk 4", "--speculative-num-steps 3 --speculative-eagle-topk 4 "
     "--speculative-num-draft-tokens 8"),
    ("SGL302", "--speculative-eagle-topk > 1 on an attention backend that drafts chains only", "error",
     "trtllm_mha verifies only chains (topk 1); with --page-size > 1 a draft tree needs flashinfer, fa3 or triton.",
     _START + ": 'trtllm_mha backend only supports topk = 1 for speculative decoding.' / 'speculative_eagle_topk "
     "> 1 with page_size > 1 is only supported on (flashinfer, fa3, triton)'",
     "use --speculative-eagle-topk 1, or another --attention-backend",
     "--attention-backend trtllm_mha --speculative-eagle-topk 4", "--attention-backend trtllm_mha "
     "--speculative-eagle-topk 1"),
    ("SGL303", "decode radix cache with something it cannot work with", "error",
     "--disaggregation-decode-enable-radix-cache refuses --enable-hisparse, the fake transfer backend and "
     "speculative algorithms other than EAGLE/EAGLE3/NEXTN/DSPARK.",
     _START + ": '--disaggregation-decode-enable-radix-cache is incompatible with ...'",
     "drop --disaggregation-decode-enable-radix-cache, or the flag it conflicts with",
     "--disaggregation-mode decode --disaggregation-decode-enable-radix-cache --speculative-algorithm NGRAM",
     "--disaggregation-mode decode --speculative-algorithm NGRAM"),
    ("SGL304", "SGLANG_ENABLE_SPEC_V2=1 with --speculative-eagle-topk > 1", "error",
     "SGLang 0.5.7 to 0.5.10 refuse spec v2 (the overlap scheduler for EAGLE) with a draft tree; later releases "
     "ignore the variable (spec v2 is the only path and chooses itself).",
     _START + " (0.5.7-0.5.10): 'Spec v2 currently only supports topk = 1 for speculative decoding.'",
     "use --speculative-eagle-topk 1, or unset SGLANG_ENABLE_SPEC_V2",
     "SGLANG_ENABLE_SPEC_V2=1 ... --speculative-eagle-topk 4", "SGLANG_ENABLE_SPEC_V2=1 ... "
     "--speculative-eagle-topk 1"),
    ("SGL305", "Gemma 4 assistant draft with EAGLE3", "error",
     "A Gemma4AssistantForCausalLM draft runs as FROZEN_KV_MTP, promoted from NEXTN or EAGLE; EAGLE3 is refused.",
     _START + ": 'Gemma4AssistantForCausalLM draft requires --speculative-algorithm NEXTN or EAGLE; EAGLE3 is "
     "not supported for this draft architecture.'",
     "use --speculative-algorithm EAGLE (or NEXTN)", "--speculative-algorithm EAGLE3",
     "--speculative-algorithm EAGLE"),
    ("SGL306", "draft window or sink size out of range", "error",
     "--speculative-draft-window-size must be positive; --speculative-draft-sink-size non-negative and only with "
     "a window; for DFLASH the window must hold the block.",
     _START + ": '--speculative-draft-window-size must be positive, got 0.'",
     "give a positive --speculative-draft-window-size, or drop it", "--speculative-draft-window-size 0",
     "--speculative-draft-window-size 1024"),
    ("SGL307", "speculative algorithm not supported on this device or layout", "error",
     "DFLASH runs on CUDA, NPU and XPU; DSPARK on CUDA, NPU, XPU; UNO on CUDA; NGRAM on CUDA, CPU, XPU; "
     "several refuse DP attention or pipeline parallelism.",
     _START + ": 'DFLASH speculative decoding is not supported by ... on device ...'",
     "run on a supported --device, or choose another --speculative-algorithm", "--device cpu "
     "--speculative-algorithm DFLASH", "--device cuda --speculative-algorithm DFLASH"),
    ("SGL308", "Kimi-K3 DCP + DSPARK without SGLANG_RAGGED_VERIFY_MODE=static", "error",
     "Kimi-K3 with --dcp-size > 1 and DSPARK is validated only with the static ragged-verify mode.",
     _START + ": 'Kimi-K3 DCP + DSPARK currently requires SGLANG_RAGGED_VERIFY_MODE=static; compact/cap-accept are "
     "not validated under DCP'", "set SGLANG_RAGGED_VERIFY_MODE=static (or unset it: static is the default)",
     "SGLANG_RAGGED_VERIFY_MODE=compact ... --dcp-size 8 --speculative-algorithm DSPARK",
     "SGLANG_RAGGED_VERIFY_MODE=static ... --dcp-size 8 --speculative-algorithm DSPARK"),
    ("SGL309", "adaptive initial steps not a candidate", "error",
     "With --speculative-adaptive, --speculative-num-steps must be one of the adaptive config's candidate_steps "
     "(their union over batch-size buckets).",
     _START + ": '--speculative-num-steps=N is not in the adaptive config candidate_steps [...]. Pass one of "
     "those values.'", "pass one of the candidate steps, or drop --speculative-num-steps (SGLang takes the middle)",
     "--speculative-adaptive --speculative-num-steps 4", "--speculative-adaptive --speculative-num-steps 3"),
    ("SGL310", "a value SGLang resolves silently", "info",
     "SGLang replaces or fills values at start-up without failing: NEXTN becomes EAGLE, a Gemma 4 assistant "
     "draft makes it FROZEN_KV_MTP, MTP models draft with their own head (the draft path defaults to the "
     "model), DFLASH/DSPARK force one step and topk 1, --speculative-num-draft-tokens follows steps + 1 at "
     "topk 1, the attention backend and page size are chosen per GPU, --max-running-requests becomes 48.",
     "never: silently (SGLang logs the change)", "write the value SGLang resolves, to say so", "", ""),
):
    register(RuleDoc(*_doc))

# speculative_hook._handle_eagle_family: the draft defaults to the target (built-in MTP/NextN head)
MTP_DEFAULT_DRAFT_ARCHS = frozenset({
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
    "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
    "HYV3ForCausalLM", "HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration",
})
# configs/model_config.py: a draft worker loading one of these with no draft path (ModelConfig falls back to
# --model-path) runs the checkpoint's own MTP/NextN head (the architecture is swapped for its MTP variant)
MTP_SELF_DRAFT_ARCHS = MTP_DEFAULT_DRAFT_ARCHS | frozenset({
    "GlmOcrForConditionalGeneration", "MiMoForCausalLM", "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM",
    "Step3p5ForCausalLM", "Qwen3NextForCausalLM", "Qwen3MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM", "NemotronHForCausalLM",
    "NemotronHPuzzleForCausalLM", "HYV3ForCausalLM", "HYV4ForCausalLM", "Dots3NoteForCausalLM",
})
# _auto_choose_speculative_params: (steps, topk, draft tokens); every other architecture gets (3, 1, 4)
_AUTO_5_4_8 = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})
GEMMA4_ASSISTANT_ARCHS = frozenset({"Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM"})
# Architectures with a model-override hook that may choose backends/page size itself (arg_groups/model_overrides,
# overrides.py): their attention backend and page size are not predicted here.
_OWN_BACKEND_ARCHS = frozenset({
    "BailingMoeV3ForCausalLM", "BeamForCausalLM", "Cohere2MoeForCausalLM", "DeepseekV32ForCausalLM",
    "DeepseekV4ForCausalLM", "Exaone4ForCausalLM", "ExaoneMoEForCausalLM", "FalconH1ForCausalLM",
    "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Gemma3nForCausalLM",
    "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "GlmMoeDsaForCausalLM", "GptOssForCausalLM",
    "GraniteMoeHybridForCausalLM", "HYV4ForCausalLM", "IQuestQ1ForCausalLM", "KimiK25ForConditionalGeneration",
    "KimiK3ForConditionalGeneration", "Lfm2ForCausalLM", "Llama4ForCausalLM", "Llama4ForConditionalGeneration",
    "MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM", "MiniCPMForCausalLM", "MiniCPMSALAForCausalLM",
    "MiniMaxM2ForCausalLM", "MiniMaxM3SparseForCausalLM", "MistralLarge3ForCausalLM", "NemotronHForCausalLM",
    "Olmo2ForCausalLM", "PixtralForConditionalGeneration", "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration", "JetNemotronForCausalLM",
})
_PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
# model_overrides/gpt_oss.py and gemma4.py choose the backend (SM100, SM90) and model_hook.py accepts only these
_MODEL_BACKENDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "GptOssForCausalLM": ("trtllm_mha", "fa3", ("triton", "trtllm_mha", "fa3", "fa4", "ascend", "intel_amx",
                                                "intel_xpu", "aiter")),
    **{a: ("trtllm_mha", "triton", ("trtllm_mha", "triton", "fa4", "ascend", "intel_xpu", "intel_amx", "aiter"))
       for a in ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4UnifiedForConditionalGeneration")},
}
# dspark_config.py: DEFAULT_DSPARK_GAMMA, and the target config keys that mark a bundled DSpark draft head
DEFAULT_DSPARK_GAMMA = 7
_DSPARK_BUNDLE_KEYS = ("dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids")
_RAGGED_MODES = ("static", "cap-accept", "compact")
# managers/disagg_service.rust_server_serves_kv_bootstrap: the backends without a bootstrap server of their own
_RUST_BOOTSTRAP_BACKENDS = ("mooncake", "nixl", "mori", "fake")
_DEFAULT_BOOTSTRAP_PORT = 8998
_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")
# Releases that refuse SGLANG_ENABLE_SPEC_V2=1 with topk > 1 (read from each release's server_args.py); from
# 0.5.21 on the variable is not read at all.
_SPEC_V2_TOPK_RELEASES = ("0.5.7", "0.5.8", "0.5.9", "0.5.10")


@dataclass(frozen=True)
class Startup:
    errors: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()
    resolved: Mapping[str, Any] = field(default_factory=dict)


def read_config(path: object) -> dict[str, Any] | None:
    """A model directory's config.json when it is readable on this host, else None."""
    if not isinstance(path, str) or not path:
        return None

    p = Path(path).expanduser() / "config.json"
    try:
        data = json.loads(read_text(p))
    except (UsageError, ValueError, RecursionError, OSError):
        return None
    return data if isinstance(data, dict) else None


def architectures(cfg: Mapping[str, Any] | None) -> tuple[str, ...]:
    archs = cfg.get("architectures") if cfg else None
    return tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ()


def mtp_layers(cfg: Mapping[str, Any] | None) -> int:
    """How many MTP/NextN layers the checkpoint ships (0 when none or unknown)."""
    if not cfg:
        return 0
    tc = cfg.get("text_config")
    for c in (cfg, tc if isinstance(tc, Mapping) else {}):
        for key in _MTP_KEYS:
            v = c.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return 0


def has_mtp_head(arch: str, cfg: Mapping[str, Any] | None) -> bool:
    """Whether SGLang drafts with the checkpoint's own MTP/NextN head when no draft path is given."""
    return arch in MTP_SELF_DRAFT_ARCHS or mtp_layers(cfg) > 0


def release_key(release: str) -> tuple[int, ...]:
    out = []
    for part in release.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def _env_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


class _Run:
    """One prediction: the command's values as SGLang resolves them, and the findings on the way."""

    def __init__(self, cmd: SGLangCommand, model: SGLangModel | None, gpu: str, release: str,
                 target_cfg: dict[str, Any] | None, draft_cfg: dict[str, Any] | None) -> None:
        self.cmd, self.model, self.gpu, self.release = cmd, model, gpu, release
        self.sm = _SM.get(gpu, 90)
        self.env = dict(cmd.env)
        self.target_cfg, self.draft_cfg = target_cfg, draft_cfg
        self.values: dict[str, Any] = {}
        self.resolved: dict[str, Any] = {}
        self.errors: list[Finding] = []
        self.warnings: list[Finding] = []

    # -- values ---------------------------------------------------------------------------------

    def v(self, dest: str) -> Any:
        if dest in self.values:
            return self.values[dest]
        return self.cmd.value(dest)

    def set(self, dest: str, value: Any) -> None:
        self.values[dest] = value
        self.resolved[dest] = value

    @property
    def arch(self) -> str:
        if self.model is not None:
            return self.model.architecture
        archs = architectures(self.target_cfg)
        return archs[0] if archs else "?"

    @property
    def device(self) -> str:
        d = self.v("device")
        return d if isinstance(d, str) and d else "cuda"

    @property
    def attn_dp(self) -> int:
        n = self.v("attn_dp_size")
        return n if isinstance(n, int) and n > 0 else 1

    # -- findings -------------------------------------------------------------------------------

    def _finding(self, code: str, sev: str, dest: str, msg: str, fix: str) -> Finding:
        line, col = self.cmd.where(dest)
        path = self.cmd.flag_name(dest) if not dest.startswith("$") else dest
        return Finding(code, sev, path, msg, fix, line, col)  # type: ignore[arg-type]

    def error(self, code: str, dest: str, quote: str, fix: str, *, why: str = "") -> None:
        lead = f"{why}; " if why else ""
        self.errors.append(self._finding(code, "error", dest, f"{lead}SGLang {self.release} refuses it at start-up: "
                                         f"'{quote}'", fix))

    def note(self, code: str, dest: str, msg: str, fix: str, *, severity: str = "info") -> None:
        if not self.errors:  # SGLang stops at its first error: it never resolves (or logs) what comes later
            self.warnings.append(self._finding(code, severity, dest, msg, fix))

    def env_finding(self, code: str, var: str, msg: str, fix: str, *, severity: str = "error") -> None:
        f = Finding(code, severity, var, msg, fix, self.cmd.first_line, None)  # type: ignore[arg-type]
        (self.errors if severity == "error" else self.warnings).append(f)


def _model_type(r: _Run) -> None:
    """SGLang reads config.json with Transformers' AutoConfig: specctl's own builtin models (model_type
    specctl_*) are no Transformers architecture and carry no auto_map, so SGLang cannot load them."""
    cfg = r.target_cfg or {}
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt.startswith("specctl") and "auto_map" not in cfg:
        r.error("SGL300", "model_path", f"The checkpoint you are trying to load has model type `{mt}` but "
                "Transformers does not recognize this architecture.",
                "serve a Hugging Face model directory with SGLang; specctl's builtin models run on its own engine "
                "(engine: builtin)", why=f"{r.v('model_path')} is a specctl builtin model")


def _dp_attention(r: _Run) -> None:
    """parallel_hook.handle_deprecated_dp_attention: --dp-size N --enable-dp-attention is --attn-dp-size N."""
    if r.v("enable_dp_attention"):
        if r.attn_dp == 1:
            r.set("attn_dp_size", r.v("dp_size"))
            r.set("dp_size", 1)
    if r.attn_dp > 1 and isinstance(r.v("dp_size"), int) and r.v("dp_size") > 1:
        r.error("SGL300", "dp_size", f"--dp-size {r.v('dp_size')} with --attn-dp-size {r.attn_dp}: data-parallel "
                "replicas combined with attention data parallelism are not supported.",
                "keep one of --dp-size / --attn-dp-size")
    if r.attn_dp > 1:
        r.set("enable_dp_attention", True)  # ServerArgs.resolved_dict reports it whenever attention DP runs
    cp = r.v("attn_cp_size")
    tp = r.v("tp_size")
    if isinstance(cp, int) and cp > 0 and isinstance(tp, int) and tp % cp:
        r.error("SGL300", "attn_cp_size", "tp_size must be divisible by attn_cp_size",
                f"use an --attn-cp-size that divides --tp-size {tp}")


def _pd(r: _Run) -> None:
    """pd_disaggregation_hook.handle_pd_disaggregation."""
    mode = r.v("disaggregation_mode")
    backend = r.v("disaggregation_transfer_backend")
    if backend == "mooncake_tcp":
        r.set("disaggregation_transfer_backend", "mooncake")
        r.env.setdefault("MC_FORCE_TCP", "1")
        backend = "mooncake"
    thr = r.v("disaggregation_decode_host_receive_threshold")
    if isinstance(thr, (int, float)):
        if not 0 <= thr <= 1:
            r.error("SGL300", "disaggregation_decode_host_receive_threshold",
                    "--disaggregation-decode-host-receive-threshold must be between 0 and 1",
                    "give --disaggregation-decode-host-receive-threshold a value in 0..1")
        elif thr < 1 and (r.v("enable_hisparse") or r.v("enable_pd_role_switch")):
            r.error("SGL300", "disaggregation_decode_host_receive_threshold",
                    "Decode host receive does not yet support HiSparse or role switching",
                    "drop --disaggregation-decode-host-receive-threshold, or --enable-hisparse / "
                    "--enable-pd-role-switch")
        elif thr < 1 and r.v("disaggregation_decode_retraction_backup") == "cpu_tensor":
            r.error("SGL300", "disaggregation_decode_retraction_backup", "Decode host KV buffering requires host_pool "
                    "retraction", "use --disaggregation-decode-retraction-backup host_pool")
    dcp = r.v("dcp_size")
    if mode == "decode" and isinstance(dcp, int) and dcp > 1 and backend not in (
            "mooncake", "nixl", "mori", "ascend", "fake"):
        r.error("SGL300", "disaggregation_transfer_backend",
                "PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, mori, ascend, or fake for "
                f"synthetic benchmarking, got {backend!r}.", "use --disaggregation-transfer-backend mooncake")
    if mode == "decode":
        if r.v("disaggregation_decode_enable_radix_cache"):
            rel = release_key(r.release)
            allowed = ("nixl",) if rel < (0, 5, 12) else ("nixl", "mooncake") if rel < (0, 5, 14) else None
            if allowed is not None and backend not in allowed:
                r.error("SGL303", "disaggregation_decode_enable_radix_cache", "--disaggregation-decode-enable-radix-"
                        f"cache currently requires --disaggregation-transfer-backend {' or '.join(allowed)}",
                        f"use --disaggregation-transfer-backend {allowed[0]} on both sides")
            if r.v("enable_hisparse"):
                r.error("SGL303", "disaggregation_decode_enable_radix_cache",
                        "--disaggregation-decode-enable-radix-cache is incompatible with --enable-hisparse",
                        "drop --disaggregation-decode-enable-radix-cache or --enable-hisparse")
            if backend == "fake":
                r.error("SGL303", "disaggregation_decode_enable_radix_cache",
                        "--disaggregation-decode-enable-radix-cache is incompatible with "
                        "--disaggregation-transfer-backend fake",
                        "drop --disaggregation-decode-enable-radix-cache, or use a real transfer backend")
            r.set("disable_radix_cache", False)
        else:
            r.set("disable_radix_cache", True)
    elif mode == "prefill" and backend == "fake":
        r.error("SGL105", "disaggregation_transfer_backend",
                "Prefill server does not support 'fake' as the transfer backend",
                "use --disaggregation-transfer-backend mooncake (or the backend decode uses)")
    if mode == "prefill" and _env_true(r.env.get("SGLANG_RUST_SERVER")) and backend in _RUST_BOOTSTRAP_BACKENDS:
        port, api = r.v("disaggregation_bootstrap_port"), r.v("port")
        if port not in (_DEFAULT_BOOTSTRAP_PORT, api):
            r.error("SGL300", "disaggregation_bootstrap_port", "SGLANG_RUST_SERVER serves the PD KV bootstrap registry "
                    f"on the api port itself; --disaggregation-bootstrap-port {port} conflicts with --port {api}.",
                    "drop --disaggregation-bootstrap-port (decode and the router then target the prefill api port)")
    if mode in ("prefill", "decode") and _env_true(r.env.get("SGLANG_DISAGG_STAGING_BUFFER")) \
            and backend not in ("mooncake", "nixl"):
        r.env_finding("SGL300", "SGLANG_DISAGG_STAGING_BUFFER",
                      f"SGLang {r.release} refuses it at start-up: 'SGLANG_DISAGG_STAGING_BUFFER requires "
                      f"disaggregation_transfer_backend='mooncake' or 'nixl', got '{backend}'.'",
                      "unset SGLANG_DISAGG_STAGING_BUFFER, or use --disaggregation-transfer-backend mooncake")
    if mode in ("prefill", "decode") and r.v("enable_pd_role_switch"):
        bad = []
        if isinstance(r.v("pp_size"), int) and r.v("pp_size") > 1:
            bad.append(f"pipeline parallelism (--pp-size {r.v('pp_size')})")
        if isinstance(dcp, int) and dcp > 1:
            bad.append(f"decode context parallelism (--dcp-size {dcp})")
        if r.v("moe_a2a_backend") not in (None, "none"):
            bad.append(f"MoE all-to-all (--moe-a2a-backend {r.v('moe_a2a_backend')})")
        if r.v("speculative_algorithm") is not None:
            bad.append(f"speculative decoding (--speculative-algorithm {str(r.v('speculative_algorithm')).upper()})")
        if bad:
            r.error("SGL300", "enable_pd_role_switch", "--enable-pd-role-switch does not rebuild role-specific state "
                    f"for the following features: {', '.join(bad)}. Remove these options or drop "
                    "--enable-pd-role-switch.", "drop --enable-pd-role-switch")
    if r.v("disaggregation_decode_allocation_policy") == "prefill_complete":
        bad = []
        if mode not in ("prefill", "decode"):
            bad.append("aggregated serving")
        if backend != "mooncake":
            bad.append("transfer backends other than Mooncake")
        if any(isinstance(r.v(k), int) and r.v(k) != 1 for k in ("pp_size", "attn_cp_size", "dcp_size")):
            bad.append("pipeline or attention context parallelism")
        if r.v("tp_size") != r.attn_dp:
            bad.append("attention tensor parallelism greater than one")
        if r.v("enable_hisparse"):
            bad.append("HiSparse")
        if mode == "decode" and (r.v("disaggregation_decode_enable_radix_cache")
                                 or r.v("enable_hierarchical_cache")):
            bad.append("decode radix cache or decode HiCache")
        if bad:
            r.error("SGL300", "disaggregation_decode_allocation_policy",
                    "--disaggregation-decode-allocation-policy prefill_complete does not yet support "
                    + ", ".join(bad), "use --disaggregation-decode-allocation-policy early (the default)")


def _kimi_k3(r: _Run) -> None:
    """model_overrides/kimi_k3.py: DCP + DSPARK needs the static ragged-verify mode; DCP decodes on cutedsl_mla
    or aiter only."""
    if r.arch != "KimiK3ForConditionalGeneration":
        return
    dcp = r.v("dcp_size")
    algo = str(r.v("speculative_algorithm") or "").upper()
    if isinstance(dcp, int) and dcp > 1 and algo == "DSPARK":
        mode = r.env.get("SGLANG_RAGGED_VERIFY_MODE", "static")
        if mode != "static":
            r.env_finding("SGL308", "SGLANG_RAGGED_VERIFY_MODE",
                          f"SGLANG_RAGGED_VERIFY_MODE={mode} with --dcp-size {dcp} and --speculative-algorithm DSPARK "
                          f"on Kimi-K3: SGLang {r.release} refuses it at start-up: 'Kimi-K3 DCP + DSPARK currently "
                          "requires SGLANG_RAGGED_VERIFY_MODE=static; compact/cap-accept are not validated under DCP "
                          f"(got {mode!r}).'", "set SGLANG_RAGGED_VERIFY_MODE=static (the default), or --dcp-size 1")
            return
    if isinstance(dcp, int) and dcp > 1:
        decode = r.v("decode_attention_backend") or r.v("attention_backend")
        if decode not in (None, "cutedsl_mla", "aiter"):
            dest = "decode_attention_backend" if r.v("decode_attention_backend") else "attention_backend"
            r.error("SGL300", dest, "Decode attention backend for Kimi-K3 DCP must be 'cutedsl_mla' or 'aiter', got "
                    f"{decode!r}.", "use --decode-attention-backend cutedsl_mla (or drop it: SGLang picks it)")


# pd_disaggregation_hook.handle_encoder_disaggregation: the architectures encoder disaggregation serves
ENCODER_DISAGG_ARCHS = frozenset({
    "Qwen2VLForConditionalGeneration", "Qwen3VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration", "Qwen2_5OmniForConditionalGeneration", "Dots3NoteForCausalLM",
    "KimiVLForConditionalGeneration", "KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration",
    "MiMoV2ForCausalLM", "Glm5NextForConditionalGeneration", "MiniMaxM3SparseForConditionalGeneration",
    "MuseSparkForConditionalGeneration",
})


def _encoder(r: _Run) -> None:
    """pd_disaggregation_hook.handle_encoder_disaggregation."""
    enc, lang = bool(r.v("encoder_only")), bool(r.v("language_only"))
    if r.v("enable_prefix_mm_cache") and not enc:
        r.error("SGL300", "enable_prefix_mm_cache", "--enable-prefix-mm-cache requires --encoder-only to be enabled",
                "add --encoder-only, or drop --enable-prefix-mm-cache")
    if enc and lang:
        r.error("SGL300", "language_only", "Cannot set --encoder-only and --language-only together",
                "keep one of --encoder-only / --language-only")
    if enc and r.v("disaggregation_mode") not in (None, "null"):
        r.error("SGL300", "encoder_only", "Cannot set --encoder-only and --disaggregation-mode prefill/decode "
                "together", "drop --encoder-only or --disaggregation-mode")
    if (enc or lang) and r.target_cfg is not None and r.arch not in ENCODER_DISAGG_ARCHS:
        r.error("SGL300", "encoder_only" if enc else "language_only", f"Model type {r.arch} is not supported for "
                "encoder disaggregation.", "serve a supported multimodal model (Qwen2-VL, Qwen3-VL, Qwen3.5, Kimi "
                "...), or drop --encoder-only / --language-only")
    elif lang and r.arch == "MuseSparkForConditionalGeneration" and r.v("enable_adaptive_dispatch_to_encoder"):
        r.error("SGL300", "enable_adaptive_dispatch_to_encoder", "Muse language-only servers do not load local "
                "encoders; --enable-adaptive-dispatch-to-encoder is not supported.",
                "drop --enable-adaptive-dispatch-to-encoder")


# configs/model_config.is_deepseek_dsa: these architectures with index_topk in config.json run DSA attention
_DSA_ARCHS = frozenset({
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
    "GlmMoeDsaForCausalLM", "Glm5NextForConditionalGeneration", "LongcatFlashForCausalLM", "Dots3NoteForCausalLM",
    "HYV4ForCausalLM",
})


def _deepseek_dsa(r: _Run) -> None:
    """model_overrides/deepseek_v2.py: HYV4 without context parallelism; DSA with decode context parallelism
    (and a pooled index key) or prefill CP."""
    cfg: Mapping[str, Any] = r.target_cfg or {}
    sub = cfg.get("text_config")
    tc: Mapping[str, Any] = sub if isinstance(sub, Mapping) else cfg
    dcp = r.v("dcp_size")
    if r.arch in ("HYV4ForCausalLM", "HYV4ForCausalLMNextN"):
        if r.v("enable_prefill_cp"):
            r.error("SGL300", "enable_prefill_cp", "--enable-prefill-cp is not supported for HYV4 because its "
                    "attention path does not implement DSA context-parallel metadata and sharding. Got "
                    f"architecture={r.arch!r} and enable_prefill_cp=True.", "drop --enable-prefill-cp")
            return
        if isinstance(dcp, int) and dcp > 1:
            r.error("SGL300", "dcp_size", "--dcp-size > 1 is not supported for HYV4 because decode context "
                    "parallelism gathers query heads across DCP ranks but does not provide single-owner semantics "
                    f"for learnable attention sinks. Got architecture={r.arch!r} and dcp_size={dcp!r}.",
                    "use --dcp-size 1")
            return
    if r.arch not in _DSA_ARCHS or (cfg.get("index_topk") is None and tc.get("index_topk") is None):
        return
    before = len(r.errors)
    if isinstance(dcp, int) and dcp > 1:
        topk = r.v("speculative_eagle_topk")
        if r.v("enable_hisparse") or r.v("enable_hierarchical_cache"):
            r.error("SGL300", "dcp_size", "DSA DCP does not support HiSparse or HiCache.",
                    "drop --enable-hisparse / --enable-hierarchical-cache, or use --dcp-size 1")
        elif r.v("disaggregation_mode") not in (None, "null"):
            r.error("SGL300", "dcp_size", "DSA DCP does not support PD disaggregation.", "use --dcp-size 1")
        elif topk not in (None, 1):
            r.error("SGL300", "speculative_eagle_topk", "DSA DCP requires --speculative-eagle-topk 1.",
                    "use --speculative-eagle-topk 1")
    if r.v("enable_prefill_cp") and r.device == "cuda":
        tp = r.v("tp_size")
        if isinstance(tp, int) and tp > 8:
            r.error("SGL300", "tp_size", "Context parallel only supports single machine (tp_size <= 8). "
                    "Cross-machine CP has precision issues.", "use --tp-size 8 or less with --enable-prefill-cp")
    kpool = cfg.get("index_kpool", 1)
    if len(r.errors) == before and r.device == "cuda" and isinstance(kpool, int) and kpool > 1 \
            and isinstance(dcp, int) and dcp > 1:
        r.error("SGL300", "dcp_size", f"--dcp-size > 1 is not supported for DSA with index_kpool={kpool}: a pooled "
                "index key spans positions owned by different DCP ranks.", "use --dcp-size 1")


def _ernie45_vl(r: _Run) -> None:
    """model_overrides/ernie45_vl.py: attention heads split over the full TP group, so no attention DP."""
    if r.arch == "Ernie4_5_VLMoeForConditionalGeneration" and r.attn_dp > 1:
        r.error("SGL300", "enable_dp_attention" if r.cmd.given("enable_dp_attention") else "attn_dp_size",
                "ERNIE 4.5 VL MoE does not support DP attention: its attention heads are split over the full TP "
                "group.", "drop attention DP (--enable-dp-attention / --attn-dp-size)")


def _minicpm(r: _Run) -> None:
    """model_overrides/minicpm.py: MiniCPM SALA (lightning / sparse attention layers)."""
    if r.arch not in ("MiniCPMForCausalLM", "MiniCPMSALAForCausalLM"):
        return
    if r.attn_dp > 1:
        r.error("SGL300", "enable_dp_attention" if r.cmd.given("enable_dp_attention") else "attn_dp_size",
                "MiniCPM does not support DP attention", "drop attention DP")
        return
    cfg = r.target_cfg or {}
    raw_mixers = cfg.get("mixer_types")
    mixers: list[Any] = raw_mixers if isinstance(raw_mixers, list) else []
    sparse = cfg.get("sparse_config") is not None and "minicpm4" in mixers
    if (sparse or "lightning-attn" in mixers) and r.v("enable_hierarchical_cache"):
        r.error("SGL300", "enable_hierarchical_cache", "MiniCPM SALA does not support hierarchical cache",
                "drop --enable-hierarchical-cache")
        return
    backends = [r.v(d) for d in ("attention_backend", "prefill_attention_backend", "decode_attention_backend")]
    sparse_backend = all(b is None for b in backends) or any(
        b in ("minicpm_flashattn", "minicpm_flashinfer") for b in backends)
    if sparse and not _env_true(r.env.get("SGLANG_MINICPM_FORCE_DENSE")) and sparse_backend \
            and r.v("disaggregation_mode") not in (None, "null"):
        r.error("SGL300", "disaggregation_mode", "MiniCPM sparse attention does not support PD disaggregation",
                "serve MiniCPM SALA colocated, or set SGLANG_MINICPM_FORCE_DENSE=1")


def _iquest(r: _Run) -> None:
    """model_overrides/iquest_q1.py: FA3 only, EAGLE/NEXTN chains, no CP/DP attention/PP."""
    if r.arch not in ("IQuestQ1ForCausalLM", "IQuestQ1MTP"):
        return
    algo = str(r.v("speculative_algorithm") or "").upper()
    topk = r.v("speculative_eagle_topk")
    checks: tuple[tuple[bool, str, str, str], ...] = (
        (any(r.v(d) not in (None, "fa3") for d in ("attention_backend", "prefill_attention_backend",
                                                   "decode_attention_backend")), "attention_backend",
         "IQuestQ1 applies its attention sink from the softmax LSE and requires FA3 attention for both prefill and "
         "decode.", "use --attention-backend fa3"),
        (bool(algo) and algo not in ("EAGLE", "NEXTN"), "speculative_algorithm",
         "IQuest Q1 MTP requires serial EAGLE or NEXTN drafting.", "use --speculative-algorithm EAGLE"),
        (bool(algo) and r.v("speculative_draft_attention_backend") not in (None, "fa3"),
         "speculative_draft_attention_backend", "IQuestQ1 requires FA3 attention for the MTP draft.",
         "use --speculative-draft-attention-backend fa3"),
        (r.v("attn_cp_size") != 1 or r.v("dcp_size") != 1 or bool(r.v("enable_prefill_cp")), "attn_cp_size",
         "IQuestQ1 does not support context parallelism.", "drop context parallelism"),
        (isinstance(topk, int) and topk > 1, "speculative_eagle_topk",
         "IQuestQ1 speculative decoding requires --speculative-eagle-topk 1.", "use --speculative-eagle-topk 1"),
        (bool(r.v("enable_multi_layer_eagle")), "enable_multi_layer_eagle",
         "IQuest Q1 MTP drafting does not support multi-layer EAGLE.", "drop --enable-multi-layer-eagle"),
        (r.attn_dp > 1, "attn_dp_size", "IQuest Q1 does not support DP attention.", "drop attention DP"),
        (r.v("pp_size") != 1, "pp_size", "IQuest Q1 does not support pipeline parallelism.", "use --pp-size 1"),
    )
    for bad, dest, quote, fix in checks:
        if bad:
            r.error("SGL300", dest, quote, fix)
            return
    if not any(r.v(d) for d in ("attention_backend", "prefill_attention_backend", "decode_attention_backend")):
        r.set("attention_backend", "fa3")



def _minimax_m3_quantization(r: _Run) -> str | None:
    """model_overrides/minimax_m3.py: the quantization SGLang serves a MiniMax-M3 checkpoint with; an mxfp8
    declaration whose MoE fields name NVFP4 packed experts is served as minimax_m3_nvfp4."""
    given = r.v("quantization")
    if given is not None:
        return None if given == "unquant" else str(given)
    raw = (r.target_cfg or {}).get("quantization_config")
    qc: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    method = qc.get("quant_method") if isinstance(raw, Mapping) else None
    if method == "mxfp8" and str(qc.get("moe_quant_algo", "")).upper() == "NVFP4" \
            and qc.get("moe_quant_format") == "nvfp4-pack-quantized":
        return "minimax_m3_nvfp4"
    return method if isinstance(method, str) else None


def _minimax_m3(r: _Run) -> None:
    """model_overrides/minimax_m3.py: M3.1 NVFP4 (packed NVFP4 experts) serves only DSPARK/DFLASH speculation on
    Blackwell, with page size 128, fp8_e4m3 KV cache and the megamoe all-to-all there."""
    if r.arch not in ("MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration") \
            or _minimax_m3_quantization(r) != "minimax_m3_nvfp4":
        return
    blackwell, before = r.sm >= 100, len(r.errors)
    algo = str(r.v("speculative_algorithm") or "").upper()
    if algo and algo not in ("DSPARK", "DFLASH"):
        r.error("SGL300", "speculative_algorithm", "M3.1 NVFP4 only supports DSPARK or DFLASH speculation",
                "use --speculative-algorithm DSPARK (or DFLASH), or drop speculative decoding")
        return
    if algo:
        archs = architectures(r.target_cfg)
        first = archs[0] if archs else r.arch
        mode = r.env.get("SGLANG_RAGGED_VERIFY_MODE", "static")
        if first != "MiniMaxM3SparseForConditionalGeneration":
            r.error("SGL300", "model_path", f"M3.1 NVFP4 {algo} requires MiniMaxM3SparseForConditionalGeneration, "
                    f"got {first}", "serve the vision-language checkpoint (MiniMaxM3SparseForConditionalGeneration), "
                    "or drop --speculative-algorithm")
        elif not blackwell:
            r.error("SGL300", "speculative_algorithm", f"M3.1 NVFP4 {algo} requires Blackwell",
                    f"serve {algo} on a Blackwell GPU (B200), or drop --speculative-algorithm")
        elif mode != "static":
            r.env_finding("SGL300", "SGLANG_RAGGED_VERIFY_MODE", f"SGLANG_RAGGED_VERIFY_MODE={mode} with "
                          f"--speculative-algorithm {algo} on MiniMax-M3 NVFP4: SGLang {r.release} refuses it at "
                          f"start-up: 'M3.1 NVFP4 {algo} requires SGLANG_RAGGED_VERIFY_MODE=static'",
                          "set SGLANG_RAGGED_VERIFY_MODE=static (the default)")
        elif r.v("pp_size") != 1:
            r.error("SGL300", "pp_size", f"M3.1 NVFP4 {algo} requires PP=1", "use --pp-size 1")
        elif algo == "DFLASH" and r.v("disaggregation_mode") not in (None, "null"):
            r.error("SGL300", "disaggregation_mode", "M3.1 NVFP4 DFLASH currently requires colocated serving",
                    "drop --disaggregation-mode, or use --speculative-algorithm DSPARK")
        if len(r.errors) > before:
            return
    page = r.v("page_size")
    if page not in (None, 128):
        r.error("SGL300", "page_size", "M3.1 NVFP4 requires --page-size 128", "use --page-size 128, or drop it")
        return
    runner, a2a = r.v("moe_runner_backend"), r.v("moe_a2a_backend")
    if runner == "megamoe":  # mega_moe_hook: --moe-runner-backend megamoe is --moe-a2a-backend megamoe
        runner, a2a = "auto", "megamoe"
    no_backend = all(r.v(d) is None for d in ("attention_backend", "prefill_attention_backend",
                                              "decode_attention_backend"))
    if not blackwell:
        r.set("page_size", 128)
        if runner == "auto":
            r.set("moe_runner_backend", "marlin")
        if no_backend:
            r.set("attention_backend", "fa3")
        return
    if a2a not in ("none", "megamoe"):
        if runner == "flashinfer_trtllm_routed":
            r.error("SGL300", "moe_a2a_backend", "M3.1 NVFP4 flashinfer_trtllm_routed requires --moe-a2a-backend "
                    "none or megamoe", "use --moe-a2a-backend megamoe (or none)")
        else:
            r.error("SGL300", "moe_a2a_backend", "M3.1 NVFP4 requires --moe-a2a-backend megamoe",
                    "use --moe-a2a-backend megamoe, or drop it")
        return
    if runner != "flashinfer_trtllm_routed":
        r.set("moe_a2a_backend", "megamoe")
        if runner == "auto":
            r.set("moe_runner_backend", "deep_gemm")
    kv = r.v("kv_cache_dtype")
    if kv not in ("auto", "fp8_e4m3"):
        r.error("SGL300", "kv_cache_dtype", "M3.1 NVFP4 requires --kv-cache-dtype fp8_e4m3",
                "use --kv-cache-dtype fp8_e4m3, or drop it")
        return
    r.set("page_size", 128)
    r.set("kv_cache_dtype", "fp8_e4m3")
    if no_backend:
        r.set("attention_backend", "trtllm_mha")


# model_overrides/qwen3_moe.py: the architectures its family override serves
_QWEN3_MOE_FAMILY = frozenset({
    "Qwen3MoeForCausalLM", "Qwen3VLMoeForConditionalGeneration", "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "InternS2PreviewForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen4ExpForConditionalGeneration",
})


def _modelopt_quantization(r: _Run) -> str | None:
    """The quantization SGLang serves a ModelOpt checkpoint with: the flag, else the config's quant_method (a
    ModelOpt MIXED_PRECISION declaration is modelopt_mixed)."""
    given = r.v("quantization")
    if given is not None:
        return None if given == "unquant" else str(given)
    raw = (r.target_cfg or {}).get("quantization_config")
    if not isinstance(raw, Mapping):
        return None
    method = raw.get("quant_method")
    if method == "modelopt" and str(raw.get("quant_algo", "")).upper() == "MIXED_PRECISION":
        return "modelopt_mixed"
    return method if isinstance(method, str) else None


def _w4a16_moe_layers(r: _Run, marker: str = ".experts", *, fold: bool = True) -> bool:
    """ModelOpt MIXED_PRECISION with W4A16 NVFP4 experts: a layer of quantization_config.quantized_layers whose
    name holds `marker` (qwen3_moe.py matches ".experts" case-folding quant_algo, nemotron_h.py ".experts."
    exactly)."""
    raw = (r.target_cfg or {}).get("quantization_config")
    layers = raw.get("quantized_layers") if isinstance(raw, Mapping) else None
    return isinstance(layers, Mapping) and any(
        marker in name and isinstance(info, Mapping)
        and (str(info.get("quant_algo", "")).upper() if fold else info.get("quant_algo")) == "W4A16_NVFP4"
        for name, info in layers.items())


def _qwen3_moe(r: _Run) -> None:
    """model_overrides/qwen3_moe.py: on SM100, W4A16 NVFP4 experts run on marlin (or on flashinfer_cutedsl when
    opted in); trtllm-gen has only the W4A4 path."""
    if r.arch not in _QWEN3_MOE_FAMILY or r.sm != 100:
        return
    if _modelopt_quantization(r) != "modelopt_mixed" or not _w4a16_moe_layers(r):
        return
    runner = r.v("moe_runner_backend")
    cutedsl = runner == "flashinfer_cutedsl" and r.v("moe_a2a_backend") in ("none", "flashinfer") \
        and _env_true(r.env.get("SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16"))
    if runner not in ("auto", "marlin") and not cutedsl:
        r.error("SGL300", "moe_runner_backend", "W4A16_NVFP4 MoE layers require --moe-runner-backend=marlin, or "
                "flashinfer_cutedsl with --moe-a2a-backend=none/flashinfer and "
                "SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16=1.",
                "use --moe-runner-backend marlin (or drop it: SGLang picks marlin)")


def _nemotron_h(r: _Run) -> None:
    """model_overrides/nemotron_h.py: expert remapping (EPLB, redundant experts, a non-trivial initial expert
    location) needs a MoE runner that takes the remap; then the W4A16 NVFP4 expert checks."""
    if r.arch not in ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "NemotronH_Omni_Reasoning_V3"):
        return
    redundant = r.v("ep_num_redundant_experts")
    eplb = bool(r.v("enable_eplb"))
    runner = r.v("moe_runner_backend")
    if not (eplb or (isinstance(redundant, int) and redundant > 0)
            or r.v("init_expert_location") not in (None, "trivial")):
        _nemotron_h_w4a16(r)
    elif runner == "flashinfer_trtllm":
        r.error("SGL300", "moe_runner_backend", "flashinfer_trtllm routes inside the kernel and does not support EPLB "
                "or redundant experts on Nemotron-H; use --moe-runner-backend flashinfer_trtllm_routed.",
                "use --moe-runner-backend flashinfer_trtllm_routed")
    elif eplb and runner == "flashinfer_cutedsl" and r.v("moe_a2a_backend") == "none":
        r.error("SGL300", "moe_runner_backend", "flashinfer_cutedsl without an a2a backend does not migrate its expert "
                "scales on EPLB rebalance; use --moe-runner-backend flashinfer_trtllm_routed or set --moe-a2a-backend.",
                "use --moe-runner-backend flashinfer_trtllm_routed, or set --moe-a2a-backend")
    elif r.arch == "NemotronHPuzzleForCausalLM" and len(counts := _puzzle_expert_counts(r)) > 1:
        r.error("SGL300", "enable_eplb" if eplb else "ep_num_redundant_experts" if redundant else
                "init_expert_location", "EPLB and redundant experts need the same routed expert count on every MoE "
                f"layer, got {sorted(counts)}.", "drop --enable-eplb / --ep-num-redundant-experts / "
                "--init-expert-location for this checkpoint")
    else:
        _nemotron_h_w4a16(r)


def _puzzle_expert_counts(r: _Run) -> set[Any]:
    """The routed expert counts of a Nemotron-H Puzzle checkpoint's MoE blocks (config.json block_configs)."""
    blocks = (r.target_cfg or {}).get("block_configs")
    if not isinstance(blocks, list):
        return set()
    return {b.get("n_routed_experts") for b in blocks if isinstance(b, Mapping) and b.get("block_type") == "moe"}


def _nemotron_h_w4a16(r: _Run) -> None:
    """nemotron_h.py: ModelOpt MIXED_PRECISION with W4A16 NVFP4 experts runs on marlin without an all-to-all."""
    quant = _modelopt_quantization(r)
    if quant == "modelopt":
        raw = (r.target_cfg or {}).get("quantization_config")
        algo = raw.get("quant_algo") if isinstance(raw, Mapping) else None
        quant = "modelopt_mixed" if algo == "MIXED_PRECISION" else "modelopt_fp4" if algo == "NVFP4" else "modelopt_fp8"
    if quant != "modelopt_mixed" or not _w4a16_moe_layers(r, ".experts.", fold=False):
        return
    if r.v("moe_a2a_backend") != "none":
        r.error("SGL300", "moe_a2a_backend", "W4A16_NVFP4 MoE layers require --moe-a2a-backend=none.",
                "use --moe-a2a-backend none (or drop it)")
    elif r.v("moe_runner_backend") not in ("auto", "marlin"):
        r.error("SGL300", "moe_runner_backend", "W4A16_NVFP4 MoE layers require --moe-runner-backend=marlin.",
                "use --moe-runner-backend marlin (or drop it: SGLang picks marlin)")

def _qwen4_exp(r: _Run) -> None:
    """model_overrides/qwen4_exp.py: MORI PD with pipeline stages, unified memory and the fp8 QSA indexer."""
    if r.arch != "Qwen4ExpForConditionalGeneration":
        return
    pp = r.v("pp_size")
    if r.v("disaggregation_mode") not in (None, "null") and r.v("disaggregation_transfer_backend") == "mori" \
            and isinstance(pp, int) and pp > 1:
        r.error("SGL300", "pp_size", "Qwen4-Exp PD with MORI requires --pp-size 1; MORI does not yet exchange the "
                "global QSA layer metadata needed to pair compact state descriptors across pipeline stages.",
                "use --pp-size 1, or another --disaggregation-transfer-backend (mooncake, nixl)")
        return
    if r.v("enable_unified_memory"):
        r.error("SGL300", "enable_unified_memory", "Qwen4-Exp does not support --enable-unified-memory yet",
                "drop --enable-unified-memory")
        return
    cfg = r.target_cfg or {}
    sub = cfg.get("text_config")
    tc: Mapping[str, Any] = sub if isinstance(sub, Mapping) else cfg
    if r.v("qsa_indexer_dtype") == "fp8_e4m3" and r.target_cfg is not None and tc.get("indexer_n_heads") is None:
        r.error("SGL300", "qsa_indexer_dtype", "--qsa-indexer-dtype fp8_e4m3 requires the compressed QSA indexer",
                "drop --qsa-indexer-dtype (this checkpoint has no compressed QSA indexer: no indexer_n_heads)")

# configs/iquest_q1.py: the config classes' defaults (a config.json may leave them out)
_IQUEST_DEFAULTS = {"hidden_size": 3072, "vocab_size": 160000, "num_hidden_layers": 88}


def _iquest_mtp_draft(r: _Run) -> bool:
    """speculative_hook._handle_iquest_q1_mtp_draft: an IQuest Q1 target drafts with its own MTP checkpoint;
    True when it resolved the step parameters (or refused them)."""
    if r.arch != "IQuestQ1ForCausalLM":
        return False
    draft = r.v("speculative_draft_model_path")
    if draft in (None, r.v("model_path")):
        r.error("SGL300", "speculative_draft_model_path", "IQuest Q1 requires an independent draft model path.",
                "add --speculative-draft-model-path IQUEST_MTP_DIR")
        return True
    d = r.draft_cfg or {}
    if r.draft_cfg is not None and d.get("model_type") != "iquest_q1_mtp":
        r.error("SGL300", "speculative_draft_model_path", "IQuest Q1 requires an independent MTP draft checkpoint.",
                "point --speculative-draft-model-path at the IQuest Q1 MTP checkpoint")
        return True
    t = {**_IQUEST_DEFAULTS, **(r.target_cfg or {})}
    raw_inner = d.get("target_config")
    inner: Mapping[str, Any] = raw_inner if isinstance(raw_inner, Mapping) else {}
    dv = {k: d.get(k, inner.get(k, _IQUEST_DEFAULTS[k])) for k in ("hidden_size", "vocab_size")}
    if any(dv[k] != t[k] for k in dv):
        r.error("SGL300", "speculative_draft_model_path", "MTP draft hidden size and vocabulary must match the target.",
                "use the MTP checkpoint of this target")
        return True
    if d.get("num_target_layers", inner.get("num_hidden_layers", 88)) != t["num_hidden_layers"]:
        r.error("SGL300", "speculative_draft_model_path", "MTP draft target layer count must match the target.",
                "use the MTP checkpoint of this target")
        return True
    if r.v("speculative_token_map") is not None:
        r.error("SGL300", "speculative_token_map", "MTP uses its own full-vocabulary embedding and head.",
                "drop --speculative-token-map")
        return True
    slots = d.get("num_draft_slots")
    steps = r.v("speculative_num_steps")
    if steps is None:
        if not isinstance(slots, int):
            return False  # the draft's config is not readable here: SGLang's default is unknown
        steps = slots
    if steps < 1:
        r.error("SGL300", "speculative_num_steps", "MTP requires positive speculative_num_steps.",
                "use a positive --speculative-num-steps")
        return True
    if r.v("speculative_eagle_topk") not in (None, 1):
        r.error("SGL300", "speculative_eagle_topk", "MTP requires --speculative-eagle-topk 1.",
                "use --speculative-eagle-topk 1")
        return True
    if r.v("speculative_num_draft_tokens") not in (None, steps + 1):
        r.error("SGL300", "speculative_num_draft_tokens", "MTP verification width must equal draft steps + 1.",
                f"use --speculative-num-draft-tokens {steps + 1}, or drop it")
        return True
    r.set("speculative_num_steps", steps)
    r.set("speculative_eagle_topk", 1)
    r.set("speculative_num_draft_tokens", steps + 1)
    return True


def _uses_mla(r: _Run) -> bool:
    return r.model is not None and r.model.pool == POOL_MLA


def _attention(r: _Run) -> None:
    """The attention backend and page size SGLang chooses per GPU (get_default_attn_backend, the page-size
    constraints of overrides.py), for architectures without a model-override hook of their own."""
    if r.device != "cuda" or r.model is None or not r.model.known:
        return
    given = r.v("attention_backend")
    pre, dec = r.v("prefill_attention_backend"), r.v("decode_attention_backend")
    if pre is not None and pre == dec:
        r.set("attention_backend", pre)
        given = pre
    own = _MODEL_BACKENDS.get(r.arch)
    if own is not None:
        # gemma4.py fills the base backend whenever it is unset; gpt_oss.py only when no backend is given
        if given is None and (r.arch != "GptOssForCausalLM" or (pre is None and dec is None)):
            r.set("attention_backend", own[0] if r.sm == 100 else own[1])
        backends = {b for b in (r.v("attention_backend"), pre, dec) if b is not None}
        bad = sorted(b for b in backends if b not in own[2])
        if bad:
            r.error("SGL300", "attention_backend", f"{r.arch} requires one of {list(own[2])} attention backend, but "
                    f"got {', '.join(bad)}", f"use --attention-backend {own[1]} (or drop it: SGLang picks one)")
            return
    elif given is None and pre is None and dec is None:
        if r.arch in _OWN_BACKEND_ARCHS and r.arch != "DeepseekV3ForCausalLM":
            return
        topk = r.v("speculative_eagle_topk")
        page = r.v("page_size")
        no_spec_or_chain = topk is None or (topk == 1 and page in (1, None))
        if _uses_mla(r):
            if r.sm == 90:
                backend = "fa3"
            else:
                backend = "trtllm_mla" if r.arch == "DeepseekV3ForCausalLM" else "flashinfer"
        elif r.sm == 90 and no_spec_or_chain:
            backend = "fa3"
        elif r.sm == 100 and no_spec_or_chain and (
                r.v("speculative_algorithm") is None or topk is not None
                or str(r.v("speculative_algorithm")).upper() == "DFLASH"):
            backend = "trtllm_mha"
        else:
            backend = "flashinfer"
        r.set("attention_backend", backend)  # reported in `resolved`; expected, so no finding
    backends = {b for b in (r.v("attention_backend"), pre, dec) if b is not None}
    page = r.v("page_size")
    new_page = page
    if "flashmla" in backends:
        new_page = 64
    if "trtllm_mla" in backends or "cutedsl_mla" in backends:
        new_page = new_page if new_page in (32, 64) else 64
    if "trtllm_mha" in backends:
        new_page = new_page if new_page in (16, 32, 64, 128) else 64
    if "hpc_ops" in backends:
        new_page = 64
    topk = r.v("speculative_eagle_topk")
    if "fa4" in backends and not _uses_mla(r) and r.sm == 100 and (topk or 0) <= 1:
        new_page = 128
    if new_page is None:
        new_page = 1
    if new_page != page:
        r.set("page_size", new_page)
        if page is not None:
            r.note("SGL310", "page_size", f"--page-size {page} is replaced by {new_page}: the attention backend "
                   f"{'/'.join(sorted(backends))} supports other page sizes (never fails: silently)",
                   f"write --page-size {new_page}", severity="warning")


def _speculative(r: _Run) -> None:
    """speculative_hook.handle_speculative_decoding and the per-algorithm handlers."""
    raw = r.v("speculative_algorithm")
    mode = r.v("disaggregation_mode")
    if raw is None:
        return  # SGLang reads the speculative flags (adaptive included) only with an algorithm
    algo = str(raw).upper()
    draft_archs = architectures(r.draft_cfg)
    gemma4 = any(a in GEMMA4_ASSISTANT_ARCHS for a in draft_archs)
    if algo == "EAGLE3" and gemma4:
        r.error("SGL305", "speculative_algorithm", "Gemma4AssistantForCausalLM draft requires --speculative-algorithm "
                "NEXTN or EAGLE; EAGLE3 is not supported for this draft architecture.",
                "use --speculative-algorithm EAGLE (SGLang promotes it to FROZEN_KV_MTP for this draft)",
                why=f"the draft {r.v('speculative_draft_model_path')} is a {draft_archs[0]}")
    if algo in ("NEXTN", "EAGLE"):
        new = "FROZEN_KV_MTP" if gemma4 else "EAGLE"
        if new != algo:
            r.note("SGL310", "speculative_algorithm", f"--speculative-algorithm {raw} runs as {new}"
                   + (" (the draft is a Gemma 4 assistant)" if gemma4 else " (NEXTN is EAGLE's alias)")
                   + " (never fails: silently)", f"write --speculative-algorithm {new}")
        algo = new
    r.set("speculative_algorithm", algo)
    known = ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP")
    if algo not in known:
        r.error("SGL300", "speculative_algorithm", f"Unknown speculative algorithm name: {algo}",
                f"use one of: {', '.join(a for a in known if a != 'FROZEN_KV_MTP')}, NEXTN")
        return
    rel = release_key(r.release)
    radix_ok = ("DSPARK", "EAGLE", "EAGLE3") if rel >= (0, 5, 23) else ("DSPARK",) if rel >= (0, 5, 21) else ()
    if mode == "decode" and r.v("disaggregation_decode_enable_radix_cache") and algo not in radix_ok:
        r.error("SGL303", "disaggregation_decode_enable_radix_cache",
                "--disaggregation-decode-enable-radix-cache is incompatible with speculative decoding "
                f"(--speculative-algorithm {algo})",
                "drop --disaggregation-decode-enable-radix-cache"
                + (f" (or use {'/'.join(radix_ok)})" if radix_ok else ""))
    if r.v("speculative_use_block_verification"):
        if algo not in ("EAGLE", "EAGLE3", "DFLASH", "DSPARK"):
            r.error("SGL300", "speculative_use_block_verification", "--speculative-use-block-verification only "
                    "supports EAGLE / EAGLE3 / NEXTN / DFLASH / DSPARK.", "drop --speculative-use-block-verification")
        elif r.device != "cuda":
            r.error("SGL300", "speculative_use_block_verification",
                    "--speculative-use-block-verification only supports CUDA or ROCm.",
                    "drop --speculative-use-block-verification")
        elif algo in ("EAGLE", "EAGLE3") and not r.v("speculative_use_rejection_sampling"):
            r.set("speculative_use_rejection_sampling", True)
    window = r.v("speculative_draft_window_size")
    if isinstance(window, int):
        if window <= 0:
            r.error("SGL306", "speculative_draft_window_size",
                    f"--speculative-draft-window-size must be positive, got {window}.",
                    "give a positive --speculative-draft-window-size, or drop it")
        elif algo not in ("EAGLE", "EAGLE3", "DFLASH"):
            r.note("SGL310", "speculative_draft_window_size", f"--speculative-draft-window-size has no effect with "
                   f"speculative_algorithm={algo} (never fails: silently ignored)",
                   "drop --speculative-draft-window-size", severity="warning")
    sink = r.v("speculative_draft_sink_size")
    if isinstance(sink, int):
        if sink < 0:
            r.error("SGL306", "speculative_draft_sink_size",
                    f"--speculative-draft-sink-size must be non-negative, got {sink}.",
                    "give --speculative-draft-sink-size 0 or more")
        elif window is None:
            r.error("SGL306", "speculative_draft_sink_size",
                    "--speculative-draft-sink-size requires --speculative-draft-window-size.",
                    "add --speculative-draft-window-size, or drop --speculative-draft-sink-size")
    if _env_true(r.env.get("SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION")) and (
            algo not in ("EAGLE", "EAGLE3", "DSPARK") or r.v("enable_multi_layer_eagle")):
        r.env_finding("SGL300", "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION",
                      f"SGLang {r.release} refuses it at start-up: 'DP spec/prefill coordination requires single-layer "
                      "EAGLE, EAGLE3 or DSPARK'", "unset SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION")
    _spec_v2(r, algo)
    if r.v("speculative_adaptive") and not _adaptive(r, algo):
        return  # SGLang stops reading the adaptive config (SGL104 names the file)
    handler = {"EAGLE": _eagle_family, "EAGLE3": _eagle_family, "STANDALONE": _eagle_family,
               "DFLASH": _dflash, "DSPARK": _dspark, "NGRAM": _ngram, "UNO": _uno,
               "FROZEN_KV_MTP": _frozen_kv_mtp}[algo]
    handler(r, algo)


def _spec_v2(r: _Run, algo: str) -> None:
    raw = r.env.get("SGLANG_ENABLE_SPEC_V2")
    if raw is None:
        return
    topk = r.v("speculative_eagle_topk")
    key = release_key(r.release)
    refuses = any(release_key(x) == key for x in _SPEC_V2_TOPK_RELEASES)
    if refuses and _env_true(raw) and algo in ("EAGLE", "EAGLE3", "STANDALONE") and isinstance(topk, int) and topk > 1:
        r.env_finding("SGL304", "SGLANG_ENABLE_SPEC_V2",
                      f"SGLANG_ENABLE_SPEC_V2={raw} with --speculative-eagle-topk {topk}: SGLang {r.release} refuses "
                      "it at start-up: 'Spec v2 currently only supports topk = 1 for speculative decoding.'",
                      "use --speculative-eagle-topk 1, or unset SGLANG_ENABLE_SPEC_V2")
    elif key >= (0, 5, 21):  # the variable is gone from SGLang's environment table
        r.env_finding("SGL304", "SGLANG_ENABLE_SPEC_V2",
                      f"SGLANG_ENABLE_SPEC_V2={raw} is not read by SGLang {r.release} (never fails: silently ignored"
                      + (f"; --speculative-eagle-topk {topk} is accepted here, but 0.5.7-0.5.10 refuse it with spec v2"
                         if isinstance(topk, int) and topk > 1 else "") + ")",
                      "drop SGLANG_ENABLE_SPEC_V2", severity="info")


def _adaptive_reason(r: _Run, algo: str) -> tuple[str, str] | None:
    """adaptive_spec_params.adaptive_unsupported_reason: (flag dest, SGLang's reason) when adaptive turns off."""
    topk = r.v("speculative_eagle_topk")
    if algo not in ("EAGLE", "EAGLE3"):
        return "speculative_algorithm", f"speculative_algorithm={algo} (only EAGLE/EAGLE3 are supported)"
    if topk is not None and topk != 1:
        return "speculative_eagle_topk", f"speculative_eagle_topk={topk} (only topk=1 is supported)"
    if r.attn_dp > 1:
        return ("enable_dp_attention" if r.cmd.given("enable_dp_attention") else "attn_dp_size",
                "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)")
    if r.v("enable_multi_layer_eagle"):
        return "enable_multi_layer_eagle", ("enable_multi_layer_eagle=True is not supported "
                                            "(MultiLayerEagleWorkerV2 does not implement adaptive)")
    if r.v("enable_two_batch_overlap"):
        return "enable_two_batch_overlap", "enable_two_batch_overlap=True is not supported"
    if r.v("enable_pdmux"):
        return "enable_pdmux", "enable_pdmux=True is not supported"
    return None


def adaptive_off_reason(cmd: SGLangCommand) -> tuple[str, str] | None:
    """(flag dest, SGLang's reason) when SGLang would silently turn --speculative-adaptive off."""
    r = _Run(cmd, None, "H100", DEFAULT_RELEASE, None, None)
    _dp_attention(r)
    algo = str(cmd.value("speculative_algorithm")).upper()
    return _adaptive_reason(r, "EAGLE" if algo == "NEXTN" else algo)


def _adaptive(r: _Run, algo: str) -> bool:
    """_maybe_disable_adaptive, then _init_adaptive_speculative_params; False when the config is unreadable."""
    topk = r.v("speculative_eagle_topk")
    reason = _adaptive_reason(r, algo)
    if reason is not None:
        r.set("speculative_adaptive", False)
        r.note("SGL102", reason[0], f"--speculative-adaptive is silently turned off: {reason[1]} (never fails: SGLang "
               "logs 'speculative_adaptive disabled: ... Falling back to static speculative params.')",
               f"change {r.cmd.flag_name(reason[0])}, or drop --speculative-adaptive", severity="warning")
        return True
    candidates = _candidate_steps(r)
    if candidates is None:
        return False
    if topk is None:
        r.set("speculative_eagle_topk", 1)
    steps = r.v("speculative_num_steps")
    if steps is None:
        steps = candidates[len(candidates) // 2]
        r.set("speculative_num_steps", steps)
    if steps not in candidates:
        r.error("SGL309", "speculative_num_steps", f"--speculative-num-steps={steps} is not in the adaptive config "
                f"candidate_steps {candidates}. Pass one of those values.",
                f"pass --speculative-num-steps {candidates[len(candidates) // 2]} (or another of {candidates})")
    ndt = r.v("speculative_num_draft_tokens")
    if r.cmd.given("speculative_num_draft_tokens") and ndt != steps + 1:
        r.note("SGL103", "speculative_num_draft_tokens", f"--speculative-num-draft-tokens {ndt} is replaced by "
               f"{steps + 1} (--speculative-num-steps + 1) under adaptive speculation (never fails: silently)",
               "remove --speculative-num-draft-tokens", severity="warning")
    r.set("speculative_num_draft_tokens", steps + 1)
    return True


def _candidate_steps(r: _Run) -> list[int] | None:
    """adaptive_spec_params.resolve_candidate_steps_from_config: the union of every bucket's candidate steps;
    None (with the start-up error) when SGLang cannot read them."""
    from specctl.schemas.sglang.mapping import read_adaptive_json  # noqa: PLC0415 - `specctl validate` start-up: SGLang-command support, loaded for SGLang files only

    raw, _, problem = read_adaptive_json(r.cmd)
    if problem is not None:
        r.errors.append(problem)  # the same finding the mapping reports: one line in the report
        return None
    cfg = raw if raw is not None else SGLANG_DEFAULT_CONFIG
    steps: set[int] = set()
    for key, entry in cfg.items():
        if not str(key).isdigit():
            continue
        got = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
        if not isinstance(got, list) or not got or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in got):
            r.error("SGL300", "speculative_adaptive_config", f"BS {key}: candidate_steps must be a list of "
                    f"non-negative ints, got {got!r}", "give every batch-size bucket a non-empty candidate_steps list")
            return None
        steps.update(got)
    if not steps:
        r.error("SGL300", "speculative_adaptive_config", "speculative_adaptive_config must contain at least one "
                'integer-string BS key, e.g. {"1": {"candidate_steps": [1,3,7]}}.',
                'add a bucket such as "1": {"candidate_steps": [1, 3, 5]}')
        return None
    return sorted(steps)


def _max_running(r: _Run) -> None:
    if r.v("max_running_requests") is None:
        r.set("max_running_requests", 48)


def _eagle_family(r: _Run, algo: str) -> None:
    """_handle_eagle_family (EAGLE, EAGLE3, STANDALONE)."""
    if algo == "STANDALONE" and r.attn_dp > 1:
        r.error("SGL300", "enable_dp_attention" if r.cmd.given("enable_dp_attention") else "attn_dp_size",
                "Currently standalone speculative decoding does not support dp attention.",
                "drop --enable-dp-attention, or use EAGLE")
    _max_running(r)
    if r.arch in MTP_DEFAULT_DRAFT_ARCHS and r.v("speculative_draft_model_path") is None:
        r.set("speculative_draft_model_path", r.v("model_path"))
        r.note("SGL310", "speculative_draft_model_path", f"no --speculative-draft-model-path: {r.arch} drafts with "
               f"its own MTP/NextN head, so SGLang sets the draft to --model-path (never fails: silently)",
               "nothing to do; this is how SGLang runs MTP")
    elif r.v("speculative_draft_model_path") is None and has_mtp_head(r.arch, r.target_cfg):
        r.note("SGL310", "speculative_draft_model_path", f"no --speculative-draft-model-path: the draft worker loads "
               f"--model-path and runs {r.arch}'s built-in MTP/NextN head (never fails: silently)",
               "nothing to do; this is how SGLang runs MTP")
    if _iquest_mtp_draft(r) and r.errors:
        return
    steps, topk, ndt = (r.v("speculative_num_steps"), r.v("speculative_eagle_topk"),
                        r.v("speculative_num_draft_tokens"))
    if not r.v("speculative_adaptive") and steps is None:
        if topk is not None or ndt is not None:
            given = [r.cmd.flag_name(d) for d in ("speculative_eagle_topk", "speculative_num_draft_tokens")
                     if r.v(d) is not None]
            r.errors.append(r._finding(
                "SGL301", "error", "speculative_eagle_topk" if topk is not None else "speculative_num_draft_tokens",
                f"{' and '.join(given)} given without --speculative-num-steps: SGLang {r.release} auto-chooses the "
                "three only together and refuses it at start-up (AssertionError in _handle_eagle_family: "
                "'assert speculative_eagle_topk is None and speculative_num_draft_tokens is None')",
                "give --speculative-num-steps too (with --speculative-eagle-topk and --speculative-num-draft-tokens), "
                "or none of the three"))
            return
        if algo != "STANDALONE" and r.target_cfg is None and r.model is None:
            r.note("SGL310", "speculative_num_steps", "--speculative-num-steps is not given: SGLang chooses steps, "
                   "topk and draft tokens per architecture, and the model's config.json is not readable here",
                   "write --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens")
            return
        steps, topk, ndt = (3, 1, 4) if algo == "STANDALONE" else (5, 4, 8) if r.arch in _AUTO_5_4_8 else (3, 1, 4)
        r.set("speculative_num_steps", steps)
        r.set("speculative_eagle_topk", topk)
        r.set("speculative_num_draft_tokens", ndt)
        r.note("SGL310", "speculative_num_steps", "--speculative-num-steps is not given: SGLang chooses "
               f"steps {steps}, topk {topk}, draft tokens {ndt} for {r.arch} (never fails: silently)",
               f"write --speculative-num-steps {steps} --speculative-eagle-topk {topk} "
               f"--speculative-num-draft-tokens {ndt}")
    if topk is None:
        r.errors.append(r._finding(
            "SGL301", "error", "speculative_num_steps", f"--speculative-num-steps {steps} is given without "
            f"--speculative-eagle-topk: SGLang {r.release} leaves topk unset and fails at start-up comparing it "
            "(TypeError: '>' not supported between instances of 'NoneType' and 'int')",
            "give --speculative-eagle-topk (1 for a chain) and --speculative-num-draft-tokens with the steps"))
        return
    backends = {b for b in (r.v("attention_backend"), r.v("prefill_attention_backend"),
                            r.v("decode_attention_backend")) if b is not None}
    if "trtllm_mha" in backends and topk > 1:
        r.error("SGL302", "speculative_eagle_topk", "trtllm_mha backend only supports topk = 1 for speculative "
                "decoding.", "use --speculative-eagle-topk 1, or --attention-backend fa3 / flashinfer")
    _rejection_sampling(r, algo, topk)
    if topk == 1 and isinstance(steps, int) and ndt != steps + 1:
        r.set("speculative_num_draft_tokens", steps + 1)
        if r.cmd.given("speculative_num_draft_tokens"):
            r.note("SGL310", "speculative_num_draft_tokens", f"--speculative-num-draft-tokens {ndt} is replaced by "
                   f"{steps + 1}: at --speculative-eagle-topk 1 SGLang drafts a chain of --speculative-num-steps + 1 "
                   "tokens (never fails: silently)", f"write --speculative-num-draft-tokens {steps + 1}",
                   severity="warning")
    page = r.v("page_size")
    backend = r.v("attention_backend")
    if "trtllm_mha" in backends and topk > 1:
        return  # SGLang stops at the check above
    if topk > 1 and isinstance(page, int) and page > 1 and backend is not None and backend not in _PAGE_TREE_BACKENDS:
        r.error("SGL302", "speculative_eagle_topk", f"speculative_eagle_topk > 1 with page_size > 1 is only supported "
                f"on {_PAGE_TREE_BACKENDS}; got attention_backend={backend!r}. Use page_size == 1 or one of those "
                "backends.", "use --speculative-eagle-topk 1, --page-size 1, or --attention-backend "
                "flashinfer/fa3/triton")


def _rejection_sampling(r: _Run, algo: str, topk: int) -> None:
    """_handle_eagle_family: what --speculative-use-rejection-sampling needs."""
    if not r.v("speculative_use_rejection_sampling"):
        return
    dest = "speculative_use_rejection_sampling"
    if algo not in ("EAGLE", "EAGLE3"):
        r.error("SGL300", dest, "--speculative-use-rejection-sampling is only supported for EAGLE / EAGLE3 / NEXTN, "
                f"not speculative_algorithm={algo}.", "drop --speculative-use-rejection-sampling")
    elif topk != 1:
        r.error("SGL300", dest, "--speculative-use-rejection-sampling requires --speculative-eagle-topk=1.",
                "use --speculative-eagle-topk 1, or drop --speculative-use-rejection-sampling")
    elif r.v("enable_deterministic_inference") and not r.device.startswith("cuda"):
        r.error("SGL300", dest, "Deterministic rejection sampling is currently supported only on CUDA-compatible "
                "devices because draft proposal sampling uses a Triton hash kernel.", "run on --device cuda")
    elif r.v("speculative_accept_threshold_single") != 1.0 or r.v("speculative_accept_threshold_acc") != 1.0:
        r.error("SGL300", dest, "--speculative-use-rejection-sampling is incompatible with "
                "--speculative-accept-threshold-single / --speculative-accept-threshold-acc; rejection sampling "
                "ignores the accept thresholds.", "drop the accept thresholds or --speculative-use-rejection-sampling")


def _frozen_kv_mtp(r: _Run, algo: str) -> None:
    _max_running(r)


def _dflash(r: _Run, algo: str) -> None:
    if not (r.device.startswith("cuda") or r.device in ("npu", "xpu")):
        r.error("SGL307", "device", f"DFLASH speculative decoding is not supported by {r.device.upper()}Platform on "
                f"device {r.device!r}.", "run DFLASH on --device cuda, npu or xpu")
    if r.attn_dp > 1 and r.device != "npu":
        if not r.v("enable_dp_lm_head"):
            r.error("SGL307", "enable_dp_lm_head", "DFLASH with dp attention requires --enable-dp-lm-head.",
                    "add --enable-dp-lm-head")
        elif r.v("attn_cp_size") != 1:
            r.error("SGL307", "attn_cp_size", "DFLASH with dp attention does not support context parallel.",
                    "use --attn-cp-size 1")
        elif _env_true(r.env.get("SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION")):
            r.env_finding("SGL307", "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION", f"SGLang {r.release} refuses it at "
                          "start-up: 'DFLASH with dp attention requires SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=0.'",
                          "unset SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION")
    if r.v("pp_size") != 1:
        r.error("SGL307", "pp_size", "Currently DFLASH speculative decoding only supports pp_size == 1.",
                "use --pp-size 1")
    if r.v("speculative_draft_model_path") is None:
        r.error("SGL300", "speculative_draft_model_path",
                "DFLASH speculative decoding requires setting --speculative-draft-model-path.",
                "add --speculative-draft-model-path DRAFT_DIR")
    _force_one(r, "DFLASH")
    block = r.v("speculative_dflash_block_size")
    ndt = r.v("speculative_num_draft_tokens")
    if isinstance(block, int):
        if block <= 0:
            r.error("SGL300", "speculative_dflash_block_size", "DFLASH requires --speculative-dflash-block-size to be "
                    f"positive, got {block}.", "give a positive --speculative-dflash-block-size")
        elif isinstance(ndt, int) and ndt != block:
            r.error("SGL300", "speculative_num_draft_tokens", "Both --speculative-num-draft-tokens and "
                    "--speculative-dflash-block-size are set but they differ. For DFLASH they must match.",
                    "drop one of them")
        else:
            r.set("speculative_num_draft_tokens", block)
    if r.v("speculative_num_draft_tokens") is None and r.draft_cfg is not None:
        # dflash_utils.parse_dflash_draft_config: dflash_config.block_size, else a top-level block_size, else 16
        sub = r.draft_cfg.get("dflash_config")
        inferred = (sub if isinstance(sub, Mapping) else {}).get("block_size", r.draft_cfg.get("block_size"))
        if not isinstance(inferred, int) or isinstance(inferred, bool) or inferred < 1:
            inferred = 16
            r.note("SGL310", "speculative_algorithm", "--speculative-num-draft-tokens is not given and the draft's "
                   "config.json has no block_size: SGLang defaults to 16 for DFLASH (never fails: silently)",
                   "write --speculative-dflash-block-size", severity="warning")
        r.set("speculative_num_draft_tokens", inferred)
    window = r.v("speculative_draft_window_size")
    ndt = r.v("speculative_num_draft_tokens")
    if isinstance(window, int) and window > 0 and isinstance(ndt, int) and window < ndt:
        r.error("SGL306", "speculative_draft_window_size", "--speculative-draft-window-size must be >= "
                f"--speculative-num-draft-tokens (block_size). window_size={window}, block_size={ndt}.",
                f"use --speculative-draft-window-size {ndt} or more")
    _max_running(r)


def _force_one(r: _Run, name: str) -> None:
    """DFLASH / DSPARK run one step of topk 1; other values are overridden with a warning."""
    for dest, label in (("speculative_num_steps", "speculative_num_steps"), ("speculative_eagle_topk",
                                                                               "speculative_eagle_topk")):
        cur = r.v(dest)
        if cur is not None and cur != 1:
            r.note("SGL310", dest, f"{r.cmd.flag_name(dest)} {cur} is replaced by 1: {name} only supports "
                   f"{label} == 1 (never fails: silently)", f"drop {r.cmd.flag_name(dest)}", severity="warning")
        r.set(dest, 1)


def _dspark(r: _Run, algo: str) -> None:
    if not r.device.startswith(("cuda", "npu", "xpu")):
        r.error("SGL307", "device", "DSpark speculative decoding only supports CUDA, NPU or XPU device.",
                "run DSPARK on --device cuda, npu or xpu")
    if r.attn_dp > 1:
        if not r.v("enable_dp_lm_head"):
            r.error("SGL307", "enable_dp_lm_head", "DSpark with dp attention requires --enable-dp-lm-head.",
                    "add --enable-dp-lm-head")
        a2a = r.v("moe_a2a_backend")
        if r.device != "npu" and a2a not in ("none", "megamoe", "mori"):
            r.error("SGL307", "moe_a2a_backend", "DSpark with dp attention supports moe_a2a_backend 'none' (built-in "
                    f"TP MoE), 'megamoe', or 'mori', got {a2a!r}.", "use --moe-a2a-backend none, megamoe or mori")
        elif r.device != "npu" and (a2a != "none" or _env_true(
                r.env.get("SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION"))):
            mode = r.env.get("SGLANG_RAGGED_VERIFY_MODE", "static")
            if mode != "static":
                r.env_finding("SGL308", "SGLANG_RAGGED_VERIFY_MODE", f"SGLANG_RAGGED_VERIFY_MODE={mode}: SGLang "
                              f"{r.release} refuses it at start-up: 'DSpark DP MoE or prefill coordination requires "
                              "SGLANG_RAGGED_VERIFY_MODE=static.'", "set SGLANG_RAGGED_VERIFY_MODE=static")
        cp = r.v("attn_cp_size")
        if isinstance(cp, int) and cp > 1:
            r.error("SGL307", "attn_cp_size", "DSpark with dp attention does not support context parallel "
                    f"(attn_cp_size={cp}).", "use --attn-cp-size 1")
        spec_a2a = r.v("speculative_moe_a2a_backend")
        if r.device != "npu" and spec_a2a is not None and spec_a2a != a2a:
            r.error("SGL307", "speculative_moe_a2a_backend", "DSpark ignores --speculative-moe-a2a-backend; with dp "
                    f"attention it must match the target moe_a2a_backend={a2a!r} (got {spec_a2a!r}).",
                    "drop --speculative-moe-a2a-backend")
    if r.v("pp_size") != 1 and r.v("disaggregation_mode") != "prefill":
        r.error("SGL307", "pp_size", "DSpark pipeline parallelism requires PD prefill; decode and non-disaggregated "
                "serving require pp_size == 1.", "use --pp-size 1")
    if r.v("speculative_draft_model_path") is None:
        target = r.v("model_path")
        if any((r.target_cfg or {}).get(k) is not None for k in _DSPARK_BUNDLE_KEYS):
            r.set("speculative_draft_model_path", target)  # the draft head ships in the target checkpoint
        elif isinstance(target, str) and (Path(target) / "dspark" / "config.json").is_file():
            r.set("speculative_draft_model_path", str(Path(target) / "dspark"))
        elif r.target_cfg is not None:
            r.error("SGL300", "speculative_draft_model_path", "DSpark dense speculative decoding requires "
                    "setting --speculative-draft-model-path.", "add --speculative-draft-model-path DRAFT_DIR")
    _force_one(r, "DSpark")
    block = r.v("speculative_dspark_block_size")
    ndt = r.v("speculative_num_draft_tokens")
    if isinstance(block, int):
        if block <= 0:
            r.error("SGL300", "speculative_dspark_block_size", "DSpark requires --speculative-dspark-block-size to be "
                    f"positive, got {block}.", "give a positive --speculative-dspark-block-size")
        elif isinstance(ndt, int) and ndt != block + 1:
            r.error("SGL300", "speculative_num_draft_tokens", "DSpark speculative_num_draft_tokens must equal "
                    f"gamma + 1 (= {block + 1} for gamma={block}), but got speculative_num_draft_tokens={ndt}.",
                    "drop --speculative-num-draft-tokens (SGLang sets gamma + 1)")
        else:
            r.set("speculative_num_draft_tokens", block + 1)
    elif isinstance(ndt, int) and ndt < 2:
        r.error("SGL300", "speculative_num_draft_tokens", "DSpark speculative_num_draft_tokens must be >= 2 "
                f"(= gamma + 1), got {ndt}.", "use --speculative-dspark-block-size instead")
    elif ndt is None and r.draft_cfg is not None:
        gamma = next((g for g in (r.draft_cfg.get(k) for k in ("dspark_block_size", "block_size"))
                      if isinstance(g, int) and not isinstance(g, bool)), None)
        if gamma is None:  # no gamma in the draft's config.json: SGLang warns and takes its default
            gamma = DEFAULT_DSPARK_GAMMA
            r.note("SGL310", "speculative_algorithm", f"DSpark gamma is not set: SGLang defaults to {gamma} "
                   f"(--speculative-num-draft-tokens {gamma + 1}) (never fails: silently)",
                   f"write --speculative-dspark-block-size {gamma}", severity="warning")
        r.set("speculative_num_draft_tokens", gamma + 1)
    _max_running(r)


def _ngram(r: _Run, algo: str) -> None:
    if r.device not in ("cuda", "cpu", "xpu"):
        r.error("SGL307", "device", "Ngram speculative decoding only supports CUDA, CPU, or XPU devices.",
                "run NGRAM on --device cuda, cpu or xpu")
    _max_running(r)
    r.set("enable_mixed_chunk", False)
    breadth = r.v("speculative_ngram_max_bfs_breadth")
    r.set("speculative_eagle_topk", breadth)
    if r.v("speculative_num_draft_tokens") is None:
        r.set("speculative_num_draft_tokens", 12)
    ndt = r.v("speculative_num_draft_tokens")
    if r.v("speculative_num_steps") is None and isinstance(ndt, int) and isinstance(breadth, int) and breadth > 0:
        r.set("speculative_num_steps", ndt // breadth)
    if r.v("speculative_ngram_external_corpus_path") is not None:
        budget = r.v("speculative_ngram_external_sam_budget")
        if not isinstance(budget, int) or budget <= 0:
            r.error("SGL300", "speculative_ngram_external_sam_budget", "--speculative-ngram-external-sam-budget must "
                    "be positive when --speculative-ngram-external-corpus-path is set.",
                    "give --speculative-ngram-external-sam-budget a positive value")
        elif not isinstance(r.v("speculative_ngram_external_corpus_max_tokens"), int) or \
                r.v("speculative_ngram_external_corpus_max_tokens") <= 0:
            r.error("SGL300", "speculative_ngram_external_corpus_max_tokens", "--speculative-ngram-external-corpus-"
                    "max-tokens must be positive when --speculative-ngram-external-corpus-path is set.",
                    "give --speculative-ngram-external-corpus-max-tokens a positive value")
        elif isinstance(ndt, int) and budget > ndt - 1:
            r.error("SGL300", "speculative_ngram_external_sam_budget", "speculative_ngram_external_sam_budget must be "
                    f"less than or equal to speculative_num_draft_tokens - 1 ({ndt - 1}).",
                    f"use --speculative-ngram-external-sam-budget {ndt - 1} or less")
    page, backend = r.v("page_size"), r.v("attention_backend")
    if isinstance(breadth, int) and breadth > 1 and isinstance(page, int) and page > 1 and backend is not None \
            and backend != "flashinfer":
        r.error("SGL302", "page_size", f"speculative_eagle_topk({breadth}) > 1 with page_size({page}) > 1 is unstable "
                "and produces incorrect results for paged attention backends. This combination is only supported "
                "for the 'flashinfer' backend.", "use --page-size 1 or --attention-backend flashinfer")
    if r.attn_dp > 1:
        r.error("SGL307", "enable_dp_attention" if r.cmd.given("enable_dp_attention") else "attn_dp_size",
                "Currently ngram speculative decoding does not support dp attention.", "drop --enable-dp-attention")


def _uno(r: _Run, algo: str) -> None:
    """_handle_uno, in SGLang's order (it stops at the first)."""
    fail = _uno_failure(r)
    if fail is not None:
        r.error("SGL300" if fail[0] != "device" else "SGL307", fail[0], fail[1], fail[2])


def _uno_failure(r: _Run) -> tuple[str, str, str] | None:
    if not r.device.startswith("cuda"):
        return "device", "UNO only supports CUDA.", "run UNO on --device cuda"
    if r.v("speculative_draft_model_path") is not None:
        return ("speculative_draft_model_path", "UNO reuses the target model and does not accept "
                "--speculative-draft-model-path.", "drop --speculative-draft-model-path")
    if r.v("uno_lora_path") is None:
        return "uno_lora_path", "UNO requires --uno-lora-path.", "add --uno-lora-path"
    if r.v("enable_deterministic_inference"):
        return ("enable_deterministic_inference", "UNO does not support --enable-deterministic-inference because its "
                "sampling path does not use per-request seeds.", "drop --enable-deterministic-inference")
    if r.v("enable_strict_thinking"):
        return ("enable_strict_thinking", "UNO does not support --enable-strict-thinking because it requires grammar "
                "decoding.", "drop --enable-strict-thinking")
    q = r.v("speculative_num_draft_tokens")
    if not isinstance(q, int) or q < 1:
        return ("speculative_num_draft_tokens", "UNO requires --speculative-num-draft-tokens to be a positive integer "
                "denoting the linear width or tree verify width Q.", "add --speculative-num-draft-tokens Q")
    topk = r.v("speculative_eagle_topk")
    k = 1 if topk is None else topk
    if k < 1:
        return ("speculative_eagle_topk", f"UNO requires --speculative-eagle-topk to be at least 1, got {k}.",
                "use --speculative-eagle-topk 1 or more")
    steps = r.v("speculative_num_steps")
    if k > 1:
        if steps is None:
            return ("speculative_num_steps", "UNO tree mode requires --speculative-num-steps so its draft width F can "
                    "be derived as speculative_num_steps + 1.", "add --speculative-num-steps")
        if steps < 1:
            return ("speculative_num_steps", f"UNO tree mode requires --speculative-num-steps to be positive, got "
                    f"{steps}.", "use a positive --speculative-num-steps")
        f = steps + 1
        if q < f:
            return ("speculative_num_draft_tokens", f"UNO tree mode requires Q >= F; got Q={q}, F={f}.",
                    f"use --speculative-num-draft-tokens {f} or more")
        if q > 128:
            return ("speculative_num_draft_tokens", f"UNO tree mode currently supports at most Q=128 verify nodes, "
                    f"got Q={q}.", "use --speculative-num-draft-tokens 128 or less")
        if q * k > 2048:
            return ("speculative_num_draft_tokens", f"UNO tree mode currently supports Q*K <= 2048; got "
                    f"Q*K={q}*{k}={q * k}.", "lower --speculative-num-draft-tokens or --speculative-eagle-topk")
        capacity, level = 1, 1
        for _ in range(steps):
            level *= k
            capacity += level
            if capacity >= q:
                break
        if q > capacity:
            return ("speculative_num_draft_tokens", f"UNO tree mode cannot build the requested Q from F and K: Q={q} "
                    f"exceeds capacity={capacity} for F={f}, K={k}.", "lower --speculative-num-draft-tokens")
        parent = k * max(steps - 1, 0) + 1
        if q - 1 > parent:
            return ("speculative_num_draft_tokens", "UNO tree mode cannot represent the requested Q in EAGLE's "
                    f"parent-list ABI: Q-1={q - 1} exceeds K*(F-2)+1={parent} for F={f}, K={k}.",
                    f"use --speculative-num-draft-tokens {parent + 1} or less")
        if r.v("enable_pdmux"):
            return "enable_pdmux", "UNO tree mode does not yet support PDMux.", "drop --enable-pdmux"
        if r.v("enable_two_batch_overlap"):
            return ("enable_two_batch_overlap", "UNO tree mode does not yet support two-batch overlap.",
                    "drop --enable-two-batch-overlap")
        if r.v("speculative_accept_threshold_single") != 1.0 or r.v("speculative_accept_threshold_acc") != 1.0:
            return ("speculative_accept_threshold_single", "UNO tree mode reuses EAGLE target-only sampling and "
                    "requires both speculative accept thresholds to be 1.0.", "drop the accept thresholds")
        r.set("speculative_num_steps", steps)
        r.set("speculative_eagle_topk", k)
    else:
        r.set("speculative_num_steps", 1)
        r.set("speculative_eagle_topk", 1)
    r.set("speculative_num_draft_tokens", q)
    if (r.v("tp_size"), r.v("pp_size")) != (1, 1):
        return "tp_size", "UNO requires TP=PP=1.", "use --tp-size 1 --pp-size 1"
    if r.attn_dp > 1 or r.v("attn_cp_size") != 1:
        return ("attn_cp_size" if r.v("attn_cp_size") != 1 else "attn_dp_size",
                "UNO does not support DP attention or context parallelism.", "drop attention DP / CP")
    if r.v("enable_lora") or r.v("lora_paths"):
        return "enable_lora", "UNO does not support public Multi-LoRA serving.", "drop --enable-lora / --lora-paths"
    if r.v("speculative_use_rejection_sampling"):
        return ("speculative_use_rejection_sampling", "UNO manages its own stochastic verification and does not use "
                "--speculative-use-rejection-sampling.", "drop --speculative-use-rejection-sampling")
    pre = r.v("prefill_attention_backend") or r.v("attention_backend")
    dec = r.v("decode_attention_backend") or r.v("attention_backend")
    if (pre, dec) != ("fa3", "fa3"):
        return ("attention_backend", f"UNO requires FA3 for both prefill and decode attention; got prefill={pre!r}, "
                f"decode={dec!r}.", "use --attention-backend fa3")
    return None


def predict_startup(cmd: SGLangCommand, model: SGLangModel | None, *, gpu: str = "H100",
                    release: str = DEFAULT_RELEASE) -> Startup:
    """SGLang's start-up verdict for `cmd` on a declared `gpu` (one of GPUS) in SGLang `release`."""
    target_cfg = read_config(cmd.value("model_path"))
    draft_cfg = read_config(cmd.value("speculative_draft_model_path"))
    r = _Run(cmd, model, gpu if gpu in _SM else "H100", release or DEFAULT_RELEASE, target_cfg, draft_cfg)
    mode = r.env.get("SGLANG_RAGGED_VERIFY_MODE")
    if mode is not None and mode not in _RAGGED_MODES:
        r.env_finding("SGL300", "SGLANG_RAGGED_VERIFY_MODE", f"SGLang reads it as it verifies drafts: 'invalid "
                      f"SGLANG_RAGGED_VERIFY_MODE={mode!r}; expected one of 'static', 'cap-accept', 'compact''",
                      "set SGLANG_RAGGED_VERIFY_MODE to static, cap-accept or compact", severity="warning")
    _model_type(r)
    try:
        for step in (_dp_attention, _pd, _kimi_k3, _deepseek_dsa, _ernie45_vl, _minicpm, _iquest, _minimax_m3,
                     _nemotron_h, _qwen4_exp, _qwen3_moe, _attention, _speculative, _encoder):
            step(r)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a value of a shape no check expects
        r.warnings.append(Finding("SGL300", "warning", "$", f"SGLang's start-up verdict could not be predicted "
                                  f"({type(exc).__name__}: {exc})", "check the flags' values", cmd.first_line))
    return Startup(errors=tuple(r.errors), warnings=tuple(r.warnings), resolved=dict(r.resolved))
