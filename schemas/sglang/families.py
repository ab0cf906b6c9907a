"""Model families SGLang serves, from `config.json` alone: layer kinds, the KV pool, the ordered
`state_types` SGLang registers for PD transfer, and the MTP/NextN draft head a checkpoint ships.

The architecture lists come from `families.json`, generated from SGLang's own source by
`scripts/gen_sglang_families.py` (which fails on a release with a `StateType`, pool class or speculative
algorithm nobody classified). What each pool registers follows `disaggregation/utils.py
setup_state_kv_args` and the pool choice follows `mem_cache/kv_cache_configurator.py
_build_token_to_kv_pool` (CUDA), in that order:

- DeepSeek-V4 (`is_deepseek_v4`): `DeepSeekV4TokenToKVPool` -> `swa`, `swa_ring` (unified KV: ROCm with
  `SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton`), `c128_state` (a compress ratio of 128 or 2); with its
  NextN/DSpark draft pool a second `swa` (or `swa_ring`) and, for DSPARK off ROCm, `request_row`;
- MLA attention and hybrid SWA: `SWAKVPool` over MLA sub-pools -> `swa`;
- MLA attention, DSA (`is_deepseek_dsa`: architecture and `index_topk`), not Mamba-ish:
  `DSATokenToKVPool` -> `dsa` (+ `dsa_tail` with `index_kpool` > 1 and `index_kpool_compress`), whatever
  `--kv-cache-dtype`;
- other MLA: `MLATokenToKVPool` -> nothing;
- hybrid SWA (`is_hybrid_swa_model`, off with `--disable-hybrid-swa-memory`, which SGLang forces for the
  Gemma 2/3 overrides): `SWAKVPool` -> `swa` (+ `block_scale`, `block_scale_swa` under mxfp8);
- MiniMax sparse: `MiniMaxSparseKVPool` -> `minimax_index_k` (K-only sparse layers), `minimax_dense_kv`
  (dense layers); value-sparse layers have no PD support (SGLang raises NotImplementedError);
- Mamba-ish (`configs/hybrid_arch.py mambaish_config`, by the config's `model_type`): `HybridLinearKVPool`
  -> `mamba` (+ `dsa`, `dsa_tail` for a DSA model on MLA; a QSA text config (`indexer_n_heads`) makes it a
  `QSATokenToKVPool` -> + `qsa_pending`, `qsa_compressed`);
- else `MHATokenToKVPool` -> nothing, or `block_scale` under mxfp8;
- finally a Mamba-ish model whose pool registered no `mamba` (hybrid SWA beside Mamba) appends `mamba`
  from its hybrid request pool.

Layer kinds: `full` (full attention; MLA/DSA layers and DeepSeek-V4's compressed layers too), `swa`
(sliding window), `mamba` (Mamba/Mamba2 SSM), `linear` (gated delta-net / KDA linear attention, Mamba-style
state), `conv` (LFM2 short conv), `hybrid` (attention and Mamba in parallel, Falcon-H1), `sparse` (MiniMax
sparse-index attention), `mlp` / `moe` (Nemotron-H layers without a sequence mixer).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POOL_MHA, POOL_SWA, POOL_MAMBA, POOL_MLA = "mha", "swa", "mamba", "mla"
POOL_DSA, POOL_DSV4, POOL_MINIMAX = "dsa", "deepseek_v4", "minimax_sparse"
DATA_FILE = Path(__file__).with_name("families.json")

# Plain architectures SGLang serves with an ordinary MHA pool (no per-request state): not in any list of
# families.json because nothing special happens to them.
PLAIN_ARCHS = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "Phi3ForCausalLM", "SpecctlHybridForCausalLM",
    "GraniteForCausalLM", "OlmoForCausalLM", "Olmo2ForCausalLM", "Glm4MoeForCausalLM", "MiMoForCausalLM",
})


@functools.lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """The generated SGLang family table (families.json)."""
    data: dict[str, Any] = json.loads(DATA_FILE.read_text(encoding="utf-8"))
    return data


def _arch_set(key: str) -> frozenset[str]:
    return frozenset(table()["archs"][key])


def state_type_values() -> tuple[str, ...]:
    """Every StateType wire value of the release the table was generated from."""
    return tuple(table()["state_types"].values())


def backend_state_types(backend: str) -> tuple[str, ...] | None:
    """The state types a `--disaggregation-transfer-backend` can send (None: a backend with no state
    transfer in the table, e.g. fake). A registered state type outside it fails at the first transfer
    ('PD state transfer failed: unknown state_type=...' on mori)."""
    got = table()["backend_state_types"].get(backend)
    return tuple(got) if got is not None else None


_HF_KIND = {
    "full_attention": "full", "attention": "full", "full": "full", "sliding_attention": "swa", "swa": "swa",
    "linear_attention": "linear", "mamba": "mamba", "conv": "conv", "ssm": "mamba",
}
_NEMOTRON = {"M": "mamba", "*": "full", "-": "mlp", "E": "moe"}
MAMBA_STATE_KINDS = ("mamba", "linear", "conv", "hybrid")


class FamilyError(ValueError):
    """config.json lacks or garbles a field the family needs (the message names it)."""


@dataclass(frozen=True)
class MTPHead:
    """A draft head inside the target checkpoint that SGLang loads as the NEXTN/EAGLE draft."""

    field: str  # the config.json field that declares it
    layers: int
    draft_architecture: str  # what SGLang's _config_draft_model loads it as
    draft_defaults_to_target: bool  # SGLang fills --speculative-draft-model-path with --model-path

    def describe(self) -> str:
        return f"built-in MTP, {self.field}={self.layers}"


@dataclass(frozen=True)
class SGLangModel:
    """What SGLang makes of a model directory's config.json (no weights, no torch)."""

    architecture: str
    known: bool
    layer_kinds: tuple[str, ...]
    pool: str  # mha | swa | mamba | mla | dsa | deepseek_v4 | minimax_sparse
    num_kv_heads: int | None
    head_dim: int | None
    torch_dtype: str | None
    vocab_size: int | None
    mamba_ssm_dtype: str | None
    model_type: str | None = None
    attention: str = "mha"  # mha | mla (ModelConfig.attention_arch)
    mambaish: bool = False
    dsa: bool = False
    dsa_tail: bool = False
    qsa: bool = False
    dsv4_request_state: bool = False
    minimax_k_only: bool = False
    minimax_dense: bool = False
    minimax_value_sparse: bool = False
    mtp: MTPHead | None = None
    draft_kind: str | None = None  # eagle | eagle3 | gemma4_assistant when the checkpoint is itself a draft
    pool_without_hybrid_swa: str | None = None  # the pool under --disable-hybrid-swa-memory (hybrid SWA only)
    hidden_size: int | None = None

    @property
    def is_hybrid(self) -> bool:
        return self.pool in (POOL_SWA, POOL_MAMBA, POOL_DSV4)

    @property
    def pd_unsupported(self) -> str | None:
        """SGLang's reason this model cannot be PD-transferred at all, else None."""
        if self.minimax_value_sparse:
            return ("PD disaggregation for MiniMax sparse layers with index value (index_kv_pool) is not yet "
                    "supported; only K-only sparse layers are.")
        return None

    def effective_pool(self, *, disable_hybrid_swa_memory: bool = False) -> str:
        if self.pool == POOL_SWA and disable_hybrid_swa_memory:
            return self.pool_without_hybrid_swa or POOL_MHA
        return self.pool

    def state_types(self, *, kv_cache_dtype: str = "auto", disable_hybrid_swa_memory: bool = False,
                    speculative_algorithm: str | None = None,
                    env: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """The ordered `kv_args.state_types` SGLang registers with these flags (CUDA unless `env` names
        ROCm's unified-KV backend). `speculative_algorithm` matters where the draft pool registers state
        too (DeepSeek-V4's NextN/DSpark head)."""
        pool = self.effective_pool(disable_hybrid_swa_memory=disable_hybrid_swa_memory)
        mx = kv_cache_dtype == "mxfp8"
        env = env or {}
        out: list[str] = []
        if pool == POOL_DSV4:
            unified = env.get("SGLANG_HACK_FLASHMLA_BACKEND") == "unified_kv_triton"  # ROCm only
            out.append("swa")
            if unified:
                out.append("swa_ring")
            if self.dsv4_request_state:
                out.append("c128_state")
            algo = (speculative_algorithm or "").upper()
            if algo in ("EAGLE", "NEXTN", "DSPARK"):
                out.append("swa_ring" if unified else "swa")
                if algo == "DSPARK" and not unified:
                    out.append("request_row")
        elif pool == POOL_SWA:
            out.append("swa")
            if mx and self.attention != "mla":
                out += ["block_scale", "block_scale_swa"]
        elif pool == POOL_DSA:
            out.append("dsa")
            if self.dsa_tail:
                out.append("dsa_tail")
        elif pool == POOL_MINIMAX:
            if self.minimax_k_only:
                out.append("minimax_index_k")
            if self.minimax_dense:
                out.append("minimax_dense_kv")
        elif pool == POOL_MAMBA:
            out.append("mamba")
            if self.dsa and self.attention == "mla":
                out.append("dsa")
                if self.dsa_tail:
                    out.append("dsa_tail")
            if self.qsa:
                out += ["qsa_pending", "qsa_compressed"]
        elif pool == POOL_MHA and mx:
            out.append("block_scale")
        if self.mambaish and "mamba" not in out:
            out.append("mamba")
        return tuple(out)


MAX_LAYERS = 10_000


def _int(cfg: dict[str, Any], key: str, default: int | None = None, *, lo: int = 0, hi: int = MAX_LAYERS) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FamilyError(f"config.json field {key!r} must be an integer in {lo}..{hi}, got {str(v)[:40]!r}")
    return v


def _int_list(cfg: dict[str, Any], key: str, n: int) -> list[int]:
    v = cfg.get(key)
    if not isinstance(v, list) or len(v) != n or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
        raise FamilyError(f"config.json field {key!r} must be a list of {n} integers (one per layer), "
                          f"got {str(v)[:60]!r}")
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
    if len(kinds) < n:
        raise FamilyError(f"config.json layer_types has {len(kinds)} entries but num_hidden_layers={n}")
    return tuple(kinds[:n])  # SGLang reads the first num_hidden_layers (Step3p5 lists MTP layers after them)


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


def _kinds_mimo_v2(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    # get_hybrid_layer_ids: hybrid_layer_pattern[i] == 1 is sliding window, 0 full attention
    return tuple("swa" if p == 1 else "full" for p in _int_list(cfg, "hybrid_layer_pattern", n))


def _kinds_kda(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    # KimiLinearConfig.is_kda_layer: (layer_idx + 1) in linear_attn_config["kda_layers"]
    lac = cfg.get("linear_attn_config")
    if not isinstance(lac, dict) or not isinstance(lac.get("kda_layers"), list):
        raise FamilyError("config.json linear_attn_config.kda_layers (1-based KDA layer numbers) is missing")
    kda = {x for x in lac["kda_layers"] if isinstance(x, int)}
    return tuple("linear" if i + 1 in kda else "full" for i in range(n))


def _kinds_glm5_next(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    # Glm5NextTextConfig: 0-based linear_attn_config["kda_layers"], else layer_types, else every 4th layer full
    lac = cfg.get("linear_attn_config")
    if isinstance(lac, dict) and isinstance(lac.get("kda_layers"), list):
        kda = {x for x in lac["kda_layers"] if isinstance(x, int)}
        return tuple("linear" if i in kda else "full" for i in range(n))
    lt = _layer_types(cfg, n)
    if lt is not None:
        return lt
    return tuple("full" if i % 4 == 3 else "linear" for i in range(n))


def _kinds_dsv4(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    ratios = cfg.get("compress_ratios")
    if ratios is None:
        return tuple("full" for _ in range(n))
    if not isinstance(ratios, list) or len(ratios) < n or any(isinstance(r, bool) or not isinstance(r, int)
                                                              for r in ratios):
        raise FamilyError(f"config.json compress_ratios must list an integer ratio per layer ({n}), "
                          f"got {str(ratios)[:60]!r}")
    return tuple("swa" if r == 0 else "full" for r in ratios[:n])  # ratio 0: sliding window only


def _minimax_sparse_cfg(cfg: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    # get_minimax_sparse_attention_config: text_config.sparse_attention_config, else the top level's
    sc = cfg.get("sparse_attention_config", top.get("sparse_attention_config"))
    if not isinstance(sc, dict):
        raise FamilyError("config.json sparse_attention_config is missing (a MiniMax M3 sparse model has one)")
    return sc


def _kinds_minimax(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    freq = _int_list(_minimax_sparse_cfg(cfg, cfg), "sparse_attention_freq", n)
    return tuple("full" if f == 0 else "sparse" for f in freq)


def _kinds_first_swa(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    # get_hybrid_layer_ids for the MiMoV2 / Step3p5 MTP drafts: layer 0 is the sliding-window layer
    return tuple("swa" if i == 0 else "full" for i in range(n))


def _kinds_local(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    # get_hybrid_layer_ids for Inkling: local_layer_ids are sliding window, the rest full attention
    ids = cfg.get("local_layer_ids")
    if not isinstance(ids, list):
        raise FamilyError("config.json local_layer_ids (the sliding-window layers) is missing")
    return tuple("swa" if i in ids else "full" for i in range(n))


def _kinds_default(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    lt = _layer_types(cfg, n)
    return lt if lt is not None else tuple("full" for _ in range(n))


_KINDS: dict[str, Callable[[dict[str, Any], int], tuple[str, ...]]] = {
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
    "MiMoV2ForCausalLM": _kinds_mimo_v2,
    "MiMoV2FlashForCausalLM": _kinds_mimo_v2,
    "MiMoV2MTP": _kinds_first_swa,
    "Step3p5MTP": _kinds_first_swa,
    "InklingForConditionalGeneration": _kinds_local,
    "UnlimitedOCRForCausalLM": lambda cfg, n: tuple("swa" for _ in range(n)),
}


def architecture_of(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    mt = cfg.get("model_type")
    return str(mt) if isinstance(mt, str) else "?"


def _model_type(cfg: dict[str, Any]) -> str | None:
    mt = cfg.get("model_type")
    return mt if isinstance(mt, str) else None


def _is_mambaish(cfg: dict[str, Any], tc: dict[str, Any]) -> bool:
    """configs/hybrid_arch.py mambaish_config, decided by the config classes' model_type."""
    mb = table()["mambaish"]
    top, text = _model_type(cfg), _model_type(tc) if tc is not cfg else None
    plain = set(mb["model_types"]) | set(mb["registry_model_types"])
    if top in plain or text in plain or top in mb["text_wrapper_model_types"]:
        if top == "granitemoehybrid":  # mamba2_config: only with a mamba layer in layer_types
            return "mamba" in (tc.get("layer_types") or [])
        return True
    if top in mb["kda_model_types"]:  # glm5_next_config (the target, not its draft)
        return True
    if top == "bailing_hybrid":  # hybrid_lightning_config (use_kda false) or kimi_linear_config (true)
        return True
    if top == "minicpm_sala":  # hybrid_lightning_config: only with lightning layers
        return bool(tc.get("has_lightning_layers") or tc.get("lightning_layers"))
    return False


def _positive(cfg: dict[str, Any], key: str) -> int | None:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def mtp_draft_architecture(arch: str) -> str | None:
    """What SGLang's _config_draft_model loads this target architecture as for its MTP/NextN draft."""
    rewrite: str | None = table()["archs"]["draft_rewrite"].get(arch)
    return rewrite


def mtp_head(cfg: dict[str, Any]) -> MTPHead | None:
    """The MTP/NextN head a target checkpoint declares and SGLang can load as its draft, else None."""
    arch = architecture_of(cfg)
    rewrite = table()["archs"]["draft_rewrite"].get(arch)
    if rewrite is None:
        return None
    tc = _text_config(cfg)
    for src in (tc, cfg):
        for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"):
            n = _positive(src, key)
            if n is not None:
                return MTPHead(key, n, rewrite, arch in table()["speculative"]["draft_defaults_to_target"])
    return None


def draft_kind(arch: str, cfg: dict[str, Any]) -> str | None:
    """eagle | eagle3 | gemma4_assistant when this checkpoint is a draft SGLang recognises as such."""
    spec = table()["speculative"]
    if arch in spec["gemma4_assistant_drafts"]:
        return "gemma4_assistant"
    if arch in spec["eagle3_draft_archs"]:
        return "eagle3"
    if arch in spec["eagle_draft_archs"]:
        return "eagle"
    if "draft_vocab_size" in cfg and arch == "LlamaForCausalLM":
        return "eagle3"  # SpecForge-style EAGLE3 drafts: only SGLang's EAGLE3 draft models read draft_vocab_size
    return None


def sglang_model(cfg: dict[str, Any]) -> SGLangModel:
    """What SGLang derives from this config.json; FamilyError naming the field when unusable.

    An architecture in none of SGLang's lists is `known=False`, treated as a plain MHA model."""
    arch = architecture_of(cfg)
    tc = _text_config(cfg)
    n = _int(tc, "num_hidden_layers")
    archs = table()["archs"]
    mambaish = _is_mambaish(cfg, tc)
    mla = arch in _arch_set("mla") and not (arch == "PixtralForConditionalGeneration"
                                            and tc.get("kv_lora_rank") is None)
    dsa = arch in _arch_set("dsa") and tc.get("index_topk", cfg.get("index_topk")) is not None
    hybrid_swa = arch in _arch_set("hybrid_swa") and not (
        arch == "LagunaForCausalLM" and not tc.get("sliding_window")) and not (
        arch == "BeamForCausalLM" and "sliding_attention" not in (tc.get("layer_types") or []))
    hybrid_swa = (hybrid_swa or tc.get("is_hybrid_swa") is True) and arch not in _arch_set("forced_no_hybrid_swa")
    dsv4 = arch in _arch_set("deepseek_v4")
    minimax = arch in _arch_set("minimax_sparse")
    qsa = mambaish and any(tc.get(f) is not None for f in table()["qsa_fields"])

    kda = arch in _arch_set("kimi_k3") or "kimi_linear" in (_model_type(cfg), _model_type(tc))
    if _model_type(cfg) in table()["mambaish"]["kda_model_types"]:
        kinds = _kinds_glm5_next(tc, n)
    elif kda or (mambaish and isinstance(tc.get("linear_attn_config"), dict)
               and tc["linear_attn_config"].get("kda_layers") is not None):
        kinds = _kinds_kda(tc, n)
    elif dsv4:
        kinds = _kinds_dsv4(tc, n)
    elif minimax:
        kinds = _kinds_minimax(tc, n)
    elif arch in _KINDS:
        kinds = _KINDS[arch](tc, n)
    elif mambaish and _model_type(cfg) not in ("nemotron_h", "falcon_h1", "mamba", "mamba2", "falcon_mamba"):
        kinds = _kinds_qwen3_next(tc, n)
    else:
        kinds = _kinds_default(tc, n)

    def choose(swa: bool) -> str:  # kv_cache_configurator._build_token_to_kv_pool, CUDA
        if dsv4:
            return POOL_DSV4
        if swa:
            return POOL_SWA
        if mla and not mambaish:
            return POOL_DSA if dsa else POOL_MLA
        if minimax:
            return POOL_MINIMAX
        return POOL_MAMBA if mambaish else POOL_MHA

    pool = choose(hybrid_swa)

    minimax_facts = (False, False, False)
    if minimax:
        sc = _minimax_sparse_cfg(tc, cfg)
        freq = _int_list(sc, "sparse_attention_freq", n)
        disable = sc.get("sparse_disable_index_value") or []
        off = {i for i, f in enumerate(disable) if f} if isinstance(disable, list) else set()
        sparse = [i for i, f in enumerate(freq) if f != 0]
        minimax_facts = (any(i in off for i in sparse), any(f == 0 for f in freq), any(i not in off for i in sparse))
    ratios = tc.get("compress_ratios") if dsv4 else None
    # served by the release (its model registry) and placed by the lists above: a served architecture in
    # none of them gets SGLang's plain pool, which is what specctl predicts for it
    known = (arch in table()["served_archs"] or arch in PLAIN_ARCHS or hybrid_swa or mla or dsv4
             or minimax or mambaish or arch in archs["draft_rewrite"] or draft_kind(arch, cfg) is not None
             or arch in _arch_set("hybrid_swa"))
    heads = tc.get("num_attention_heads")
    kv = tc.get("num_key_value_heads", heads)
    hidden = tc.get("hidden_size")
    head_dim = tc.get("head_dim")
    if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        head_dim = hidden // heads
    dtype = tc.get("torch_dtype", tc.get("dtype", cfg.get("torch_dtype", cfg.get("dtype"))))
    ssm = tc.get("mamba_ssm_dtype") or tc.get("mamba2_ssm_dtype")
    vocab = tc.get("vocab_size", cfg.get("vocab_size"))
    return SGLangModel(
        architecture=arch,
        known=known,
        layer_kinds=kinds,
        pool=pool,
        num_kv_heads=kv if isinstance(kv, int) and not isinstance(kv, bool) else None,
        head_dim=head_dim if isinstance(head_dim, int) and not isinstance(head_dim, bool) else None,
        torch_dtype=dtype if isinstance(dtype, str) else None,
        vocab_size=vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None,
        mamba_ssm_dtype=ssm if isinstance(ssm, str) else None,
        model_type=_model_type(cfg),
        attention="mla" if mla else "mha",
        mambaish=mambaish,
        dsa=dsa,
        dsa_tail=dsa and (_positive(tc, "index_kpool") or 1) > 1 and tc.get("index_kpool_compress") is True,
        qsa=qsa,
        dsv4_request_state=isinstance(ratios, list) and (128 in ratios or 2 in ratios),
        minimax_k_only=minimax_facts[0],
        minimax_dense=minimax_facts[1],
        minimax_value_sparse=minimax_facts[2],
        mtp=mtp_head(cfg),
        draft_kind=draft_kind(arch, cfg),
        pool_without_hybrid_swa=choose(False) if pool == POOL_SWA else None,
        hidden_size=hidden if isinstance(hidden, int) and not isinstance(hidden, bool) else None,
    )
