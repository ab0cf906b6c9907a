"""Model families SGLang 0.5.23 serves, from `config.json` alone: layer kinds and the ordered
`state_types` SGLang registers for PD transfer.

Derived from SGLang's code (not from its docs):
- which KV pool a model gets: `configs/model_config.py` (`is_hybrid_swa_model` and its
  `hybrid_swa_archs` / `SWA_SINK_ARCHS`; `is_hybrid_swa` is off with `--disable-hybrid-swa-memory`,
  which SGLang forces for Gemma 2/3 in `arg_groups/model_overrides/gemma2_gemma3.py`) and
  `configs/hybrid_arch.py` (`mambaish_config`: Qwen3-Next / Qwen3.5 gated delta-net, Nemotron-H,
  Falcon-H1, LFM2, Mamba/Mamba2, Kimi-Linear ... get the hybrid linear (Mamba-state) pool);
- which state components a pool registers: `disaggregation/utils.py setup_state_kv_args`, values
  of `StateType` (`disaggregation/base/conn.py`): `HybridLinearKVPool` -> `mamba`; `SWAKVPool` ->
  `swa` (+ `block_scale` / `block_scale_swa` with `--kv-cache-dtype mxfp8`); an MXFP8 MHA pool ->
  `block_scale`; a plain MHA / MLA pool -> none.

Layer kinds: `full` (full attention), `swa` (sliding window), `mamba` (Mamba/Mamba2 SSM), `linear`
(gated delta-net / linear attention, Mamba-style state), `conv` (LFM2 short conv, Mamba-style state),
`hybrid` (attention and Mamba in parallel in one layer, Falcon-H1), `mlp` / `moe` (Nemotron-H layers
without a sequence mixer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POOL_MHA, POOL_SWA, POOL_MAMBA, POOL_MLA = "mha", "swa", "mamba", "mla"

# configs/model_config.py is_hybrid_swa_model (hybrid_swa_archs, SWA_SINK_ARCHS, MIMO_V2_MODEL_ARCHS)
SWA_POOL_ARCHS = frozenset({
    "GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "IQuestQ1ForCausalLM",
    "Llama4ForConditionalGeneration", "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM",
    "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "LagunaForCausalLM", "MellumForCausalLM",
    "BeamForCausalLM",
})
# configs/hybrid_arch.py mambaish_config: hybrid linear attention / SSM models
MAMBA_POOL_ARCHS = frozenset({
    "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "NemotronHForCausalLM", "FalconH1ForCausalLM",
    "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM",
    "FalconMambaForCausalLM", "KimiLinearForCausalLM", "GraniteMoeHybridForCausalLM", "JetNemotronForCausalLM",
})
MLA_ARCHS = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK2ForCausalLM"})
# SGLang forces --disable-hybrid-swa-memory for these (model_overrides/gemma2_gemma3.py)
FORCED_NO_HYBRID_SWA = frozenset({
    "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
    "Gemma3nForCausalLM", "Gemma3nForConditionalGeneration",
})
PLAIN_ARCHS = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "Phi3ForCausalLM", "SpecctlHybridForCausalLM",
    "GraniteForCausalLM", "OlmoForCausalLM", "Olmo2ForCausalLM",
})
KNOWN_ARCHS = SWA_POOL_ARCHS | MAMBA_POOL_ARCHS | MLA_ARCHS | FORCED_NO_HYBRID_SWA | PLAIN_ARCHS

_HF_KIND = {
    "full_attention": "full", "attention": "full", "full": "full", "sliding_attention": "swa", "swa": "swa",
    "linear_attention": "linear", "mamba": "mamba", "conv": "conv", "ssm": "mamba",
}
_NEMOTRON = {"M": "mamba", "*": "full", "-": "mlp", "E": "moe"}
MAMBA_STATE_KINDS = ("mamba", "linear", "conv", "hybrid")


class FamilyError(ValueError):
    """config.json lacks or garbles a field the family needs (the message names it)."""


@dataclass(frozen=True)
class SGLangModel:
    """What SGLang makes of a model directory's config.json (no weights, no torch)."""

    architecture: str
    known: bool
    layer_kinds: tuple[str, ...]
    pool: str  # mha | swa | mamba | mla
    num_kv_heads: int | None
    head_dim: int | None
    torch_dtype: str | None
    vocab_size: int | None
    mamba_ssm_dtype: str | None

    @property
    def is_hybrid(self) -> bool:
        return self.pool in (POOL_SWA, POOL_MAMBA)

    def state_types(self, *, kv_cache_dtype: str = "auto", disable_hybrid_swa_memory: bool = False) -> tuple[str, ...]:
        """The ordered `kv_args.state_types` SGLang registers with these flags."""
        pool = self.effective_pool(disable_hybrid_swa_memory=disable_hybrid_swa_memory)
        mx = kv_cache_dtype == "mxfp8"
        if pool == POOL_MAMBA:
            return ("mamba",)
        if pool == POOL_SWA:
            return ("swa", "block_scale", "block_scale_swa") if mx else ("swa",)
        if pool == POOL_MHA and mx:
            return ("block_scale",)
        return ()

    def effective_pool(self, *, disable_hybrid_swa_memory: bool = False) -> str:
        if self.pool == POOL_SWA and (disable_hybrid_swa_memory or self.architecture in FORCED_NO_HYBRID_SWA):
            return POOL_MHA
        return self.pool


MAX_LAYERS = 10_000


def _int(cfg: dict[str, Any], key: str, default: int | None = None, *, lo: int = 0, hi: int = MAX_LAYERS) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FamilyError(f"config.json field {key!r} must be an integer in {lo}..{hi}, got {str(v)[:40]!r}")
    return v


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    tc = cfg.get("text_config")
    if isinstance(tc, dict):
        merged = dict(tc)
        merged.setdefault("architectures", cfg.get("architectures"))
        return merged
    return cfg


