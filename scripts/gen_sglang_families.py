"""Generate `schemas/sglang/families.json`: which model families SGLang serves with which KV pool and
which PD `state_types` each pool registers, read from one SGLang release's source (AST only: no import,
no torch, any release that parses).

    python scripts/gen_sglang_families.py [--src SGLANG_PACKAGE_DIR] [--out FILE] [--check]

`--src` is the `sglang` package directory of a release (default: the installed one's, found without
importing it), e.g. a wheel unzipped with `pip download --no-deps sglang==X -d DIR`. `--check` builds the
table and compares it with the shipped file (exit 1 on a difference). Always exit 1, naming it, when the
release has a `StateType`, a KV pool class or a speculative algorithm that the classification below does
not know: a new release is reviewed, then one command to regenerate.

What is read, and from where (paths under `sglang/srt/`):
- `disaggregation/base/conn.py` `StateType`: the state components' wire values;
- `disaggregation/utils.py` `setup_state_kv_args`: the pool classes it dispatches on and the state types
  it appends; `disaggregation/<backend>/conn.py`: the state types each transfer backend can send;
- every class below `KVCache` in the tree: the pool classes, each with the dispatch classes it is a
  subclass of (what `isinstance` in `setup_state_kv_args` sees);
- `configs/model_config.py`: `is_hybrid_swa_model` (+ `SWA_SINK_ARCHS`, `MIMO_V2_MODEL_ARCHS`), the
  architectures of the MLA attention branches, `is_deepseek_dsa`, `is_deepseek_v4`, `is_minimax_sparse`,
  `is_kimi_k3`, `is_qwen3_5`, and `_config_draft_model` (the architecture a target becomes as its own
  MTP/NextN draft);
- `configs/hybrid_arch.py` `mambaish_config` with the config classes' `model_type`s (and subclasses), plus
  the linear-attention registry (`register_linear_attn_model`): the hybrid linear (Mamba-state) pool;
- `layers/attention/qsa/config.py` `parse_qsa_profile`: the text-config field that makes a QSA pool;
- `speculative/spec_info.py` `SpeculativeAlgorithm` and `speculative/spec_registry.py` `_RESERVED_ALIASES`;
- `arg_groups/speculative_hook.py`: the architectures whose draft defaults to the target checkpoint
  (`--speculative-draft-model-path` may be omitted) and the Gemma 4 assistant drafts;
  `speculative/dspark_components/dspark_config.py`: the fields of a checkpoint that bundles a DSpark draft;
- `models/**/*.py` `EntryClass`: every architecture the release serves, and the EAGLE / EAGLE3 drafts
  (`*eagle*.py`).
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "schemas" / "sglang" / "families.json"

# Reviewed classification. Each StateType: the pool (dispatch class) that registers it and when.
STATE_TYPES_CLASSIFIED: dict[str, str] = {
    "mamba": "HybridLinearKVPool (and QSATokenToKVPool), or a hybrid req-to-token pool (Mamba state beside SWA)",
    "qsa_pending": "QSATokenToKVPool (a Qwen4-Exp text config with indexer_n_heads)",
    "qsa_compressed": "QSATokenToKVPool (a Qwen4-Exp text config with indexer_n_heads)",
    "swa": "BaseSWAKVPool: SWAKVPool (hybrid SWA models) and DeepSeekV4TokenToKVPool; again for a DSV4 NextN draft",
    "dsa": "DSATokenToKVPool (DSA models on the MLA backend), or a hybrid linear pool with use_dsa",
    "dsa_tail": "DSATokenToKVPool with index_kpool > 1 and index_kpool_compress",
    "minimax_index_k": "MiniMaxSparseKVPool with K-only sparse layers",
    "minimax_dense_kv": "MiniMaxSparseKVPool with dense layers",
    "swa_ring": "DeepSeekV4TokenToKVPool with unified KV (ROCm, SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton)",
    "c128_state": "DeepSeekV4TokenToKVPool with request-scoped compression state (compress ratio 128 or 2)",
    "request_row": "a DeepSeek-V4 DSpark draft pool (swa_valid_from), not on ROCm",
    "block_scale": "MHATokenToKVPoolMXFP8 (--kv-cache-dtype mxfp8), or SWAKVPool's full sub-pool under mxfp8",
    "block_scale_swa": "SWAKVPool's SWA sub-pool under --kv-cache-dtype mxfp8",
}

# Every KV pool class (subclasses of KVCache) reviewed: what setup_state_kv_args makes of it.
POOL_CLASSES_REVIEWED = frozenset({
    "BaseSWAKVPool", "SWAKVPool", "UnifiedSWAKVPool", "UnifiedDraftSWAKVPool",
    "DeepSeekV4TokenToKVPool", "DSV4NPUTokenToKVPool", "DeepSeekV4SingleKVPool", "DeepSeekV4UniformFP8KVPool",
    "NPUDeepSeekV4SingleKVPool",
    "HybridLinearKVPool", "UnifiedHybridLinearKVPool", "QSATokenToKVPool",
    "MHATokenToKVPool", "MHATokenToKVPoolFP4", "MHATokenToKVPoolMXFP8", "NoOpMHATokenToKVPool",
    "PageMajorMHATokenToKVPool", "PageInterleaveMHATokenToKVPool", "UnifiedMHATokenToKVPool", "UnifiedDraftKVPool",
    "NPUMHATokenToKVPool",
    "MLATokenToKVPool", "MLATokenToKVPoolFP4", "PageInterleaveMLATokenToKVPool", "UnifiedMLATokenToKVPool",
    "NPUMLATokenToKVPool",
    "DSATokenToKVPool", "HiSparseDSATokenToKVPool", "LayerSplitDSATokenToKVPool", "PageInterleaveDSATokenToKVPool",
    "MiniMaxSparseKVPool", "MiniMaxM3Nvfp4KVPool", "MiniMaxM3Nvfp4MainKVPool", "NPUMiniMaxSparseKVPool",
})

# Every speculative algorithm reviewed: does it need --speculative-draft-model-path?
SPEC_ALGORITHMS_CLASSIFIED: dict[str, str] = {
    "EAGLE": "draft: an EAGLE draft, or the target's own MTP/NextN head",
    "EAGLE3": "draft: an EAGLE3 draft (aux hidden states of the target)",
    "STANDALONE": "draft: a small ordinary model",
    "FROZEN_KV_MTP": "draft: a Gemma 4 assistant (EAGLE/NEXTN are promoted to it)",
    "DFLASH": "draft: a DFlash block draft (--speculative-draft-model-path required)",
    "DSPARK": "draft: a DSpark draft, or bundled in the target checkpoint (forces one step)",
    "UNO": "no draft model: reuses the target with --uno-lora-path",
    "NGRAM": "no draft model",
    "NONE": "no speculation",
}


class SourceError(RuntimeError):
    """The release's source lacks a construct this script reads (named in the message)."""


