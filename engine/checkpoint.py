"""Model checkpoints: build a `HybridForCausalLM` from a model reference and load its safetensors weights.

A reference is `builtin:NAME` or a local Hugging Face-format directory (`config.json`, one or more
`*.safetensors`, `tokenizer.json`) of a supported architecture (builtin hybrid, Llama, Qwen2). Nothing is
fetched from a hub. Every expected failure is a `UsageError` saying what is wrong and how to fix it:
unsupported architecture, missing config or weights, missing/unexpected tensors, shape mismatches.
Loading shows a progress bar (stderr) for checkpoints above `PROGRESS_BYTES`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specctl.engine.device import resolve_dtype
from specctl.engine.model import HybridForCausalLM, ModelConfig
from specctl.errors import UsageError
from specctl.schemas.model_facts import ModelFacts, facts_from_config, load_model_facts, resolve_model_dir

PROGRESS_BYTES = 256 * 1024 * 1024
# Tensors some Hugging Face checkpoints carry that the model recomputes.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
SUPPORTED_ROPE_SCALING = ("linear", "llama3")


def weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors shards, in a stable order (index file order when present)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise UsageError(f"cannot read {index}: {exc}") from None
        files = [model_dir / f for f in dict.fromkeys(wm.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UsageError(f"{model_dir}: shards named in the index are missing: {', '.join(missing)}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        hint = "put model.safetensors next to config.json"
        if model_dir.parent.name == "builtin_models":
            hint = f"train it: python scripts/train_builtin.py --model {model_dir.name}"
        elif list(model_dir.glob("*.bin")):
            hint = "only PyTorch .bin weights found; convert them to safetensors"
        raise UsageError(f"{model_dir}: no *.safetensors weights", hint=hint)
    return files


def weights_hash(model_dir: Path) -> str:
    """A fingerprint of the weights for the PD handshake: sha256 of the files, or for checkpoints above
    `PROGRESS_BYTES` of their headers (names, shapes, offsets), sizes and first/last MiB (hashing
    gigabytes at every start would be slow)."""
    h = hashlib.sha256()
    files = weight_files(model_dir)
    total = sum(f.stat().st_size for f in files)
    for f in files:
        h.update(f.name.encode())
        size = f.stat().st_size
        h.update(str(size).encode())
        with f.open("rb") as fh:
            if total <= PROGRESS_BYTES:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            else:
                n = int.from_bytes(fh.read(8), "little")
                h.update(fh.read(n))
                h.update(fh.read(1 << 20))
                fh.seek(max(0, size - (1 << 20)))
                h.update(fh.read())
    return h.hexdigest()[:16]


def model_config(ref: str) -> tuple[ModelFacts, ModelConfig]:
    facts = load_model_facts(ref)
    cfg = ModelConfig.from_facts(facts)
    if "swa" in cfg.layer_kinds and not cfg.sliding_window:
        raise UsageError(f"{ref}: config.json has sliding-window layers but no positive sliding_window")
    if "mamba" in cfg.layer_kinds and cfg.mamba_d_inner % cfg.mamba_head_dim:
        raise UsageError(f"{ref}: mamba_expand * hidden_size must be a multiple of mamba_head_dim")
    if cfg.rope_scaling is not None:
        sc = dict(cfg.rope_scaling)
        kind = sc.get("rope_type", sc.get("type"))
        if kind not in SUPPORTED_ROPE_SCALING:
            raise UsageError(f"{ref}: rope scaling type {kind!r} is not supported",
                             hint=f"supported: {', '.join(SUPPORTED_ROPE_SCALING)}")
    return facts, cfg


class _Bar(Protocol):
    """What loading reads of tqdm's bar (tqdm ships no types)."""

    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


def _progress(total: int, label: str) -> _Bar | None:
    if total < PROGRESS_BYTES:
        return None
    from tqdm import tqdm  # type: ignore[import-untyped]  # noqa: PLC0415 - tqdm: not a specctl dependency; only for a large checkpoint's progress bar

    bar: _Bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"loading {label}", file=sys.stderr)
    return bar


def load_state_dict(model_dir: Path, label: str) -> dict[str, torch.Tensor]:
    files = weight_files(model_dir)
    bar = _progress(sum(f.stat().st_size for f in files), label)
    out: dict[str, torch.Tensor] = {}
    try:
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as fh:
                    for k in fh.keys():
                        t = fh.get_tensor(k)
                        out[k] = t
                        if bar is not None:
                            bar.update(t.numel() * t.element_size())
            except (SafetensorError, OSError) as exc:
                raise UsageError(f"cannot read weights {f}: {exc}") from None
    finally:
        if bar is not None:
            bar.close()
    return out


def load_model(
    ref: str, *, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"
) -> HybridForCausalLM:
    """Build the model of `ref` and load its weights (strict: every parameter present, shapes equal)."""
    facts, cfg = model_config(ref)
    model_dir = resolve_model_dir(ref)
    sd = load_state_dict(model_dir, ref)
    with torch.device("meta"):
        model = HybridForCausalLM(cfg)
    expected = dict(model.state_dict())
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
        sd.pop("lm_head.weight", None)  # some tied checkpoints store a copy anyway
    for k in [k for k in sd if k.endswith(IGNORED_SUFFIXES)]:
        sd.pop(k)
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensors (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} tensors (e.g. {', '.join(unexpected[:3])})")
        raise UsageError(
            f"{ref}: weights do not match a {facts.architecture} with this config.json: {'; '.join(parts)}",
            hint="check that config.json belongs to these weights",
        )
    bad = [f"{k}: checkpoint {tuple(sd[k].shape)} vs config {tuple(v.shape)}" for k, v in expected.items()
           if tuple(sd[k].shape) != tuple(v.shape)]
    if bad:
        raise UsageError(f"{ref}: shape mismatch in {len(bad)} tensors: {'; '.join(bad[:3])}",
                         hint="check that config.json belongs to these weights")
    dt = resolve_dtype(dtype)
    model = model.to_empty(device=device)
    model.load_state_dict(sd, strict=False, assign=False)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(dt).eval().fuse_for_inference()


def save_model(model: HybridForCausalLM, model_dir: Path, config: dict[str, Any]) -> None:
    """Write config.json + model.safetensors (float32; a tied lm_head is not stored)."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    sd = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


def write_random_model(
    model_dir: Path,
    *,
    layer_kinds: tuple[str, ...] = ("mamba", "swa", "full", "swa"),
    hidden_size: int = 32,
    intermediate_size: int = 64,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    head_dim: int = 16,
    sliding_window: int = 6,
    mamba_d_state: int = 8,
    mamba_head_dim: int = 16,
    seed: int = 0,
    std: float = 0.2,
) -> Path:
    """A tiny randomly initialised builtin-family model dir (byte tokenizer), for tests of any engine
    part. `std` is large so that the logits depend visibly on the context."""
    config = {
        "architectures": ["SpecctlHybridForCausalLM"],
        "model_type": "specctl_hybrid",
        "vocab_size": 260,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": len(layer_kinds),
        "layer_types": list(layer_kinds),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "sliding_window": sliding_window,
        "mamba_d_state": mamba_d_state,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_head_dim": mamba_head_dim,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": 256,
        "eos_token_id": 257,
        "pad_token_id": 258,
        "tokenizer": "bytes",
    }

    cfg = ModelConfig.from_facts(facts_from_config(str(model_dir), config))
    model = HybridForCausalLM(cfg)
    model.init_weights(seed=seed, std=std)
    save_model(model, Path(model_dir), config)
    return Path(model_dir)
