"""SGLang's own family predicates run on config.json files, as a test oracle (child process).

`python tests/sglang_family_oracle.py CONFIG.json ...` prints one JSON object per file (`{"error": ...}`
when SGLang's functions raise on it). The functions are
SGLang's, taken verbatim from the installed release's source (`configs/model_config.py`,
`configs/kimi_linear.py`, `layers/attention/qsa/config.py`) and executed here on the config turned into
attribute objects, the way SGLang reads a loaded `PretrainedConfig`. Importing the modules themselves
needs SGLang's GPU stack (transformers processors, torchvision ...), so only the pure functions are
compiled; nothing of SGLang is imported. Never imported by the test process.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

MODEL_CONFIG_FUNCS = (
    "_hf_arch", "_hf_attr", "is_deepseek_dsa", "is_deepseek_v4", "is_minimax_sparse", "is_kimi_k3",
    "is_hybrid_swa_model", "get_hybrid_layer_ids", "get_minimax_sparse_attention_config",
    "get_minimax_sparse_layer_ids", "get_minimax_sparse_disable_value_layer_ids", "get_dsa_index_kpool",
    "get_dsa_index_kpool_compress", "uses_kda_attention",
)


def _srt() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin is not None, "sglang is not installed"
    return Path(spec.origin).parent / "srt"


def _namespace() -> dict[str, Any]:
    src = (_srt() / "configs" / "model_config.py").read_text(encoding="utf-8")
    tree = ast.parse(src)
    keep: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in MODEL_CONFIG_FUNCS:
            node.decorator_list = []
            keep.append(node)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in (
                "SWA_SINK_ARCHS", "MIMO_V2_MODEL_ARCHS") for t in node.targets):
            keep.append(node)
    ns: dict[str, Any] = {"List": list, "Optional": Any, "PretrainedConfig": object, "Any": Any}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "model_config.py", "exec"), ns)  # noqa: S102
    qsa: dict[str, Any] = {"__name__": "qsa_config"}
    exec(compile((_srt() / "layers" / "attention" / "qsa" / "config.py").read_text(encoding="utf-8"),  # noqa: S102
                 "qsa/config.py", "exec"), qsa)
    ns["parse_qsa_profile"] = qsa["parse_qsa_profile"]
    for fname, key in (("kimi_linear.py", "is_kda_layer"), ("glm5_next.py", "glm5_next_is_kda_layer")):
        tree = ast.parse((_srt() / "configs" / fname).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "is_kda_layer":
                node.decorator_list = []
                node.name = key
                exec(compile(ast.Module(body=[node], type_ignores=[]), fname, "exec"), ns)  # noqa: S102
                break
    return ns


class _Config(types.SimpleNamespace):
    """A config.json as attributes, with the PretrainedConfig method SGLang calls."""

    def get_text_config(self) -> Any:
        return getattr(self, "text_config", self)


def _obj(d: dict[str, Any]) -> _Config:
    return _Config(**{k: _obj(v) if k == "text_config" and isinstance(v, dict) else v for k, v in d.items()})


def verdict(ns: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    cfg = _obj(raw)
    text = cfg.get_text_config()
    archs = list(getattr(cfg, "architectures", []) or [])
    n = text.num_hidden_layers
    out: dict[str, Any] = {
        "dsa": ns["is_deepseek_dsa"](cfg) or ns["is_deepseek_dsa"](text),
        "deepseek_v4": ns["is_deepseek_v4"](cfg),
        "minimax_sparse": ns["is_minimax_sparse"](cfg),
        "kimi_k3": ns["is_kimi_k3"](cfg),
        "hybrid_swa": bool(ns["is_hybrid_swa_model"](archs, text)),
        "uses_kda": bool(ns["uses_kda_attention"](cfg)),
        "qsa": ns["parse_qsa_profile"](cfg) is not None,
    }
    if out["hybrid_swa"] and not out["deepseek_v4"]:
        swa, full = ns["get_hybrid_layer_ids"](archs, text)
        out["swa_layer_ids"], out["full_layer_ids"] = sorted(swa), sorted(full)
    if out["dsa"]:
        out["dsa_tail"] = ns["get_dsa_index_kpool"](text) > 1 and bool(ns["get_dsa_index_kpool_compress"](text))
    if out["minimax_sparse"]:
        sc = ns["get_minimax_sparse_attention_config"](cfg)
        dense, sparse = ns["get_minimax_sparse_layer_ids"](sc)
        off = set(ns["get_minimax_sparse_disable_value_layer_ids"](sc))
        out["minimax_dense"] = bool(dense)
        out["minimax_k_only"] = any(i in off for i in sparse)
        out["minimax_value_sparse"] = any(i not in off for i in sparse)
    if getattr(text, "linear_attn_config", None) is not None:
        is_kda = ns["glm5_next_is_kda_layer" if getattr(cfg, "model_type", "") == "glm5_next" else "is_kda_layer"]
        out["kda_layer_ids"] = [i for i in range(n) if is_kda(text, i)]
    return out


def main(paths: list[str]) -> int:
    ns = _namespace()
    for p in paths:
        raw = json.loads(Path(p).read_text(encoding="utf-8"))
        try:
            print(json.dumps(verdict(ns, raw)))
        except Exception as exc:  # a config SGLang's functions refuse: reported, the others still run
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