def default_src() -> Path:
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise SourceError("sglang is not installed here; pass --src SGLANG_PACKAGE_DIR")
    return Path(spec.origin).parent


@functools.lru_cache(maxsize=512)
def _parse(path: Path) -> ast.Module:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    _WHERE[id(tree)] = str(path)
    return tree


def _tree(src: Path, rel: str) -> ast.Module:
    path = src / "srt" / rel
    try:
        return _parse(path)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc}") from None


_WHERE: dict[int, str] = {}  # id(parsed module) -> its path, for messages


def _func(tree: ast.AST, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise SourceError(f"function {name} not found in {_WHERE.get(id(tree), 'the source')}")


def _class(tree: ast.AST, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise SourceError(f"class {name} not found in {_WHERE.get(id(tree), 'the source')} (a release without it "
                      "predates what this table describes)")


def _strings(node: ast.AST) -> list[str]:
    """String constants under node, in source order, without repeats."""
    out: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value not in out:
            out.append(n.value)
    return out


def _module_constant(tree: ast.Module, name: str) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return _strings(node.value)
    raise SourceError(f"module constant {name} not found")


def state_types(src: Path) -> dict[str, str]:
    """StateType member -> wire value, in declaration order."""
    cls = _class(_tree(src, "disaggregation/base/conn.py"), "StateType")
    out: dict[str, str] = {}
    for node in cls.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            out[node.targets[0].id] = node.value.value
    return out


def state_dispatch(src: Path) -> tuple[list[str], list[str]]:
    """(pool classes imported by setup_state_kv_args, StateType members it appends)."""
    fn = _func(_tree(src, "disaggregation/utils.py"), "setup_state_kv_args")
    classes = [a.asname or a.name for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)
               and n.module is not None and ("mem_cache" in n.module or "memory_pool" in n.module)
               for a in n.names]
    members: list[str] = []
    for n in ast.walk(fn):
        if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "StateType"
                and n.attr not in members):
            members.append(n.attr)
    return classes, members


