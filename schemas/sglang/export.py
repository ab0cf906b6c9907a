"""A specctl deployment as SGLang launch commands: prefill, decode (or one colocated server) and the
router in front (smg by default, or sglang-router), plus the adaptive JSON file they reference.

Contract: `export_commands(deployment, *, adaptive_file="adaptive.json") -> SGLangCommands` (a
`schemas.deployment.Deployment`, already validated). Every argv uses full flag names only (no
abbreviations; SGLang's parser with `allow_abbrev=False` accepts each), starts with `python -m
sglang.launch_server` (router: `smg launch` or `python -m sglang_router.launch_router`), and an adaptive role always
carries `--speculative-adaptive` next to `--speculative-adaptive-config FILE` (SGLang ignores the file
otherwise). `files` maps file names (relative to where the commands run) to their text. Builtin models
are exported as their local directories, never as a name SGLang could look up on a hub.

Mapping (the inverse of `mapping.py`): model.target -> --model-path; dtype -> --dtype; device cpu ->
--device cpu, cuda:N -> --base-gpu-id N; speculative draft -> EAGLE when adaptive (SGLang adapts only
EAGLE/EAGLE3, so the draft must be an EAGLE head there), STANDALONE otherwise, with
--speculative-draft-model-path; ngram -> NGRAM; num_steps, topk (+ num_draft_tokens = steps + 1 when
static); cache.page_size / max_tokens -> --page-size / --max-total-tokens; serve.max_batch_size /
graph_batch_sizes -> --max-running-requests / --cuda-graph-bs-decode; roles -> --host/--port,
--disaggregation-mode, --disaggregation-bootstrap-port; transfer -> --disaggregation-transfer-backend
mooncake (SGLang has no zmq/shm backend; mooncake is its default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.deployment import Deployment
from specctl.schemas.model_facts import BUILTIN_PREFIX, resolve_model_dir
from specctl.schemas.role_config import RoleConfig

LAUNCH = ["python", "-m", "sglang.launch_server"]
KNOBS = ("ema_alpha", "warmup_batches", "update_interval", "up_hysteresis", "down_hysteresis",
         "ceiling_coeff")


@dataclass(frozen=True)
class SGLangCommands:
    """argv per role (None when the deployment has no such role) and the files they reference."""

    prefill: list[str] | None = None
    decode: list[str] | None = None
    colocated: list[str] | None = None
    router: list[str] | None = None
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prefill": self.prefill or [], "decode": self.decode or [],
                               "router": self.router or [], "files": dict(self.files)}
        if self.colocated is not None:
            out["colocated"] = self.colocated
        return out


def model_path(ref: str) -> str:
    """A model reference as the local directory SGLang should load (builtin models resolved)."""
    if ref.startswith(BUILTIN_PREFIX):
        return str(resolve_model_dir(ref))
    return ref


def adaptive_json(adaptive: dict[str, Any]) -> dict[str, Any]:
    """A deployment's speculative.adaptive block as SGLang's --speculative-adaptive-config object.

    Refuses (UsageError, exit 2) a block that sets a specctl-only knob (`zero_backoff` > 1, a number in
    `zero_threshold`): SGLang would ignore the key and run a different policy, so dropping it silently would
    export a lie. A knob left at its default (SGLang's behaviour) is dropped: SGLang runs exactly that.
    """
    from specctl.schemas.adaptive_config import SPECCTL_KNOB_DEFAULTS, SPECCTL_KNOB_UNDER_SGLANG, SPECCTL_KNOBS
    from specctl.schemas.adaptive_parser import specctl_only_settings

    found = specctl_only_settings(adaptive)
    if found:
        paths = [f"speculative.adaptive{''.join(f'.{k}' for k in keys)}.{knob}" for keys, knob, _ in found]
        where = ", ".join(f"{p}: {value}" for p, (_, _, value) in zip(paths, found, strict=True))
        default = SPECCTL_KNOB_DEFAULTS[found[0][1]]
        reset = "" if default is None else f" (or set it to {default}), e.g. --set {paths[0]}={default}"
        raise UsageError(
            f"cannot export to SGLang: {where} is specctl-only; SGLang's adaptive JSON cannot carry it (SGLang "
            f"ignores the key: {SPECCTL_KNOB_UNDER_SGLANG[found[0][1]]}), so the exported servers would run "
            "another policy than this deployment",
            hint=f"remove it for SGLang{reset}; `specctl adaptive tune --sglang` finds the best config SGLang can run",
        )
    out: dict[str, Any] = {k: adaptive[k] for k in KNOBS if k in adaptive}
    for key, bucket in sorted((adaptive.get("buckets") or {}).items(), key=lambda kv: int(kv[0])):
        out[str(key)] = {k: v for k, v in bucket.items() if k not in SPECCTL_KNOBS}
    return out


def role_argv(cfg: RoleConfig, role: str, *, adaptive_file: str) -> tuple[list[str], dict[str, str]]:
    """One engine role's SGLang argv and the files it references."""
    files: dict[str, str] = {}
    model, spec, cache, serve = cfg.model, cfg.speculative, cfg.cache, cfg.serve
    argv = [*LAUNCH, "--model-path", model_path(str(model.target))]
    argv += ["--dtype", model.dtype]
    device = model.device
    if device == "cpu":
        argv += ["--device", "cpu"]
    elif device.startswith("cuda:"):
        argv += ["--base-gpu-id", device.split(":", 1)[1]]
    elif device == "cuda":
        argv += ["--device", "cuda"]
    argv += ["--host", cfg.host or "127.0.0.1", "--port", str(cfg.port or 30000)]
    if role in ("prefill", "decode"):
        argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "mooncake"]
        if role == "decode":  # SGLang turns decode's radix cache off anyway; saying so keeps SGL106 quiet
            argv += ["--disable-radix-cache"]
        if role == "prefill" and cfg.bootstrap_port is not None:
            argv += ["--disaggregation-bootstrap-port", str(cfg.bootstrap_port)]
    argv += ["--page-size", str(cache.page_size), "--max-total-tokens", str(cache.max_tokens)]
    argv += ["--max-running-requests", str(serve.max_batch_size)]
    if serve.graph_batch_sizes:
        argv += ["--cuda-graph-bs-decode", *(str(g) for g in serve.graph_batch_sizes)]
    algo = spec.algorithm
    adaptive = spec.adaptive
    if algo != "none":
        steps = spec.num_steps or 0
        if algo == "ngram":
            argv += ["--speculative-algorithm", "NGRAM"]
        else:
            argv += ["--speculative-algorithm", "EAGLE" if adaptive else "STANDALONE"]
            if spec.draft:
                argv += ["--speculative-draft-model-path", model_path(spec.draft)]
        argv += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(spec.topk)]
        if adaptive:
            argv += ["--speculative-adaptive", "--speculative-adaptive-config", adaptive_file]
            files[adaptive_file] = json.dumps(adaptive_json(dict(adaptive)), indent=2) + "\n"
        else:
            argv += ["--speculative-num-draft-tokens", str(steps + 1)]
    return argv, files


