"""Facts about a model read from its `config.json` alone: never the weights, never torch.

Both `specctl validate` and the engine derive layer kinds and `state_types` here, so the static
check and the live handshake can never disagree about what a model needs.

A model reference is `builtin:NAME` (shipped under `specctl/engine/builtin_models/NAME/`) or a
local Hugging Face-format directory. Architectures the builtin engine runs (`SUPPORTED_ARCHITECTURES`):
the builtin hybrid family (`layer_types` of `full`, `swa`, `mamba`), Llama and Qwen2 (all `full`, or
`swa` where Qwen2's sliding window applies to a layer). `load_model_facts(ref)` (the engine's call)
accepts only those. `load_model_facts(ref, engine=False)` (validation) also reads every family SGLang
serves (`specctl.schemas.sglang.families`: Qwen3-Next, Nemotron-H, Falcon-H1, gpt-oss, Gemma 3,
Mistral, Qwen3 ...), with SGLang's layer kinds and `state_types`; an architecture nobody knows gives
facts with `known=False` (plain attention assumed) so the rest can still be checked.

`config.json` is read defensively (`read_config_json`): a regular file only (a FIFO, device or socket
is refused without blocking), at most `MAX_CONFIG_BYTES`, nesting at most `MAX_CONFIG_DEPTH`; every
path error (too long, loops, permissions) is a `UsageError`, never an uncaught OSError.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.sglang.families import FamilyError, sglang_model

BUILTIN_PREFIX = "builtin:"
LAYER_KINDS = ("full", "swa", "mamba")
# The fixed order of state components; both PD sides derive it identically from the layer kinds.
STATE_TYPE_ORDER = ("mamba", "swa")
SUPPORTED_ARCHITECTURES = ("SpecctlHybridForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM")
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # real config.json files are a few KB (multimodal ones tens of KB)
MAX_CONFIG_DEPTH = 32


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
    # For models only SGLang serves: the state_types SGLang registers with default flags (else derived
    # from the layer kinds as the builtin engine does), and whether any known family matched.
    sglang_state_types: tuple[str, ...] | None = None
    known: bool = True

    @property
    def state_types(self) -> tuple[str, ...]:
        """Ordered state components this model's caches carry besides paged full-attention KV."""
        if self.sglang_state_types is not None:
            return self.sglang_state_types
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


def safe_exists(path: Path) -> bool:
    """`path.exists()` that answers False for every path error (too long, loops, permissions)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def model_available(ref: str) -> bool:
    """True when the model's config.json can be read on this host."""
    if ref.startswith(BUILTIN_PREFIX):
        return ref[len(BUILTIN_PREFIX) :] in builtin_names()
    try:
        return (Path(ref).expanduser() / "config.json").is_file()
    except (OSError, ValueError):  # ENAMETOOLONG, a NUL byte ...: not readable here
        return False


def _max_depth(text: str) -> int:
    """Bracket nesting depth of JSON text (strings skipped), without recursion."""
    depth = best = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > best:
                best = depth
        elif ch in "]}":
            depth -= 1
    return best


def read_config_json(path: Path, *, label: str = "") -> dict[str, Any]:
    """A config.json as a dict: a regular, UTF-8, bounded, shallow JSON object, else UsageError."""
    name = label or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise UsageError(f"{name}: no config.json at {path}") from None
    except OSError as exc:
        why = {errno.ENAMETOOLONG: "the path is too long", errno.ELOOP: "too many levels of symbolic links",
               errno.EACCES: "permission denied", errno.EISDIR: "is a directory",
               errno.ENXIO: "is a socket or a special file, not a regular file"}.get(exc.errno or 0,
                                                                                     exc.strerror or str(exc))
        raise UsageError(f"{name}: cannot read {path}: {why}") from None
    except ValueError as exc:  # a NUL byte in the path
        raise UsageError(f"{name}: cannot read {path}: {exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device or special file")
            raise UsageError(f"{name}: {path} is {kind}, not a regular file", hint="config.json must be a file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise UsageError(f"{name}: {path} is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB; "
                             "not a model config")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_CONFIG_BYTES:
        raise UsageError(f"{name}: {path} is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB; not a model config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{name}: {path} is not UTF-8 text") from None
    if _max_depth(text) > MAX_CONFIG_DEPTH:
        raise UsageError(f"{name}: {path} is nested deeper than {MAX_CONFIG_DEPTH} levels; not a model config")
    try:
        cfg = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise UsageError(f"{name}: cannot parse {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{name}: {path} is not a JSON object")
    return cfg


