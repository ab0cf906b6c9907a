"""An SGLang launch command as a specctl deployment document, so every existing rule runs on it.

Contract: `to_deployment(cmd)` returns `Mapped(data, positions, flag_of)`: `data` is a deployment
document (one role, from `--disaggregation-mode`: prefill, decode, or colocated), `positions` maps its
JSON paths to the line/column of the flag that set them, and `flag_of(path)` names the SGLang flag
behind a JSON path (findings on SGLang input show the flag, not the JSON path). Values SGLang would
choose at run time from the GPU (memory-sized pools, auto-chosen steps) are left at values that
trigger no rule; the SGLang-specific rules (`sglang/rules.py`) check what only SGLang has.

The mapping: `--model-path` -> model.target, `--dtype` -> model.dtype (auto: the config's
torch_dtype); `--speculative-algorithm` EAGLE/EAGLE3/STANDALONE/... -> draft (with
`--speculative-draft-model-path`), NGRAM -> ngram; `--speculative-num-steps`, `--speculative-eagle-topk`;
`--speculative-adaptive` (+ `--speculative-adaptive-config` JSON, relative to the command file, or
SGLang's default table) -> speculative.adaptive; `--page-size` (SGLang's default 1) -> cache.page_size;
`--max-total-tokens` -> cache.max_tokens; `--max-running-requests` -> serve.max_batch_size;
`--cuda-graph-bs-decode` (or SGLang's list up to `--cuda-graph-max-bs-decode`) -> graph_batch_sizes;
`--host`, `--port`, `--disaggregation-bootstrap-port` -> the role's address.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.schemas.findings import Finding
from specctl.schemas.sglang.command import SGLangCommand

DRAFT_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "NEXTN", "DFLASH", "DSPARK", "FROZEN_KV_MTP")
ADAPTIVE_KNOBS = ("ema_alpha", "warmup_batches", "update_interval", "up_hysteresis",
                  "down_hysteresis", "ceiling_coeff")
_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
           "float32": "float32"}

# deployment JSON path -> SGLang dest (the flag behind it)
FLAG_OF_PATH: dict[str, str] = {
    "$.model.target": "model_path",
    "$.model.dtype": "dtype",
    "$.speculative.algorithm": "speculative_algorithm",
    "$.speculative.draft": "speculative_draft_model_path",
    "$.speculative.num_steps": "speculative_num_steps",
    "$.speculative.topk": "speculative_eagle_topk",
    "$.speculative.adaptive": "speculative_adaptive_config",
    "$.cache.page_size": "page_size",
    "$.cache.max_tokens": "max_total_tokens",
    "$.serve.max_batch_size": "max_running_requests",
    "$.serve.graph_batch_sizes": "cuda_graph_bs_decode",
    "host": "host",
    "port": "port",
    "bootstrap_port": "disaggregation_bootstrap_port",
    "$.transfer.backend": "disaggregation_transfer_backend",
}


# Flags `to_deployment` reads (everything else has no field in the deployment model).
CONSUMED = frozenset({
    "model_path", "dtype", "device", "base_gpu_id", "speculative_algorithm", "speculative_draft_model_path",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_adaptive", "speculative_adaptive_config",
    "page_size", "max_total_tokens", "max_running_requests", "cuda_graph_bs_decode", "cuda_graph_max_bs_decode",
    "disable_cuda_graph", "disable_decode_cuda_graph", "disable_cuda_graph_padding", "host", "port",
    "disaggregation_mode", "disaggregation_bootstrap_port",
})
# Flags whose value the deployment model implies on export (not lost on a round trip when left at it).
IMPLIED = {"disaggregation_transfer_backend": "mooncake", "disable_radix_cache": True,
           "speculative_num_draft_tokens": None}


def unmapped_flags(cmd: SGLangCommand) -> list[str]:
    """The flags of `cmd` the deployment model cannot hold, as written (for import to say so)."""
    out = []
    for dest, opt in cmd.options.items():
        if dest in CONSUMED or (dest in IMPLIED and (IMPLIED[dest] is None or IMPLIED[dest] == opt.value)):
            continue
        if opt.flag.takes_value:
            vals = opt.value if isinstance(opt.value, list) else [opt.value]
            out.append(" ".join([opt.flag.name, *(str(v) for v in vals)]))
        else:
            out.append(opt.flag.name if opt.value or opt.flag.kind != "bool_optional"
                       else opt.flag.aliases[0] if opt.flag.aliases else opt.flag.name)
    return out


def generate_decode_graph_sizes(max_bs: int, *, speculative: bool, no_padding: bool = False) -> list[int]:
    """SGLang's decode CUDA-graph batch sizes up to `max_bs` (arg_groups/cuda_graph_hook.py)."""
    if no_padding:
        sizes = list(range(1, max_bs + 1))
    elif not speculative:
        sizes = ([1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
                 + list(range(512, max_bs + 1, 32)))
    else:
        sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
                 + list(range(272, max_bs + 1, 16)))
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