def export_router(deployment: Deployment, *, kind: str | None = None) -> list[str]:
    """The router's command in front of every prefill and decode instance (orchestrate/router.py builds it:
    the same command line `specctl up` runs, without its local-only settings). `kind`: smg or sglang-router,
    the deployment's `roles.router.kind` when None."""
    from specctl.schemas.budget import request_budget_s
    from specctl.schemas.sglang.router import router_command
    from specctl.schemas.sglang.router import router_kind as deployment_router_kind

    r = deployment.role("router") if "router" in deployment.roles else None
    prefills = [(f"http://{p.host}:{p.port}", p.bootstrap_port or 8998) for p in deployment.instances("prefill")]
    decodes = [f"http://{d.host}:{d.port}" for d in deployment.instances("decode")]
    target = str(deployment.role("decode").model.target)
    return router_command(prefills, decodes, kind=kind or deployment_router_kind(deployment),
                          host=(r.host if r else None) or "127.0.0.1", port=(r.port if r else None) or 30000,
                          request_timeout_s=request_budget_s(deployment), served_model=model_path(target))


def export_commands(deployment: Deployment, *, adaptive_file: str = "adaptive.json",
                    router_kind: str | None = None) -> SGLangCommands:
    """The deployment's SGLang launch commands (see the module contract); `router_kind` picks the router
    (smg or sglang-router; the deployment's `roles.router.kind` when None)."""
    argvs: dict[str, list[str]] = {}
    files: dict[str, str] = {}
    for role in deployment.engine_roles:
        cfg = deployment.role(role)
        name = adaptive_file
        argv, more = role_argv(cfg, role, adaptive_file=name)
        for k, v in more.items():
            if k in files and files[k] != v:  # roles with different adaptive tables get a file each
                k2 = f"{role}-{k}"
                argv[argv.index(k)] = k2
                k = k2
            files[k] = v
        argvs[role] = argv
    router: list[str] | None = None
    if "prefill" in argvs and "decode" in argvs:
        router = export_router(deployment, kind=router_kind)
    return SGLangCommands(prefill=argvs.get("prefill"), decode=argvs.get("decode"),
                          colocated=argvs.get("colocated"), router=router, files=files)


def shell_script(argv: list[str]) -> str:
    """One argv as a readable shell command file (one flag per line, quoted where needed)."""
    import shlex

    parts: list[str] = [" ".join(shlex.quote(a) for a in argv[:3])]
    i = 3
    while i < len(argv):
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        parts.append("  " + " ".join(shlex.quote(a) for a in argv[i:j]))
        i = j
    return " \\\n".join(parts) + "\n"