MAX_LAYERS = 10_000  # far above any real model; keeps a hostile config from allocating per-layer lists
_MAX_FIELD = 1 << 40


def config_int(ref: str, cfg: dict[str, Any], key: str, *, default: int | None = None, lo: int = 1,
               hi: int = _MAX_FIELD) -> int:
    """An integer field of config.json within [lo, hi]; UsageError naming the field otherwise."""
    v = cfg.get(key, default)
    if v is None and default is not None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int):
        if v is None:
            raise UsageError(f"{ref}: config.json lacks the {key!r} field")
        raise UsageError(f"{ref}: config.json field {key!r} must be an integer, got {json.dumps(v)[:60]}")
    if not lo <= v <= hi:
        raise UsageError(f"{ref}: config.json field {key!r} is {v}; expected {lo}..{hi}")
    return v


def facts_from_config(ref: str, cfg: dict[str, Any], *, engine: bool = True) -> ModelFacts:
    """Derive `ModelFacts` from a parsed config.json; UsageError naming the field when unusable.

    `engine=True`: only architectures the builtin engine runs. `engine=False`: any family SGLang serves
    (and unknown ones as plain attention with `known=False`)."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else str(cfg.get("model_type", "?"))
    if not isinstance(arch, str):
        arch = "?"
    if arch not in SUPPORTED_ARCHITECTURES:
        if engine:
            raise UsageError(
                f"{ref}: unsupported architecture {arch!r}",
                hint=f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}",
            )
        return _sglang_facts(ref, cfg)
    num_layers = config_int(ref, cfg, "num_hidden_layers", hi=MAX_LAYERS)
    hidden = config_int(ref, cfg, "hidden_size")
    vocab = config_int(ref, cfg, "vocab_size")
    heads = config_int(ref, cfg, "num_attention_heads")
    kv_heads = config_int(ref, cfg, "num_key_value_heads", default=heads)
    head_dim = config_int(ref, cfg, "head_dim", default=max(1, hidden // heads))
    window = cfg.get("sliding_window")
    if window is not None:
        window = config_int(ref, cfg, "sliding_window")
    kinds: list[str]
    if isinstance(cfg.get("layer_types"), list):
        kinds = []
        for k in cfg["layer_types"]:
            # Hugging Face spells these "full_attention" / "sliding_attention" in newer configs.
            k = {"full_attention": "full", "sliding_attention": "swa"}.get(k, k) if isinstance(k, str) else k
            if k not in LAYER_KINDS:
                raise UsageError(f"{ref}: unknown layer type {k!r} in layer_types", hint=f"one of {LAYER_KINDS}")
            kinds.append(k)
        if len(kinds) != num_layers:
            raise UsageError(f"{ref}: layer_types has {len(kinds)} entries but num_hidden_layers={num_layers}")
    elif arch == "Qwen2ForCausalLM" and cfg.get("use_sliding_window"):
        # Qwen2: layers at index >= max_window_layers use sliding-window attention.
        mwl = config_int(ref, cfg, "max_window_layers", default=num_layers, lo=0)
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


def _sglang_facts(ref: str, cfg: dict[str, Any]) -> ModelFacts:
    try:
        m = sglang_model(cfg)
    except FamilyError as exc:
        raise UsageError(f"{ref}: {exc}") from None
    text_config = cfg.get("text_config")
    tc: dict[str, Any] = text_config if isinstance(text_config, dict) else cfg

    def num(key: str, default: int = 0) -> int:
        v = tc.get(key, default)
        return v if isinstance(v, int) and not isinstance(v, bool) else default

    heads = num("num_attention_heads", 1) or 1
    window = tc.get("sliding_window")
    return ModelFacts(
        ref=ref,
        architecture=m.architecture,
        vocab_size=num("vocab_size"),
        hidden_size=num("hidden_size"),
        num_layers=len(m.layer_kinds),
        layer_kinds=m.layer_kinds,
        num_attention_heads=heads,
        num_key_value_heads=m.num_kv_heads or heads,
        head_dim=m.head_dim or 0,
        sliding_window=window if isinstance(window, int) and "swa" in m.layer_kinds else None,
        config=cfg,
        sglang_state_types=m.state_types(),
        known=m.known,
    )


def load_model_facts(ref: str, *, engine: bool = True) -> ModelFacts:
    """Read `config.json` of a model reference; UsageError when it is missing or unreadable.

    `engine=False` (validation) accepts every family SGLang serves; see `facts_from_config`."""
    path = resolve_model_dir(ref) / "config.json"
    cfg = read_config_json(path, label=ref)
    return facts_from_config(ref, cfg, engine=engine)