_CLASS = re.compile(r"^class\s+(\w+)\s*\(([^)]*)\)\s*:", re.M)


def class_graph(src: Path) -> dict[str, list[str]]:
    """Every top-level class defined under sglang/srt -> the names of its bases (read with a pattern, not
    parsed: the tree has ~2000 files)."""
    graph: dict[str, list[str]] = {}
    for path in sorted((src / "srt").rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for name, bases in _CLASS.findall(text):
            names = [b.strip().split(".")[-1].split("[")[0] for b in bases.split(",")]
            graph.setdefault(name, [])
            graph[name].extend(b for b in names if b.isidentifier() and b not in graph[name] and b != name)
    return graph


def ancestors(graph: dict[str, list[str]], name: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        c = todo.pop()
        for b in graph.get(c, []):
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def pool_classes(graph: dict[str, list[str]], dispatch: list[str]) -> dict[str, list[str]]:
    """Device KV pool class (below KVCache, not a host pool) -> the dispatch classes it is an instance of."""
    out: dict[str, list[str]] = {}
    for name in sorted(graph):
        anc = ancestors(graph, name)
        if "KVCache" not in anc or "HostKVCache" in anc or name.endswith("Host"):
            continue
        if not (name.endswith("KVPool") or "TokenToKVPool" in name):
            continue  # helper caches (index/state sub-buffers) are not what a model runner hands PD
        out[name] = sorted(d for d in dispatch if d == name or d in anc)
    return out


def _mla_archs(tree: ast.Module) -> list[str]:
    """Architectures of the `self.attention_arch = AttentionArch.MLA` branches of ModelConfig."""
    out: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        sets_mla = any(
            isinstance(s, ast.Assign) and isinstance(s.value, ast.Attribute) and s.value.attr == "MLA"
            and any(isinstance(t, ast.Attribute) and t.attr == "attention_arch" for t in s.targets)
            for s in node.body)
        if sets_mla:
            for c in ast.walk(node.test):
                if (isinstance(c, ast.Compare) and isinstance(c.left, ast.Constant) and isinstance(c.left.value, str)
                        and any(isinstance(op, ast.In) for op in c.ops) and c.left.value not in out):
                    out.append(c.left.value)
    return out


def _draft_rewrites(fn: ast.FunctionDef, consts: dict[str, list[str]]) -> dict[str, str]:
    """`_config_draft_model`: target architecture -> the architecture it is loaded as for its MTP draft."""
    out: dict[str, str] = {}
    for node in ast.walk(fn):
        if not isinstance(node, ast.If):
            continue
        targets: list[str] = []
        for s in (n for stmt in node.body for n in ast.walk(stmt)):
            if not (isinstance(s, ast.Assign) and "architectures" in ast.dump(s.targets[0])):
                continue
            if isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
                targets.append(s.value.value)
            elif isinstance(s.value, ast.List) and s.value.elts:
                first = s.value.elts[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    targets.append(first.value)
        if not targets:
            continue
        # a target with two draft forms (DeepSeek-V4: DSpark or NextN) is an MTP/NextN head for EAGLE
        target = next((t for t in targets if t.endswith(("NextN", "MTP"))), targets[0])
        for c in ast.walk(node.test):
            if isinstance(c, ast.Compare) and len(c.comparators) == 1:
                comp = c.comparators[0]
                names = ([comp.value] if isinstance(comp, ast.Constant) and isinstance(comp.value, str)
                         else _strings(comp) if isinstance(comp, (ast.List, ast.Tuple))
                         else consts.get(comp.id, []) if isinstance(comp, ast.Name) else [])
                for n in names:
                    if n != "DSPARK":
                        out.setdefault(n, target)
    return out


def _model_type_of(node: ast.ClassDef) -> str | None:
    for s in node.body:
        if isinstance(s, ast.Assign):
            names = [t.id for t in s.targets if isinstance(t, ast.Name)]
        elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
            names = [s.target.id]
        else:
            continue
        if "model_type" in names and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
            return s.value.value
    return None


def _hf_model_type(class_name: str) -> str | None:
    """model_type of a transformers config class, read from the installed transformers' source."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    for path in sorted((Path(spec.origin).parent / "models").glob("*/configuration_*.py")):
        text = path.read_text(encoding="utf-8")
        if f"class {class_name}(" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                return _model_type_of(node)
    return None


def _model_types(src: Path, graph: dict[str, list[str]], config_classes: set[str]) -> list[str]:
    """model_type strings of the given config classes and of every subclass of them under srt/configs
    (a class that inherits its model_type from a transformers config gets that one's)."""
    wanted = set(config_classes)
    for name in graph:
        if ancestors(graph, name) & config_classes:
            wanted.add(name)
    out: set[str] = set()
    for path in sorted((src / "srt" / "configs").glob("*.py")):
        tree = _parse(path)
        hf_alias = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and (n.module or "").startswith("transformers") for a in n.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in wanted:
                mt = _model_type_of(node)
                if mt is None:
                    for b in node.bases:
                        if isinstance(b, ast.Name) and b.id in hf_alias:
                            mt = _hf_model_type(hf_alias[b.id])
                            break
                if mt is not None:
                    out.add(mt)
    return sorted(out)


def mambaish(src: Path, graph: dict[str, list[str]]) -> dict[str, Any]:
    tree = _tree(src, "configs/hybrid_arch.py")
    classes: set[str] = set()
    conditional: set[str] = set()
    plain: set[str] = set()
    for fname in ("mamba2_config", "hybrid_gdn_config", "kimi_linear_config", "hybrid_lightning_config"):
        fn = _func(tree, fname)
        for n in ast.walk(fn):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "isinstance":
                for a in ast.walk(n.args[1]):
                    if isinstance(a, ast.Name) and a.id.endswith("Config"):
                        classes.add(a.id)
        # isinstance tests joined with an attribute test (Bailing use_kda, MiniCPM lightning, Granite layers)
        for n in ast.walk(fn):
            if isinstance(n, ast.If):
                bucket = conditional if isinstance(n.test, ast.BoolOp) else plain
                for a in ast.walk(n.test):
                    if isinstance(a, ast.Name) and a.id.endswith("Config"):
                        bucket.add(a.id)
    conditional -= plain
    glm5 = _func(tree, "glm5_next_config")
    glm5_types = [s for s in _strings(glm5) if s != "model_type"]
    registry: set[str] = set()
    for path in sorted((src / "srt").rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "register_linear_attn_model(" not in text:
            continue
        for n in ast.walk(ast.parse(text)):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "LinearAttnModelSpec":
                for kw in n.keywords:
                    if kw.arg == "config_class" and isinstance(kw.value, ast.Name):
                        registry.add(kw.value.id)
    wrappers: set[str] = set()  # configs whose text_config is always built as a mambaish config class
    mamba_classes = {n for n in graph if n in classes or ancestors(graph, n) & classes}
    for path in sorted((src / "srt" / "configs").glob("*.py")):
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(a, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "text_config"
                                                      for t in a.targets)
                    and isinstance(a.value, ast.Call) and isinstance(a.value.func, ast.Name)
                    and a.value.func.id in mamba_classes for a in ast.walk(node)):
                wrappers.add(node.name)
    return {
        "model_types": _model_types(src, graph, classes - conditional),
        "text_wrapper_model_types": _model_types(src, graph, wrappers - classes),
        "conditional_model_types": _model_types(src, graph, conditional),
        "kda_model_types": glm5_types,
        "registry_model_types": _model_types(src, graph, registry),
    }


def _entry_classes(src: Path, pattern: str) -> list[str]:
    out: list[str] = []
    for path in sorted((src / "srt" / "models").glob(pattern)):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                     for t in node.targets)):
                out.extend(n.id for n in ast.walk(node.value) if isinstance(n, ast.Name) and n.id not in out)
    return out


def speculative(src: Path) -> dict[str, Any]:
    algos = [n.targets[0].id for n in _class(_tree(src, "speculative/spec_info.py"), "SpeculativeAlgorithm").body
             if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)]
    aliases = _module_constant(_tree(src, "speculative/spec_registry.py"), "_RESERVED_ALIASES")
    hook = _tree(src, "arg_groups/speculative_hook.py")
    eagle_family = _func(hook, "_handle_eagle_family")
    defaults: list[str] = []
    for node in ast.walk(eagle_family):
        # `if model_arch in [...]:` whose body defaults the draft path to the model path
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "model_arch"
                and "speculative_draft_model_path" in ast.dump(node)
                and "model_path" in {k.value.attr for k in ast.walk(node) if isinstance(k, ast.keyword)
                                     and isinstance(k.value, ast.Attribute)}):
            defaults = _strings(node.test.comparators[0])
            break
    if not defaults:
        raise SourceError("speculative_hook._handle_eagle_family: the draft-defaults-to-target list was not found")
    alias_fn = _func(hook, "_resolve_speculative_algorithm_alias")
    gemma = [s for s in _strings(alias_fn) if s.endswith("ForCausalLM") and "Assistant" in s]
    eagle3 = _entry_classes(src, "*eagle3*.py")
    eagle = [c for c in _entry_classes(src, "*eagle*.py") if c not in eagle3 and "Eagle" in c]
    dspark = _tree(src, "speculative/dspark_components/dspark_config.py")
    bundle_fields = [x for x in _strings(_func(dspark, "checkpoint_bundles_dspark_draft")) if x.startswith("dspark_")]
    draft_vocab_readers = sorted(
        p.stem for p in (src / "srt" / "models").glob("*.py") if "draft_vocab_size" in p.read_text(encoding="utf-8"))
    return {
        "algorithms": algos, "aliases": {a: "EAGLE" for a in aliases},
        "draft_defaults_to_target": defaults, "gemma4_assistant_drafts": gemma,
        "eagle3_draft_archs": eagle3, "eagle_draft_archs": eagle,
        "draft_vocab_size_readers": draft_vocab_readers,
        "dspark_bundle_fields": bundle_fields,
    }


