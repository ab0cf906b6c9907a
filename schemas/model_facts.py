"""Facts about a model read from its `config.json` alone: never the weights, never torch.

Both `specctl validate` and the engine derive layer kinds and `state_types` here, so the static
check and the live handshake can never disagree about what a model needs.

A model reference is `builtin:NAME` (shipped under `specctl/engine/builtin_models/NAME/`) or a
local Hugging Face-format directory. Supported architectures: the builtin hybrid family
(`layer_types` of `full`, `swa`, `mamba`), Llama and Qwen2 (all `full`, or `swa` where Qwen2's
sliding window applies to a layer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from specctl.errors import UsageError

BUILTIN_PREFIX = "builtin:"
LAYER_KINDS = ("full", "swa", "mamba")
# The fixed order of state components; both PD sides derive it identically from the layer kinds.
STATE_TYPE_ORDER = ("mamba", "swa")
SUPPORTED_ARCHITECTURES = ("SpecctlHybridForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True)
class ModelFacts:
    """What validation and the handshake need to know about a model, without loading it."""

    ref: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    layer_kinds: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    sliding_window: int | None
    config: dict[str, Any]

    @property
    def state_types(self) -> tuple[str, ...]:
        """Ordered state components this model's caches carry besides paged full-attention KV."""
        kinds = set(self.layer_kinds)
        return tuple(t for t in STATE_TYPE_ORDER if t in kinds)

    @property
    def is_hybrid(self) -> bool:
        return bool(self.state_types)


def builtin_names() -> list[str]:
    root = resources.files("specctl.engine") / "builtin_models"
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())


def builtin_dir(name: str) -> Path:
    """Filesystem directory of a builtin model (package data), or a UsageError listing known names."""
    root = resources.files("specctl.engine") / "builtin_models"
    cand = root / name
    if not (cand / "config.json").is_file():
        known = ", ".join(f"builtin:{n}" for n in builtin_names())
        raise UsageError(f"unknown builtin model 'builtin:{name}'", hint=f"known builtin models: {known}")
    return Path(str(cand))


def resolve_model_dir(ref: str) -> Path:
    """Directory holding `config.json` for a model reference (may not exist for a remote path)."""
    if ref.startswith(BUILTIN_PREFIX):
        return builtin_dir(ref[len(BUILTIN_PREFIX) :])
    return Path(ref).expanduser()


def model_available(ref: str) -> bool:
    """True when the model's config.json can be read on this host."""
    if ref.startswith(BUILTIN_PREFIX):
        return ref[len(BUILTIN_PREFIX) :] in builtin_names()
    return (Path(ref).expanduser() / "config.json").is_file()


def facts_from_config(ref: str, cfg: dict[str, Any]) -> ModelFacts:
    """Derive `ModelFacts` from a parsed config.json; UsageError naming the field when unusable."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else str(cfg.get("model_type", "?"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UsageError(
            f"{ref}: unsupported architecture {arch!r}",
            hint=f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}",
        )
    try:
        num_layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        vocab = int(cfg["vocab_size"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{ref}: config.json lacks a usable {exc} field") from None
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    window = cfg.get("sliding_window")
    kinds: list[str]
    if isinstance(cfg.get("layer_types"), list):
        kinds = []
        for k in cfg["layer_types"]:
            # Hugging Face spells these "full_attention" / "sliding_attention" in newer configs.
            k = {"full_attention": "full", "sliding_attention": "swa"}.get(k, k)
            if k not in LAYER_KINDS:
                raise UsageError(f"{ref}: unknown layer type {k!r} in layer_types", hint=f"one of {LAYER_KINDS}")
            kinds.append(k)
        if len(kinds) != num_layers:
            raise UsageError(f"{ref}: layer_types has {len(kinds)} entries but num_hidden_layers={num_layers}")
    elif arch == "Qwen2ForCausalLM" and cfg.get("use_sliding_window"):
        # Qwen2: layers at index >= max_window_layers use sliding-window attention.
        mwl = int(cfg.get("max_window_layers", num_layers))
        kinds = ["swa" if i >= mwl else "full" for i in range(num_layers)]
    else:
        kinds = ["full"] * num_layers
    return ModelFacts(
        ref=ref,
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=num_layers,
        layer_kinds=tuple(kinds),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        sliding_window=int(window) if ("swa" in kinds and window is not None) else None,
        config=cfg,
    )


def load_model_facts(ref: str) -> ModelFacts:
    """Read `config.json` of a model reference; UsageError when it is missing or unreadable."""
    path = resolve_model_dir(ref) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{ref}: no config.json at {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{ref}: cannot read {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{ref}: {path} is not a JSON object")
    return facts_from_config(ref, cfg)
