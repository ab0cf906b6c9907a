"""Generate the SGLang start-up case corpus and record SGLang's own verdict on each case.

Each case is a launch command (argv, environment, model fixture, declared GPU). The verdicts are
SGLang's: `specctl.schemas.sglang.resolver` runs `prepare_server_args` + `ServerArgs.resolve_once()` of
the installed SGLang for the declared GPU and this script writes what it answered:
- tests/data/sglang/startup_cases.json: the cases and their verdicts (error type, message, raise site
  and its census id; the resolved values of RECORDED fields);
- tests/data/sglang/raise_sites.json: the census of raise sites (scripts/sglang_raise_sites.py), each
  classified as `reached_by` cases of the corpus, else with the reason kept from the file: `unreachable`
  (no flag, environment variable or config.json can reach it: an internal invariant, a check shadowed by an
  earlier one, another platform) or `not_covered` (reachable, e.g. by a family's config.json, but no case yet).

Cases come from three places: the hand-written list below (one or more per raise site, plus the faults
of public bug reports and commands that must pass), and `specctl export sglang` of every preset.
`python scripts/gen_sglang_startup_cases.py` rewrites both files; `--check` prints the census sites that
are neither reached nor classified, and exits 1 if there are any.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_raise_sites import census, site_at  # noqa: E402

CASES_FILE = ROOT / "tests" / "data" / "sglang" / "startup_cases.json"
SITES_FILE = ROOT / "tests" / "data" / "sglang" / "raise_sites.json"
FILES_DIR = "tests/data/sglang/startup_files"  # files a command names (adaptive configs), repo-relative
M = "tests/data/models/"

# The resolved ServerArgs fields the corpus records (what specctl predicts or compares between roles).
RECORDED = (
    "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "speculative_adaptive", "speculative_attention_mode",
    "speculative_draft_attention_backend", "speculative_use_rejection_sampling", "speculative_dflash_block_size",
    "speculative_dspark_block_size", "speculative_draft_window_size", "speculative_moe_runner_backend",
    "speculative_moe_a2a_backend", "attention_backend", "prefill_attention_backend", "decode_attention_backend",
    "page_size", "kv_cache_dtype", "disable_radix_cache", "max_running_requests", "chunked_prefill_size",
    "mem_fraction_static", "context_length", "tp_size", "pp_size", "dp_size", "attn_dp_size", "attn_cp_size",
    "enable_dp_attention", "enable_dp_lm_head", "moe_a2a_backend", "moe_runner_backend", "ep_size",
    "disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_decode_enable_radix_cache",
    "disable_overlap_schedule", "enable_mixed_chunk", "device", "dtype", "cuda_graph_max_bs_decode",
    "mamba_radix_cache_strategy", "max_mamba_cache_size", "sampling_backend",
)

LLAMA, DRAFT, EAGLE3_DRAFT = M + "llama", M + "llama-draft", M + "llama-eagle3"
EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", DRAFT]
EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", EAGLE3_DRAFT]
STEPS = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"]
DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", DRAFT]
DSPARK = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", DRAFT]
UNO = ["--speculative-algorithm", "UNO", "--uno-lora-path", M + "llama-draft"]
PD_D = ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake"]
PD_P = ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake"]
NGRAM = ["--speculative-algorithm", "NGRAM"]
MM3 = M + "minimax-m3-nvfp4"
M3ENV = {"SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK": "16384"}
QW4 = M + "qwen3-moe-w4a16"  # ModelOpt MIXED_PRECISION with W4A16 NVFP4 experts
NW4 = M + "nemotron-h-w4a16"  # the same quantization on a Nemotron-H MoE hybrid


def case(cid: str, argv: list[str], *, model: str = LLAMA, env: dict[str, str] | None = None, gpu: str = "H100",
         note: str = "") -> dict[str, Any]:
    return {"id": cid, "argv": ["--model-path", model, *argv], "env": env or {}, "gpu": gpu, "note": note}


def hand_cases() -> list[dict[str, Any]]:
    c = case
    out = [
        # --- commands SGLang accepts (defaults it resolves silently) ---
        c("ok/plain", []),
        c("ok/plain-h200", [], gpu="H200"),
        c("ok/plain-b200", [], gpu="B200"),
        c("ok/eagle", EAGLE + STEPS),
        c("ok/eagle-defaults", EAGLE, note="steps/topk/draft tokens chosen by SGLang"),
        c("ok/eagle-b200", EAGLE + STEPS, gpu="B200"),
        c("ok/eagle3", EAGLE3 + STEPS),
        c("ok/nextn-alias", ["--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", DRAFT] + STEPS,
          note="NEXTN resolves to EAGLE"),
        c("ok/nextn-mtp-deepseek", ["--speculative-algorithm", "NEXTN"], model=M + "deepseek-v3",
          note="the draft defaults to the target's own MTP head"),
        c("ok/nextn-mtp-deepseek-b200", ["--speculative-algorithm", "EAGLE"], model=M + "deepseek-v3", gpu="B200"),
        c("ok/nextn-mtp-qwen3-next", ["--speculative-algorithm", "NEXTN"], model=M + "qwen3-next"),
        c("ok/nextn-mtp-qwen3-next-b200", ["--speculative-algorithm", "NEXTN"], model=M + "qwen3-next", gpu="B200"),
        c("ok/eagle-tree", EAGLE + TREE),
        c("ok/eagle-tree-page", EAGLE + TREE + ["--page-size", "16", "--attention-backend", "flashinfer"]),
        c("ok/draft-tokens-overridden", EAGLE + ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                                 "--speculative-num-draft-tokens", "8"],
          note="topk 1: draft tokens become steps + 1"),
        c("ok/pd-decode", PD_D),
        c("ok/pd-prefill", PD_P),
        c("ok/pd-decode-eagle", PD_D + EAGLE + STEPS),
        c("ok/pd-prefill-eagle", PD_P + EAGLE + STEPS),
        c("ok/pd-decode-eagle-b200", PD_D + EAGLE + STEPS, gpu="B200"),
        c("ok/pd-decode-radix-eagle", PD_D + EAGLE + STEPS + ["--disaggregation-decode-enable-radix-cache"]),
        c("ok/tp2", ["--tp-size", "2"]),
        c("ok/dp-attention", ["--tp-size", "4", "--dp-size", "4", "--enable-dp-attention"]),
        c("ok/attn-dp", ["--tp-size", "4", "--attn-dp-size", "4"]),
        c("ok/dp-attention-decode", PD_D + ["--tp-size", "4", "--dp-size", "2", "--enable-dp-attention"],
          note="attention TP is tp/dp = 2"),
        c("ok/dp-attention-prefill", PD_P + ["--tp-size", "4"]),
        c("ok/ngram", NGRAM),
        c("ok/spec-v2-topk1", EAGLE + STEPS, env={"SGLANG_ENABLE_SPEC_V2": "1"}),
        c("ok/spec-v2-topk4", EAGLE + TREE, env={"SGLANG_ENABLE_SPEC_V2": "1"},
          note="0.5.23 ignores the variable"),
        c("ok/dflash", DFLASH),
        c("ok/dflash-steps", DFLASH + ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4"],
          note="DFLASH forces one step, topk 1"),
        c("ok/dspark", DSPARK + ["--speculative-dspark-block-size", "4"], note="DSPARK forces one step"),
        c("ok/gemma4-assistant-eagle", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                        M + "gemma4-assistant"], note="promoted to FROZEN_KV_MTP"),
        c("ok/gemma4-assistant-nextn", ["--speculative-algorithm", "NEXTN", "--speculative-draft-model-path",
                                        M + "gemma4-assistant"]),
        c("ok/adaptive", EAGLE + STEPS + ["--speculative-adaptive"]),
        c("ok/draft-window", EAGLE + STEPS + ["--speculative-draft-window-size", "512"]),
        c("ok/draft-sink", EAGLE + STEPS + ["--speculative-draft-window-size", "512", "--speculative-draft-sink-size",
                                            "4"]),
        c("ok/qwen3", [], model=M + "qwen3"),
        c("ok/qwen3-next", [], model=M + "qwen3-next"),
        c("ok/qwen3-next-b200", [], model=M + "qwen3-next", gpu="B200"),
        c("ok/qwen3-next-pd-decode-b200", PD_D, model=M + "qwen3-next", gpu="B200"),
        c("ok/qwen3-next-pd-prefill-b200", PD_P, model=M + "qwen3-next", gpu="B200"),
        c("ok/deepseek-v3", [], model=M + "deepseek-v3"),
        c("ok/deepseek-v3-b200", [], model=M + "deepseek-v3", gpu="B200"),
        c("ok/gpt-oss", [], model=M + "gpt-oss"),
        c("ok/gemma3", [], model=M + "gemma3"),
        c("ok/falcon-h1", [], model=M + "falcon-h1"),
        c("ok/nemotron-h", [], model=M + "nemotron-h"),
        c("ok/mistral", [], model=M + "mistral"),
        c("ok/qwen2", [], model=M + "qwen2"),
        c("ok/fa3-topk", EAGLE + TREE + ["--attention-backend", "fa3"]),
        c("ok/triton-topk", EAGLE + TREE + ["--attention-backend", "triton"]),
        c("ok/kv-fp8", ["--kv-cache-dtype", "fp8_e4m3"]),
        c("ok/page-size-64", ["--page-size", "64"]),
        # --- faults from public reports ---
        c("fault/eagle-with-eagle3-draft", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                            EAGLE3_DRAFT] + STEPS, note="accept length silently 1.0"),
        c("fault/partial-steps", EAGLE + ["--speculative-num-steps", "3"]),
        c("fault/partial-topk", EAGLE + ["--speculative-eagle-topk", "2"]),
        c("fault/partial-draft-tokens", EAGLE + ["--speculative-num-draft-tokens", "4"]),
        c("fault/topk-trtllm", EAGLE + TREE + ["--attention-backend", "trtllm_mha"]),
        c("fault/topk-trtllm-b200", EAGLE + TREE, gpu="B200"),
        c("fault/topk-page-chain-backend", EAGLE + TREE + ["--page-size", "16", "--attention-backend",
                                                           "flashmla"]),
        c("fault/decode-radix-ngram", PD_D + NGRAM + ["--disaggregation-decode-enable-radix-cache"]),
        c("fault/decode-radix-standalone", PD_D + ["--speculative-algorithm", "STANDALONE",
                                                   "--speculative-draft-model-path", DRAFT,
                                                   "--disaggregation-decode-enable-radix-cache"]),
        c("fault/decode-radix-dflash", PD_D + DFLASH + ["--disaggregation-decode-enable-radix-cache"]),
        c("fault/decode-radix-hisparse", PD_D + ["--disaggregation-decode-enable-radix-cache", "--enable-hisparse"]),
        c("fault/decode-radix-fake", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake",
                                      "--disaggregation-decode-enable-radix-cache"]),
        c("fault/gemma4-assistant-eagle3", ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                            M + "gemma4-assistant"]),
        c("fault/draft-window-zero", EAGLE + STEPS + ["--speculative-draft-window-size", "0"]),
        c("fault/draft-window-negative", EAGLE + STEPS + ["--speculative-draft-window-size", "-4"]),
        c("fault/draft-sink-negative", EAGLE + STEPS + ["--speculative-draft-window-size", "8",
                                                        "--speculative-draft-sink-size", "-1"]),
        c("fault/draft-sink-without-window", EAGLE + STEPS + ["--speculative-draft-sink-size", "4"]),
        c("fault/dflash-cpu", DFLASH + ["--device", "cpu"]),
        c("fault/dflash-no-draft", ["--speculative-algorithm", "DFLASH"]),
        c("fault/dflash-block-zero", DFLASH + ["--speculative-dflash-block-size", "0"]),
        c("fault/dflash-block-mismatch", DFLASH + ["--speculative-dflash-block-size", "8",
                                                   "--speculative-num-draft-tokens", "4"]),
        c("fault/dflash-pp", DFLASH + ["--pp-size", "2"]),
        c("fault/dflash-dp-no-lm-head", DFLASH + ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]),
        c("fault/dflash-dp-cp", DFLASH + ["--tp-size", "4", "--dp-size", "2", "--enable-dp-attention",
                                          "--enable-dp-lm-head", "--attn-cp-size", "2"]),
        c("fault/dflash-dp-coordination", DFLASH + ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention",
                                                    "--enable-dp-lm-head"],
          env={"SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": "1"}),
        c("fault/dflash-window-small", DFLASH + ["--speculative-dflash-block-size", "16",
                                                 "--speculative-draft-window-size", "8"]),
        c("fault/dspark-cpu", DSPARK + ["--device", "cpu"]),
        c("fault/dspark-no-draft", ["--speculative-algorithm", "DSPARK"]),
        c("fault/dspark-block-zero", DSPARK + ["--speculative-dspark-block-size", "0"]),
        c("fault/dspark-draft-tokens", DSPARK + ["--speculative-dspark-block-size", "4",
                                                 "--speculative-num-draft-tokens", "3"]),
        c("fault/dspark-no-gamma", DSPARK),
        c("fault/dspark-draft-tokens-1", DSPARK + ["--speculative-num-draft-tokens", "1"]),
        c("fault/dspark-dp-no-lm-head", DSPARK + ["--speculative-dspark-block-size", "4", "--tp-size", "2",
                                                  "--dp-size", "2", "--enable-dp-attention"]),
        c("fault/dspark-dp-a2a", DSPARK + ["--speculative-dspark-block-size", "4", "--tp-size", "2", "--dp-size", "2",
                                           "--enable-dp-attention", "--enable-dp-lm-head",
                                           "--moe-a2a-backend", "deepep"], model=M + "deepseek-v3"),
        c("fault/dspark-dp-ragged", DSPARK + ["--speculative-dspark-block-size", "4", "--tp-size", "2",
                                              "--dp-size", "2", "--enable-dp-attention", "--enable-dp-lm-head"],
          env={"SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": "1"}, note="Kimi-K3 DCP + DSPARK without static"),
        c("ok/dspark-dp-ragged-static", DSPARK + ["--speculative-dspark-block-size", "4", "--tp-size", "2",
                                                  "--dp-size", "2", "--enable-dp-attention", "--enable-dp-lm-head"],
          env={"SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": "1", "SGLANG_RAGGED_VERIFY_MODE": "static"}),
        c("fault/dspark-dp-cp", DSPARK + ["--speculative-dspark-block-size", "4", "--tp-size", "4", "--dp-size", "2",
                                          "--enable-dp-attention", "--enable-dp-lm-head", "--attn-cp-size", "2"]),
        c("fault/dspark-dp-spec-a2a", DSPARK + ["--speculative-dspark-block-size", "4", "--tp-size", "2",
                                                "--dp-size", "2", "--enable-dp-attention", "--enable-dp-lm-head",
                                                "--speculative-moe-a2a-backend", "deepep"]),
        c("fault/dspark-pp-decode", DSPARK + ["--speculative-dspark-block-size", "4", "--pp-size", "2"]),
        c("fault/spec-coordination-ngram", NGRAM, env={"SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": "1"}),
        c("fault/block-verify-ngram", NGRAM + ["--speculative-use-block-verification"]),
        c("fault/block-verify-cpu", EAGLE + STEPS + ["--speculative-use-block-verification", "--device", "cpu"]),
        c("ok/block-verify", EAGLE + STEPS + ["--speculative-use-block-verification"]),
        c("fault/standalone-dp", ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", DRAFT,
                                  "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]),
        c("fault/rejection-ngram", NGRAM + ["--speculative-use-rejection-sampling"]),
        c("fault/rejection-topk", EAGLE + TREE + ["--speculative-use-rejection-sampling"]),
        c("fault/rejection-deterministic-cpu", EAGLE + STEPS + ["--speculative-use-rejection-sampling",
                                                                "--enable-deterministic-inference", "--device",
                                                                "cpu"]),
        c("fault/rejection-threshold", EAGLE + STEPS + ["--speculative-use-rejection-sampling",
                                                        "--speculative-accept-threshold-single", "0.5"]),
        c("fault/rejection-multi-layer", EAGLE + TREE + ["--speculative-use-rejection-sampling",
                                                         "--enable-multi-layer-eagle"]),
        c("ok/rejection", EAGLE + STEPS + ["--speculative-use-rejection-sampling"]),
        c("fault/ngram-cpu-dp", NGRAM + ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]),
        c("fault/ngram-sam-budget", NGRAM + ["--speculative-ngram-external-corpus-path", M + "llama/config.json",
                                             "--speculative-ngram-external-sam-budget", "0"]),
        c("fault/ngram-corpus-tokens", NGRAM + ["--speculative-ngram-external-corpus-path", M + "llama/config.json",
                                                "--speculative-ngram-external-corpus-max-tokens", "0"]),
        c("fault/ngram-sam-over", NGRAM + ["--speculative-ngram-external-corpus-path", M + "llama/config.json",
                                           "--speculative-ngram-external-sam-budget", "64",
                                           "--speculative-num-draft-tokens", "8"]),
        c("fault/ngram-topk-page", NGRAM + ["--speculative-ngram-max-bfs-breadth", "4", "--page-size", "16"]),
        c("fault/adaptive-steps", EAGLE + ["--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                                           "--speculative-num-draft-tokens", "3", "--speculative-adaptive"]),
        c("fault/uno-cpu", UNO + ["--device", "cpu"]),
        c("fault/uno-draft", UNO + ["--speculative-draft-model-path", DRAFT]),
        c("fault/uno-no-lora", ["--speculative-algorithm", "UNO"]),
        c("fault/uno-deterministic", UNO + ["--enable-deterministic-inference"]),
        c("fault/uno-strict-thinking", UNO + ["--enable-strict-thinking"]),
        c("fault/uno-no-width", UNO),
        c("fault/uno-topk-zero", UNO + ["--speculative-num-draft-tokens", "4", "--speculative-eagle-topk", "0"]),
        c("fault/uno-tree-no-steps", UNO + ["--speculative-num-draft-tokens", "4", "--speculative-eagle-topk", "2"]),
        c("fault/uno-tree-steps-zero", UNO + ["--speculative-num-draft-tokens", "4", "--speculative-eagle-topk", "2",
                                              "--speculative-num-steps", "0"]),
        c("fault/uno-tree-q-lt-f", UNO + ["--speculative-num-draft-tokens", "2", "--speculative-eagle-topk", "2",
                                          "--speculative-num-steps", "4"]),
        c("fault/uno-tree-q-128", UNO + ["--speculative-num-draft-tokens", "200", "--speculative-eagle-topk", "2",
                                         "--speculative-num-steps", "4"]),
        c("fault/uno-tree-qk", UNO + ["--speculative-num-draft-tokens", "100", "--speculative-eagle-topk", "32",
                                      "--speculative-num-steps", "4"]),
        c("fault/uno-tree-capacity", UNO + ["--speculative-num-draft-tokens", "10", "--speculative-eagle-topk", "2",
                                            "--speculative-num-steps", "2"]),
        c("fault/uno-tree-parent", UNO + ["--speculative-num-draft-tokens", "8", "--speculative-eagle-topk", "2",
                                          "--speculative-num-steps", "3"]),
        c("fault/uno-tree-pdmux", UNO + ["--speculative-num-draft-tokens", "4", "--speculative-eagle-topk", "2",
                                         "--speculative-num-steps", "3", "--enable-pdmux"]),
        c("fault/uno-tree-tbo", UNO + ["--speculative-num-draft-tokens", "4", "--speculative-eagle-topk", "2",
                                       "--speculative-num-steps", "3", "--enable-two-batch-overlap"]),
        c("fault/uno-tree-threshold", UNO + ["--speculative-num-draft-tokens", "4", "--speculative-eagle-topk", "2",
                                             "--speculative-num-steps", "3",
                                             "--speculative-accept-threshold-single", "0.5"]),
        c("fault/uno-tp", UNO + ["--speculative-num-draft-tokens", "4", "--tp-size", "2"]),
        c("fault/uno-dp", UNO + ["--speculative-num-draft-tokens", "4", "--attn-cp-size", "2"]),
        c("fault/uno-lora", UNO + ["--speculative-num-draft-tokens", "4", "--enable-lora"]),
        c("fault/uno-rejection", UNO + ["--speculative-num-draft-tokens", "4", "--speculative-use-rejection-sampling"]),
        c("fault/uno-backend", UNO + ["--speculative-num-draft-tokens", "4", "--attention-backend", "flashinfer"]),
        c("ok/uno", UNO + ["--speculative-num-draft-tokens", "4"]),
        c("fault/iquest-no-draft", ["--speculative-algorithm", "EAGLE"], model=M + "iquest-q1"),
        c("fault/iquest-draft-not-mtp", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", DRAFT],
          model=M + "iquest-q1"),
        c("ok/iquest-mtp", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                            M + "iquest-q1-mtp"], model=M + "iquest-q1"),
        c("fault/iquest-token-map", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                     M + "iquest-q1-mtp", "--speculative-token-map", M + "llama/config.json"],
          model=M + "iquest-q1"),
        c("fault/iquest-steps-zero", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                      M + "iquest-q1-mtp", "--speculative-num-steps", "0"], model=M + "iquest-q1"),
        c("fault/iquest-topk", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                M + "iquest-q1-mtp", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2"],
          model=M + "iquest-q1"),
        c("fault/iquest-width", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                 M + "iquest-q1-mtp", "--speculative-num-steps", "3",
                                 "--speculative-num-draft-tokens", "8"], model=M + "iquest-q1"),
        # --- PD disaggregation ---
        c("fault/pd-host-threshold", PD_D + ["--disaggregation-decode-host-receive-threshold", "2"]),
        c("fault/pd-host-hisparse", PD_D + ["--disaggregation-decode-host-receive-threshold", "0.5",
                                            "--enable-hisparse"]),
        c("fault/pd-host-retraction", PD_D + ["--disaggregation-decode-host-receive-threshold", "0.5"]),
        c("fault/pd-dcp-backend", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl",
                                   "--dcp-size", "2", "--tp-size", "2"]),
        c("fault/pd-prefill-fake", ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "fake"]),
        c("fault/pd-staging-mori", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mori"],
          env={"SGLANG_DISAGG_STAGING_BUFFER": "1"}),
        c("fault/pd-role-switch", PD_D + ["--enable-pd-role-switch", "--enable-hisparse"]),
        c("fault/pd-prefill-complete", PD_D + ["--disaggregation-decode-allocation-policy", "prefill_complete",
                                               "--enable-hisparse"]),
        c("fault/pd-rust-bootstrap", PD_P + ["--disaggregation-bootstrap-port", "8998"],
          env={"SGLANG_RUST_SERVER": "1"}),
        c("fault/encoder-prefix-cache", ["--enable-prefix-mm-cache"], model=M + "qwen2-vl"),
        c("fault/encoder-and-language", ["--encoder-only", "--language-only"], model=M + "qwen2-vl"),
        c("fault/encoder-pd", ["--encoder-only"] + PD_P, model=M + "qwen2-vl"),
        c("fault/encoder-arch", ["--encoder-only"], model=LLAMA),
        c("ok/encoder-only", ["--encoder-only"], model=M + "qwen2-vl"),
        c("ok/language-only", ["--language-only", "--encoder-urls", "http://127.0.0.1:30010"], model=M + "qwen2-vl"),
        c("fault/mooncake-encoder-transfer", ["--language-only", "--encoder-transfer-backend", "mooncake"],
          model=M + "qwen2-vl", note="mooncake encoder transfer without HTTP encoders"),
        c("fault/mori-state", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mori"],
          model=M + "qwen3-next", note="mori cannot send every state type"),
        c("ok/mori", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mori"]),
        c("ok/nixl", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl"]),
        c("ok/pd-fake-decode", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake"]),
        c("fault/dflash-dp-xpu", DFLASH + ["--device", "xpu", "--tp-size", "2", "--dp-size", "2",
                                           "--enable-dp-attention"]),
        c("fault/ngram-corpus-max-tokens", NGRAM + ["--speculative-ngram-external-corpus-path",
                                                    M + "llama/config.json", "--speculative-ngram-external-sam-budget",
                                                    "2", "--speculative-ngram-external-corpus-max-tokens", "0"]),
        c("fault/ngram-device-hpu", NGRAM + ["--device", "hpu"]),
        c("fault/rejection-standalone", ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
                                         DRAFT, "--speculative-use-rejection-sampling"] + STEPS),
        c("fault/rejection-deterministic-cpu-triton", EAGLE + STEPS + [
            "--speculative-use-rejection-sampling", "--enable-deterministic-inference", "--device", "cpu",
            "--attention-backend", "triton"]),
        c("fault/iquest-draft-hidden", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                        M + "iquest-q1-mtp-wide"], model=M + "iquest-q1"),
        c("fault/iquest-draft-layers", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                        M + "iquest-q1-mtp-short"], model=M + "iquest-q1"),
        c("fault/iquest-backend", ["--attention-backend", "flashinfer"], model=M + "iquest-q1"),
        c("fault/iquest-eagle3", ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                  M + "iquest-q1-mtp"], model=M + "iquest-q1"),
        c("fault/iquest-draft-backend", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                         M + "iquest-q1-mtp", "--speculative-draft-attention-backend", "flashinfer"],
          model=M + "iquest-q1"),
        c("fault/iquest-cp", ["--tp-size", "2", "--attn-cp-size", "2"], model=M + "iquest-q1"),
        c("fault/iquest-multi-layer", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                                       M + "iquest-q1-mtp", "--enable-multi-layer-eagle"], model=M + "iquest-q1"),
        c("fault/iquest-dp", ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"], model=M + "iquest-q1"),
        c("fault/iquest-pp", ["--pp-size", "2"], model=M + "iquest-q1"),
        c("ok/iquest", [], model=M + "iquest-q1"),
        c("ok/deepseek-v32", [], model=M + "deepseek-v32"),
        c("ok/deepseek-v32-b200", [], model=M + "deepseek-v32", gpu="B200"),
        c("fault/dsa-dcp-hicache", ["--tp-size", "2", "--dcp-size", "2", "--enable-hierarchical-cache"],
          model=M + "deepseek-v32"),
        c("fault/dsa-dcp-pd", ["--tp-size", "2", "--dcp-size", "2"] + PD_D, model=M + "deepseek-v32"),
        c("fault/dsa-dcp-topk", ["--tp-size", "2", "--dcp-size", "2", "--speculative-algorithm", "EAGLE",
                                 "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                                 "--speculative-num-draft-tokens", "4"], model=M + "deepseek-v32"),
        c("fault/dsa-prefill-cp-tp16", ["--tp-size", "16", "--enable-prefill-cp", "--attn-cp-size", "2"],
          model=M + "deepseek-v32"),
        c("fault/minicpm-dp", ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"], model=M + "minicpm-sala"),
        c("fault/minicpm-hicache", ["--enable-hierarchical-cache"], model=M + "minicpm-sala"),
        c("fault/minicpm-pd", PD_D, model=M + "minicpm-sala"),
        c("ok/minicpm-sala", [], model=M + "minicpm-sala"),
        c("fault/pd-host-cpu-tensor", PD_D + ["--disaggregation-decode-host-receive-threshold", "0.5",
                                              "--disaggregation-decode-retraction-backup", "cpu_tensor"]),
        c("fault/pd-dcp-backend-ascend", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
                                          "fake", "--dcp-size", "2", "--tp-size", "2"]),
        c("fault/pd-role-switch-spec", PD_D + EAGLE + STEPS + ["--enable-pd-role-switch"]),
        c("fault/pd-rust-bootstrap-nixl", ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend",
                                           "nixl", "--disaggregation-bootstrap-port", "9100"],
          env={"SGLANG_RUST_SERVER": "1"}),
        c("fault/pd-rust-bootstrap-fake", ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
                                           "fake", "--disaggregation-bootstrap-port", "9100"],
          env={"SGLANG_RUST_SERVER": "1"}),
        c("fault/uno-cp", UNO + ["--speculative-num-draft-tokens", "4", "--tp-size", "2", "--dp-size", "2",
                                 "--enable-dp-attention"]),
        c("fault/dspark-dp-ragged-compact", DSPARK + ["--speculative-dspark-block-size", "4", "--tp-size", "2",
                                                      "--dp-size", "2", "--enable-dp-attention", "--enable-dp-lm-head"],
          env={"SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": "1", "SGLANG_RAGGED_VERIFY_MODE": "compact"}),
        c("fault/attn-dp-and-dp", ["--tp-size", "4", "--dp-size", "2", "--attn-dp-size", "2"]),
        c("fault/gpt-oss-xpu-fp16", ["--device", "xpu", "--dtype", "float16"], model=M + "gpt-oss"),
        # --- MiniMax-M3.1 NVFP4 (a config-only fixture with its quantization_config) ---
        c("ok/minimax-m3-nvfp4-b200", [], model=MM3, env=M3ENV, gpu="B200"),
        c("ok/minimax-m3-nvfp4-h100", [], model=MM3, env=M3ENV),
        c("fault/minimax-m3-eagle", EAGLE + STEPS, model=MM3, env=M3ENV, gpu="B200"),
        c("fault/minimax-m3-dspark-h100", DSPARK + ["--speculative-dspark-block-size", "4"], model=MM3, env=M3ENV),
        c("fault/minimax-m3-dspark-ragged", DSPARK + ["--speculative-dspark-block-size", "4"], model=MM3,
          env={**M3ENV, "SGLANG_RAGGED_VERIFY_MODE": "compact"}, gpu="B200"),
        c("fault/minimax-m3-dspark-pp", DSPARK + ["--speculative-dspark-block-size", "4", "--pp-size", "2"], model=MM3,
          env={**M3ENV, "SGLANG_RAGGED_VERIFY_MODE": "static"}, gpu="B200"),
        c("fault/minimax-m3-dflash-pd", DFLASH + PD_D, model=MM3, env={**M3ENV, "SGLANG_RAGGED_VERIFY_MODE": "static"},
          gpu="B200"),
        c("fault/minimax-m3-page-size", ["--page-size", "64"], model=MM3, env=M3ENV, gpu="B200"),
        c("fault/minimax-m3-trtllm-routed-a2a", ["--moe-runner-backend", "flashinfer_trtllm_routed",
                                                 "--moe-a2a-backend", "deepep"], model=MM3, env=M3ENV, gpu="B200"),
        c("fault/minimax-m3-a2a", ["--moe-a2a-backend", "deepep"], model=MM3, env=M3ENV, gpu="B200"),
        c("fault/minimax-m3-kv-dtype", ["--kv-cache-dtype", "bf16"], model=MM3, env=M3ENV, gpu="B200"),
        c("ok/qwen4-exp", [], model=M + "qwen4-exp-startup"),
        c("ok/qwen4-exp-b200", [], model=M + "qwen4-exp-startup", gpu="B200"),
        c("fault/qwen4-exp-fp8-indexer", ["--qsa-indexer-dtype", "fp8_e4m3"], model=M + "qwen4-exp-startup"),
        c("fault/qwen4-exp-unified-memory", ["--enable-unified-memory"], model=M + "qwen4-exp-startup"),
        c("fault/qwen4-exp-mori-pp", ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mori",
                                      "--pp-size", "2"], model=M + "qwen4-exp-startup"),
        # --- model overrides reached through their own config-only fixtures ---
        c("fault/kimi-k3-dcp-dspark-ragged", ["--tp-size", "8", "--dcp-size", "8", *DSPARK,
                                              "--speculative-dspark-block-size", "4"], model=M + "kimi-k3",
          env={"SGLANG_RAGGED_VERIFY_MODE": "compact"}, gpu="B200"),
        c("fault/kimi-k3-dcp-decode-backend", ["--tp-size", "8", "--dcp-size", "8", "--decode-attention-backend",
                                               "triton"], model=M + "kimi-k3", gpu="B200"),
        c("ok/minimax-m3-nvfp4-text", [], model=M + "minimax-m3-nvfp4-text", env=M3ENV, gpu="B200"),
        c("fault/minimax-m3-text-dspark", DSPARK + ["--speculative-dspark-block-size", "4"],
          model=M + "minimax-m3-nvfp4-text", env={**M3ENV, "SGLANG_RAGGED_VERIFY_MODE": "static"}, gpu="B200"),
        c("ok/hy-v4", ["--tp-size", "8"], model=M + "hy-v4", gpu="H200"),
        c("fault/hy-v4-prefill-cp", ["--tp-size", "8", "--enable-prefill-cp"], model=M + "hy-v4", gpu="H200"),
        c("fault/hy-v4-dcp", ["--tp-size", "8", "--dcp-size", "8"], model=M + "hy-v4", gpu="H200"),
        c("ok/dsa-kpool", ["--tp-size", "8"], model=M + "deepseek-v32-kpool"),
        c("fault/dsa-kpool-dcp", ["--tp-size", "8", "--dcp-size", "8"], model=M + "deepseek-v32-kpool"),
        c("ok/ernie45-vl", ["--tp-size", "2"], model=M + "ernie45-vl"),
        c("fault/ernie45-vl-dp-attention", ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"],
          model=M + "ernie45-vl"),
        c("ok/qwen3-moe-w4a16", ["--quantization", "modelopt_mixed"], model=QW4, gpu="B200"),
        c("ok/qwen3-moe-w4a16-auto", [], model=QW4, gpu="B200"),
        c("fault/qwen3-moe-w4a16-runner", ["--moe-runner-backend", "flashinfer_trtllm"], model=QW4, gpu="B200"),
        c("fault/qwen3-moe-w4a16-cutedsl", ["--quantization", "modelopt_mixed", "--moe-runner-backend",
                                            "flashinfer_cutedsl"], model=QW4, gpu="B200"),
        c("ok/qwen3-moe-w4a16-cutedsl", ["--quantization", "modelopt_mixed", "--moe-runner-backend",
                                         "flashinfer_cutedsl"], model=QW4, gpu="B200",
          env={"SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16": "1"}),
        c("ok/nemotron-h-eplb", ["--tp-size", "2", "--ep-size", "2", "--enable-eplb"], model=M + "nemotron-h",
          gpu="B200"),
        c("fault/nemotron-h-eplb-trtllm", ["--tp-size", "2", "--ep-size", "2", "--enable-eplb", "--moe-runner-backend",
                                           "flashinfer_trtllm"], model=M + "nemotron-h", gpu="B200"),
        c("fault/nemotron-h-eplb-cutedsl", ["--tp-size", "2", "--ep-size", "2", "--enable-eplb",
                                            "--moe-runner-backend", "flashinfer_cutedsl"], model=M + "nemotron-h",
          gpu="B200"),
        c("ok/muse-spark-language-only", ["--tp-size", "8", "--language-only"], model=M + "muse-spark", gpu="B200"),
        c("fault/muse-spark-language-only-dispatch", ["--tp-size", "8", "--language-only",
                                                      "--enable-adaptive-dispatch-to-encoder"], model=M + "muse-spark",
          gpu="B200"),
        c("ok/nemotron-h-w4a16", [], model=NW4),
        c("ok/nemotron-h-w4a16-b200", [], model=NW4, gpu="B200"),
        c("fault/nemotron-h-w4a16-a2a", ["--tp-size", "4", "--ep-size", "4", "--moe-a2a-backend", "deepep"], model=NW4),
        c("fault/nemotron-h-w4a16-runner", ["--moe-runner-backend", "flashinfer_cutlass"], model=NW4),
        c("ok/nemotron-h-puzzle", ["--tp-size", "2"], model=M + "nemotron-h-puzzle", gpu="B200"),
        c("fault/nemotron-h-puzzle-eplb", ["--tp-size", "2", "--ep-size", "2", "--enable-eplb"],
          model=M + "nemotron-h-puzzle", gpu="B200"),
        c("fault/usage-unknown-flag", ["--no-such-flag"]),
        c("fault/usage-bad-choice", ["--speculative-algorithm", "MEDUSA"]),
    ]
    return out


def preset_cases(*, write: bool = True) -> list[dict[str, Any]]:
    """`specctl export sglang` of every preset, with model paths mapped to local config-only fixtures."""
    from specctl.schemas.sglang.export import export_commands
    from specctl.schemas.validator import load_deployment

    remap = {"/models/Meta-Llama-3.1-8B-Instruct": LLAMA, "/models/Llama-3.2-1B-Instruct": DRAFT,
             str(ROOT / "engine" / "builtin_models" / "tiny-hybrid"): "engine/builtin_models/tiny-hybrid",
             str(ROOT / "engine" / "builtin_models" / "tiny-draft"): "engine/builtin_models/tiny-draft"}
    out = []
    for preset in sorted((ROOT / "presets").glob("*.yaml")):
        cmds = export_commands(load_deployment(str(preset)))
        for role in ("prefill", "decode", "colocated"):
            argv = getattr(cmds, role)
            if not argv:
                continue
            argv = list(argv)
            while argv and argv[0] != "--model-path" and not argv[0].startswith("--"):
                argv.pop(0)  # python -m sglang.launch_server
            argv = [remap.get(a, a) for a in argv]
            for name, text in cmds.files.items():
                if name in argv:
                    path = f"{FILES_DIR}/{preset.stem}-{name}"
                    if write:
                        (ROOT / path).parent.mkdir(parents=True, exist_ok=True)
                        (ROOT / path).write_text(text, encoding="utf-8")
                    argv[argv.index(name)] = path
            for gpu in ("H100", "B200"):
                out.append({"id": f"preset/{preset.stem}/{role}/{gpu}", "argv": argv, "env": {}, "gpu": gpu,
                            "note": f"specctl export sglang -c presets/{preset.name}"})
    return out


def record(cases: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    from specctl.schemas.sglang.resolver import ResolveCase, resolve

    sites = census()
    release, verdicts = resolve([ResolveCase(tuple(c["argv"]), c["env"], c["gpu"]) for c in cases], cwd=str(ROOT))
    out = []
    for c, v in zip(cases, verdicts, strict=True):
        err = None
        if v.error is not None:
            s = site_at(sites, v.error.site)
            err = {"type": v.error.type, "message": v.error.message, "site": v.error.site,
                   "function": v.error.function, "site_id": s.id if s else None}
        resolved = {k: v.resolved.get(k) for k in RECORDED if k in v.resolved}
        out.append({**c, "verdict": {"ok": v.ok, "error": err, "resolved": resolved}})
    return release.sglang, out


def classify(recorded: list[dict[str, Any]]) -> dict[str, Any]:
    old = json.loads(SITES_FILE.read_text()) if SITES_FILE.exists() else {}
    old_sites = old.get("sites", {})
    reached: dict[str, list[str]] = {}
    for c in recorded:
        err = c["verdict"]["error"]
        if err and err.get("site_id"):
            reached.setdefault(err["site_id"], []).append(c["id"])
    out: dict[str, Any] = {}
    for s in census():
        entry: dict[str, Any] = {"file": s.file, "function": s.function, "kind": s.kind, "line": s.line}
        before = old_sites.get(s.id, {})
        if s.id in reached:
            entry["reached_by"] = reached[s.id]
        elif before.get("not_covered"):
            entry["not_covered"] = before["not_covered"]
        else:
            entry["unreachable"] = before.get("unreachable") or None
        out[s.id] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only list the unclassified sites (exit 1 if any)")
    args = ap.parse_args(argv)
    cases = hand_cases() + preset_cases()
    ids = [c["id"] for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise SystemExit(f"duplicate case ids: {sorted(dup)}")
    version, recorded = record(cases)
    sites = classify(recorded)
    open_sites = [sid for sid, e in sites.items()
                  if "reached_by" not in e and not e.get("unreachable") and not e.get("not_covered")]
    if not args.check:
        CASES_FILE.write_text(json.dumps({"sglang": version, "recorded_fields": list(RECORDED), "cases": recorded},
                                         indent=1) + "\n", encoding="utf-8")
        SITES_FILE.write_text(json.dumps({"sglang": version, "sites": sites}, indent=1) + "\n", encoding="utf-8")
    n_reached = sum(1 for e in sites.values() if "reached_by" in e)
    n_unreachable = sum(1 for e in sites.values() if e.get("unreachable"))
    n_not_covered = sum(1 for e in sites.values() if e.get("not_covered"))
    print(f"SGLang {version}: {len(recorded)} cases, {sum(c['verdict']['ok'] for c in recorded)} accepted; "
          f"{len(sites)} raise sites: {n_reached} reached, {n_unreachable} unreachable from flags/env/config.json, "
          f"{n_not_covered} reachable but not yet covered, {len(open_sites)} unclassified")
    for sid in open_sites:
        print("  open:", sid[:200])
    return 1 if (args.check and open_sites) else 0


if __name__ == "__main__":
    raise SystemExit(main())