def backend_state_types(src: Path, values: dict[str, str]) -> dict[str, list[str]]:
    """Transfer backend (disaggregation/<name>/conn.py) -> the state types it can send.

    A backend whose sender raises 'unknown state_type' sends exactly the values it compares the state
    type with in that function; any other backend sends the StateType members it names, plus what the
    backend it builds on (imports its conn from) sends. `common` and `base` are shared code, not backends."""
    own: dict[str, set[str]] = {}
    builds_on: dict[str, set[str]] = {}
    known = set(values.values())
    for conn in sorted((src / "srt" / "disaggregation").glob("*/conn.py")):
        name = conn.parent.name
        if name in ("common", "base"):
            continue
        tree = _parse(conn)
        raiser = next((fn for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
                       and any("unknown state_type" in x for x in _strings(fn))), None)
        if raiser is not None:
            own[name] = {c for n in ast.walk(raiser) if isinstance(n, ast.Compare) for c in _strings(n) if c in known}
            continue
        own[name] = {values[n.attr] for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Name) and n.value.id == "StateType" and n.attr in values}
        builds_on[name] = {m.split(".")[-2] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                           for m in [n.module or ""] if m.startswith("sglang.srt.disaggregation.")
                           and m.endswith(".conn") and m.split(".")[-2] not in (name, "common", "base")}
    out: dict[str, list[str]] = {}
    for name, got in own.items():
        full = set(got)
        for other in builds_on.get(name, ()):
            full |= own.get(other, set())
        if full:
            out[name] = [v for v in values.values() if v in full]
    return out