@dataclass
class Mapped:
    data: dict[str, Any]
    positions: dict[str, tuple[int, int] | None]
    adaptive_findings: list[Finding] = field(default_factory=list)
    adaptive_source: str | None = None

    def flag_for(self, path: str, cmd: SGLangCommand) -> str | None:
        if re.match(r"^\$\.roles(\.\w+)?$", path):
            return cmd.flag_name("disaggregation_mode")
        for prefix in sorted(FLAG_OF_PATH, key=len, reverse=True):
            if prefix.startswith("$"):
                if path == prefix or path.startswith(prefix + "."):
                    return cmd.flag_name(FLAG_OF_PATH[prefix])
            elif re.match(rf"^\$\.roles\.\w+\.{prefix}$", path):
                return cmd.flag_name(FLAG_OF_PATH[prefix])
        return None


def _name(cmd: SGLangCommand) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(cmd.name).stem) or "sglang"
    return stem if stem[0].isalnum() else "s" + stem


def model_dtype(cmd: SGLangCommand, config_dtype: str | None) -> str:
    d = cmd.value("dtype")
    if d in _DTYPES:
        return _DTYPES[d]
    return _DTYPES.get(config_dtype or "", "bfloat16")  # auto: the checkpoint's torch_dtype (SGLang's rule)


class _NotPlain(Exception):
    pass