def _layer_types(cfg: dict[str, Any], n: int) -> tuple[str, ...] | None:
    lt = cfg.get("layer_types")
    if not isinstance(lt, list):
        return None
    kinds = []
    for k in lt:
        if not isinstance(k, str) or k not in _HF_KIND:
            raise FamilyError(f"config.json layer_types holds {str(k)[:40]!r}; expected one of {sorted(_HF_KIND)}")
        kinds.append(_HF_KIND[k])
    if len(kinds) != n:
        raise FamilyError(f"config.json layer_types has {len(kinds)} entries but num_hidden_layers={n}")
    return tuple(kinds)


def _every(n: int, interval: int, on: str, off: str) -> tuple[str, ...]:
    if interval <= 0:
        raise FamilyError(f"config.json layer interval must be positive, got {interval}")
    return tuple(on if (i + 1) % interval == 0 else off for i in range(n))


def _kinds_qwen3_next(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    lt = _layer_types(cfg, n)
    if lt is not None:
        return lt
    # Qwen3NextConfig.layers_block_type: every full_attention_interval-th layer is full attention
    return _every(n, _int(cfg, "full_attention_interval", 4, lo=1), "full", "linear")


def _kinds_nemotron_h(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    pattern = cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or len(pattern) != n or any(c not in _NEMOTRON for c in pattern):
        raise FamilyError(f"config.json hybrid_override_pattern must be {n} characters of M, *, -, E; got {pattern!r}")
    return tuple(_NEMOTRON[c] for c in pattern)


def _kinds_gemma3(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    lt = _layer_types(cfg, n)
    if lt is not None:
        return lt
    # Gemma 3: every sliding_window_pattern-th layer is global (full) attention
    return _every(n, _int(cfg, "sliding_window_pattern", 6, lo=1), "full", "swa")


def _kinds_gpt_oss(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    lt = _layer_types(cfg, n)
    if lt is not None:
        return lt
    return tuple("swa" if i % 2 == 0 else "full" for i in range(n))  # gpt-oss alternates, sliding first


def _kinds_llama4(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    return _every(n, 4, "full", "swa")  # model_config.get_hybrid_layer_ids: (i + 1) % 4 == 0 is full


def _kinds_default(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    lt = _layer_types(cfg, n)
    return lt if lt is not None else tuple("full" for _ in range(n))


_KINDS: dict[str, Callable[[dict[str, Any], int], tuple[str, ...]]] = {
    "Qwen3NextForCausalLM": _kinds_qwen3_next,
    "Qwen3_5ForConditionalGeneration": _kinds_qwen3_next,
    "Qwen3_5MoeForConditionalGeneration": _kinds_qwen3_next,
    "NemotronHForCausalLM": _kinds_nemotron_h,
    "FalconH1ForCausalLM": lambda cfg, n: tuple("hybrid" for _ in range(n)),
    "Mamba2ForCausalLM": lambda cfg, n: tuple("mamba" for _ in range(n)),
    "MambaForCausalLM": lambda cfg, n: tuple("mamba" for _ in range(n)),
    "FalconMambaForCausalLM": lambda cfg, n: tuple("mamba" for _ in range(n)),
    "Gemma3ForCausalLM": _kinds_gemma3,
    "Gemma3ForConditionalGeneration": _kinds_gemma3,
    "Gemma2ForCausalLM": lambda cfg, n: _every(n, 2, "full", "swa"),
    "GptOssForCausalLM": _kinds_gpt_oss,
    "Llama4ForConditionalGeneration": _kinds_llama4,
}


def architecture_of(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    mt = cfg.get("model_type")
    return str(mt) if isinstance(mt, str) else "?"


def sglang_model(cfg: dict[str, Any]) -> SGLangModel:
    """What SGLang derives from this config.json; FamilyError naming the field when unusable.

    An architecture not in SGLang's lists above is `known=False`, treated as a plain MHA model."""
    arch = architecture_of(cfg)
    tc = _text_config(cfg)
    n = _int(tc, "num_hidden_layers")
    kinds = _KINDS.get(arch, _kinds_default)(tc, n)
    if arch in MAMBA_POOL_ARCHS:
        pool = POOL_MAMBA
    elif arch in SWA_POOL_ARCHS or arch in FORCED_NO_HYBRID_SWA:
        pool = POOL_SWA
    elif arch in MLA_ARCHS:
        pool = POOL_MLA
    else:
        pool = POOL_MHA
    heads = tc.get("num_attention_heads")
    kv = tc.get("num_key_value_heads", heads)
    hidden = tc.get("hidden_size")
    head_dim = tc.get("head_dim")
    if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        head_dim = hidden // heads
    dtype = tc.get("torch_dtype", tc.get("dtype", cfg.get("torch_dtype")))
    ssm = tc.get("mamba_ssm_dtype") or tc.get("mamba2_ssm_dtype")
    return SGLangModel(
        architecture=arch,
        known=arch in KNOWN_ARCHS,
        layer_kinds=kinds,
        pool=pool,
        num_kv_heads=kv if isinstance(kv, int) and not isinstance(kv, bool) else None,
        head_dim=head_dim if isinstance(head_dim, int) and not isinstance(head_dim, bool) else None,
        torch_dtype=dtype if isinstance(dtype, str) else None,
        vocab_size=tc.get("vocab_size") if isinstance(tc.get("vocab_size"), int) else None,
        mamba_ssm_dtype=ssm if isinstance(ssm, str) else None,
    )