def forced_no_hybrid_swa(src: Path) -> list[str]:
    """Architectures whose model override returns disable_hybrid_swa_memory=True (arg_groups/model_overrides)."""
    out: list[str] = []
    for path in sorted((src / "srt" / "arg_groups" / "model_overrides").glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            forces = any(isinstance(d, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "disable_hybrid_swa_memory"
                and isinstance(v, ast.Constant) and v.value is True for k, v in zip(d.keys, d.values, strict=True))
                for d in ast.walk(fn))
            if forces:
                for dec in fn.decorator_list:
                    out.extend(a for a in _strings(dec) if a not in out)
    return sorted(out)


def build(src: Path) -> dict[str, Any]:
    mc = _tree(src, "configs/model_config.py")
    graph = class_graph(src)
    st = state_types(src)
    dispatch, appended = state_dispatch(src)
    qsa = _tree(src, "layers/attention/qsa/config.py")
    qsa_fields = [s for s in _strings(_func(qsa, "parse_qsa_profile")) if s.endswith("_heads")]
    hybrid_swa = _func(mc, "is_hybrid_swa_model")
    swa_archs = sorted(set(_strings(hybrid_swa)) - {"sliding_attention", "is_hybrid_swa", "sliding_window"}
                       | set(_module_constant(mc, "SWA_SINK_ARCHS")) | set(_module_constant(mc, "MIMO_V2_MODEL_ARCHS")))
    return {
        "sglang": _version(src),
        "state_types": st,
        "state_types_appended": appended,
        "backend_state_types": backend_state_types(src, st),
        "state_dispatch_classes": dispatch,
        "pool_classes": pool_classes(graph, dispatch),
        "archs": {
            "hybrid_swa": swa_archs,
            "swa_sink": sorted(_module_constant(mc, "SWA_SINK_ARCHS")),
            "forced_no_hybrid_swa": forced_no_hybrid_swa(src),
            "mla": _mla_archs(mc),
            "dsa": [s for s in _strings(_func(mc, "is_deepseek_dsa")) if s != "index_topk"],
            "deepseek_v4": _strings(_func(mc, "is_deepseek_v4")),
            "minimax_sparse": _strings(_func(mc, "is_minimax_sparse")),
            "kimi_k3": _strings(_func(mc, "is_kimi_k3")),
            "qwen3_5": _strings(_func(mc, "is_qwen3_5")),
            "draft_rewrite": _draft_rewrites(_func(mc, "_config_draft_model"), {
                "MIMO_V2_MODEL_ARCHS": _module_constant(mc, "MIMO_V2_MODEL_ARCHS")}),
        },
        "served_archs": sorted(set(_entry_classes(src, "**/*.py"))),
        "dsa_field": "index_topk",
        "qsa_fields": qsa_fields,
        "mambaish": mambaish(src, graph),
        "speculative": speculative(src),
    }


def _version(src: Path) -> str:
    """The release: `__version__` of `sglang/_version.py`, else the wheel's METADATA beside the package."""
    p = src / "_version.py"
    if p.exists():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str) and "version = " in ast.unparse(node).split(":")[0]
                    + " = " and node.value.value[:1].isdigit()):
                return node.value.value
    for meta in sorted(src.parent.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8").splitlines():
            if line.startswith("Version: "):
                return line.split(": ", 1)[1].strip()
    raise SourceError(f"no release version found for {src} (_version.py or a dist-info METADATA)")


def unclassified(table: dict[str, Any]) -> list[str]:
    """What this release has that the reviewed classification above does not know."""
    problems = [f"StateType value {v!r} ({k})" for k, v in table["state_types"].items()
                if v not in STATE_TYPES_CLASSIFIED]
    problems += [f"KV pool class {c}" for c in table["pool_classes"] if c not in POOL_CLASSES_REVIEWED]
    problems += [f"speculative algorithm {a}" for a in table["speculative"]["algorithms"]
                 if a not in SPEC_ALGORITHMS_CLASSIFIED]
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=None, help="the sglang package directory of a release")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with the shipped file; exit 1 on a difference")
    args = ap.parse_args(argv)
    try:
        table = build(args.src or default_src())
    except (SourceError, SyntaxError) as exc:
        print(f"gen_sglang_families: {exc}", file=sys.stderr)
        return 1
    problems = unclassified(table)
    if problems:
        print("gen_sglang_families: this release has what the classification does not know:\n  "
              + "\n  ".join(problems) + "\nreview them in scripts/gen_sglang_families.py (STATE_TYPES_CLASSIFIED, "
              "POOL_CLASSES_REVIEWED, SPEC_ALGORITHMS_CLASSIFIED) and schemas/sglang/families.py", file=sys.stderr)
        return 1
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    if args.check:
        if args.out.read_text(encoding="utf-8") != text:
            print(f"gen_sglang_families: {args.out} differs from this release's source; regenerate it",
                  file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