def _no_dups(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _NotPlain
    return out


def _reject(name: str) -> Any:
    raise _NotPlain  # NaN / Infinity: the full loader words the error


def _plain_json(text: str) -> dict[str, Any] | None:
    """A plain JSON object (no duplicate keys, no NaN, no huge integers), else None for the full loader."""
    import json

    if not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text, object_pairs_hook=_no_dups, parse_constant=_reject)
    except (_NotPlain, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or _too_big(data):
        return None
    return data


def _too_big(v: Any, depth: int = 0) -> bool:
    if depth > 32:
        return True
    if isinstance(v, dict):
        return any(_too_big(x, depth + 1) for x in v.values())
    if isinstance(v, list):
        return any(_too_big(x, depth + 1) for x in v)
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**63 - 1


def read_adaptive_json(cmd: SGLangCommand) -> tuple[dict[str, Any] | None, str | None, Finding | None]:
    """The --speculative-adaptive-config JSON (relative to the command file), or a finding."""
    from specctl.errors import UsageError
    from specctl.schemas.loader import load_document, read_text

    raw = cmd.value("speculative_adaptive_config")
    if not isinstance(raw, str):
        return None, None, None
    p = Path(raw)
    if not p.is_absolute():
        p = cmd.base_dir / p
    line, col = cmd.where("speculative_adaptive_config")
    try:
        data = _plain_json(read_text(p))  # the common case, without importing yaml (start-up)
        if data is not None:
            return data, str(p), None
        doc = load_document(p)
    except UsageError as exc:
        return None, str(p), Finding(
            "SGL104", "error", "--speculative-adaptive-config",
            f"--speculative-adaptive-config {raw} (resolved relative to the command file: {p}): {exc}; SGLang "
            "fails at start-up (FileNotFoundError / json.JSONDecodeError in _load_adaptive_config)",
            exc.hint or "point it at the adaptive JSON file, relative to the command file", line, col)
    return doc.data, str(p), None


def to_deployment(cmd: SGLangCommand, *, config_dtype: str | None = None) -> Mapped:
    from specctl.schemas.adaptive import SGLANG_DEFAULT_CONFIG, parse_sglang_config

    role = cmd.role
    pos: dict[str, tuple[int, int] | None] = {}

    def at(path: str, dest: str) -> None:
        line, col = cmd.where(dest)
        pos[path] = (line or cmd.first_line, col or 1)

    data: dict[str, Any] = {"version": 1, "name": _name(cmd)}
    model: dict[str, Any] = {"target": str(cmd.value("model_path") or "")}
    model["dtype"] = model_dtype(cmd, config_dtype)
    device = cmd.value("device")
    if cmd.given("base_gpu_id") and device in (None, "cuda"):
        model["device"] = f"cuda:{cmd.value('base_gpu_id')}"
    elif device in ("cpu", "cuda"):
        model["device"] = device
    data["model"] = model
    at("$.model", "model_path")
    at("$.model.target", "model_path")
    at("$.model.dtype", "dtype")
    at("$.model.device", "base_gpu_id" if cmd.given("base_gpu_id") else "device")

    algo = cmd.value("speculative_algorithm")
    spec: dict[str, Any] = {}
    mapped = Mapped(data, pos)
    if isinstance(algo, str) and algo.upper() != "NONE":
        a = algo.upper()
        spec["algorithm"] = "ngram" if a == "NGRAM" else "draft"
        draft = cmd.value("speculative_draft_model_path")
        if spec["algorithm"] == "draft" and isinstance(draft, str):
            spec["draft"] = draft
        topk = cmd.value("speculative_eagle_topk")
        if isinstance(topk, int):
            spec["topk"] = topk
        steps = cmd.value("speculative_num_steps")
        adaptive_on = bool(cmd.value("speculative_adaptive"))
        if adaptive_on:
            raw_cfg, source, problem = read_adaptive_json(cmd)
            if problem is not None:
                mapped.adaptive_findings.append(problem)
            elif raw_cfg is None:
                raw_cfg, source = SGLANG_DEFAULT_CONFIG, None
            if raw_cfg is not None:
                parsed, found = parse_sglang_config(raw_cfg, base_path="$")
                line, col = cmd.where("speculative_adaptive_config")
                for f in found:  # JSON paths of the adaptive file: shown with the flag
                    mapped.adaptive_findings.append(Finding(
                        f.code, f.severity, "--speculative-adaptive-config",
                        f"{Path(source).name if source else 'default config'} {f.path}: {f.message}", f.fix, line, col))
                if parsed is not None:
                    adaptive: dict[str, Any] = {k: raw_cfg[k] for k in ADAPTIVE_KNOBS if k in raw_cfg}
                    adaptive["buckets"] = {
                        str(b.min_batch_size): {"candidate_steps": list(b.candidate_steps),
                                                **{k: raw_cfg[b.key][k] for k in ADAPTIVE_KNOBS
                                                   if isinstance(raw_cfg.get(b.key), dict) and k in raw_cfg[b.key]}}
                        for b in parsed.buckets
                    }
                    spec["adaptive"] = adaptive
                    if not isinstance(steps, int):
                        steps = parsed.default_initial_steps  # SGLang: the middle of the union
                    mapped.adaptive_source = source
        if not isinstance(steps, int):
            steps = 3  # SGLang auto-chooses per model (_auto_choose_speculative_params); 3 is typical
        spec["num_steps"] = steps
    else:
        spec["algorithm"] = "none"
    data["speculative"] = spec
    for k in ("algorithm", "draft", "num_steps", "topk"):
        at(f"$.speculative.{k}", FLAG_OF_PATH[f"$.speculative.{k}"])
    at("$.speculative", "speculative_algorithm")
    at("$.speculative.adaptive", "speculative_adaptive_config" if cmd.given("speculative_adaptive_config")
       else "speculative_adaptive")

    page = cmd.value("page_size")
    cache: dict[str, Any] = {"page_size": page if isinstance(page, int) and page > 0 else 1}
    mt = cmd.value("max_total_tokens")
    # unknown (SGLang sizes the pool from GPU memory): the largest multiple of the page the schema allows,
    # so no capacity or page-multiple rule fires on a value the user never wrote
    unit = cache["page_size"]
    cache["max_tokens"] = mt if isinstance(mt, int) and mt > 0 else max(unit, unit * ((1 << 30) // unit))
    data["cache"] = cache
    at("$.cache", "page_size")
    at("$.cache.page_size", "page_size")
    at("$.cache.max_tokens", "max_total_tokens")

    serve: dict[str, Any] = {}
    mrr = cmd.value("max_running_requests")
    graphs = cmd.value("cuda_graph_bs_decode")
    max_graph = cmd.value("cuda_graph_max_bs_decode")
    speculative = spec["algorithm"] != "none"
    if cmd.value("disable_cuda_graph") or cmd.value("disable_decode_cuda_graph"):
        graph_list: list[int] = []
    elif isinstance(graphs, list) and graphs:
        graph_list = sorted({g for g in graphs if isinstance(g, int) and g > 0})
    elif isinstance(max_graph, int) and max_graph > 0:
        graph_list = generate_decode_graph_sizes(max_graph, speculative=speculative,
                                                 no_padding=bool(cmd.value("disable_cuda_graph_padding")))
    else:
        graph_list = []  # SGLang sizes the list from GPU memory at start-up: unknown here
    if isinstance(mrr, int) and mrr > 0:
        serve["max_batch_size"] = min(mrr, 65536)
    elif graph_list:
        serve["max_batch_size"] = max(graph_list)  # unknown: no bigger batch than the graphs assumed
    else:
        serve["max_batch_size"] = 65536  # unknown (sized from GPU memory): no bucket is unreachable
    serve["graph_batch_sizes"] = [g for g in graph_list if g <= 65536]
    data["serve"] = serve
    at("$.serve", "max_running_requests")
    at("$.serve.max_batch_size", "max_running_requests")
    at("$.serve.graph_batch_sizes", "cuda_graph_bs_decode" if cmd.given("cuda_graph_bs_decode")
       else "cuda_graph_max_bs_decode")

    entry: dict[str, Any] = {"host": str(cmd.value("host") or "127.0.0.1"), "port": int(cmd.value("port") or 30000)}
    if role == "prefill":
        entry["bootstrap_port"] = int(cmd.value("disaggregation_bootstrap_port") or 8998)
    data["roles"] = {role: entry}
    at("$.roles", "disaggregation_mode")
    at(f"$.roles.{role}", "disaggregation_mode")
    at(f"$.roles.{role}.host", "host")
    at(f"$.roles.{role}.port", "port")
    at(f"$.roles.{role}.bootstrap_port", "disaggregation_bootstrap_port")
    data["transfer"] = {"backend": "zmq"}  # SGLang's backends are compared by the SGLang rules (SGL2xx)
    at("$.transfer", "disaggregation_transfer_backend")
    at("$.transfer.backend", "disaggregation_transfer_backend")
    pos["$"] = (cmd.first_line, 1)
    return mapped


# Findings of the deployment rules that SGLang itself decides on SGLang input (predicted by `startup` or
# `rules` in SGLang's own terms): ADP101 is SGL309, FBK401 is SGL102, MOD703 is SGL114 (MTP models draft
# with their own head, which the deployment model cannot say).
SGLANG_COUNTERPART = {"ADP101": "SGL309", "FBK401": "SGL102", "MOD703": "SGL114"}
DECIDED_BY_SGLANG = frozenset(SGLANG_COUNTERPART)

# Deployment-schema words -> SGLang flags, longest first, for messages and fixes shown on SGLang input.
_DIALECT: tuple[tuple[str, str], ...] = tuple(sorted((
    ("speculative.num_steps", "--speculative-num-steps"),
    ("speculative.topk", "--speculative-eagle-topk"),
    ("speculative.draft", "--speculative-draft-model-path"),
    ("speculative.algorithm", "--speculative-algorithm"),
    ("speculative.adaptive", "--speculative-adaptive-config"),
    ("cache.page_size", "--page-size"),
    ("cache.max_tokens", "--max-total-tokens"),
    ("cache.state_types", "the model's state types"),
    ("serve.max_batch_size", "--max-running-requests"),
    ("serve.graph_batch_sizes", "--cuda-graph-bs-decode"),
    ("model.target", "--model-path"),
    ("model.dtype", "--dtype"),
    ("transfer.backend", "--disaggregation-transfer-backend"),
    ("PREFILL.yaml DECODE.yaml", "prefill.sh decode.sh"),
), key=lambda kv: -len(kv[0])))
_DEPLOYMENT_WHERE = re.compile(r"deployment: [^;()]*; (?=SGLang: )")
_BUILTIN = re.compile(r"\s*\((?:e\.g\.\s*)?builtin:[^)]*\)|builtin:tiny-[a-z]+(?: / builtin:tiny-[a-z]+)?")


def in_sglang_dialect(text: str) -> str:
    """`text` with deployment-schema fields named by their SGLang flags and builtin model examples dropped (an
    agreement fix's "deployment: KEY; " part too: its "SGLang: FLAG" part names the flag)."""
    text = _DEPLOYMENT_WHERE.sub("", text)
    for word, flag in _DIALECT:
        text = re.sub(rf"(?<![\w.-]){re.escape(word)}(?![\w])", flag, text)
    return _BUILTIN.sub(lambda m: "" if m.group(0).lstrip().startswith("(") else "a model directory", text)


def other_spelling(code: str, summary: str, fix: str) -> tuple[str, str] | None:
    """("On SGLang commands" | "In deployment files", text) for a rule that applies to both inputs, else None:
    the counterpart code where SGLang's own check replaces the rule, or the fix in SGLang's flags."""
    if code in SGLANG_COUNTERPART:
        return ("On SGLang commands", f"SGLang decides this itself at start-up; validate reports "
                f"{SGLANG_COUNTERPART[code]} instead (specctl explain {SGLANG_COUNTERPART[code]})")
    back = {v: k for k, v in SGLANG_COUNTERPART.items()}
    if code in back:
        return ("In deployment files", f"the same check is {back[code]} (specctl explain {back[code]})")
    if code.startswith("SGL"):
        return None
    translated = in_sglang_dialect(fix)
    if translated != fix or in_sglang_dialect(summary) != summary:
        return ("On SGLang commands", f"{translated} (validate names the flag behind each field)")
    return None
