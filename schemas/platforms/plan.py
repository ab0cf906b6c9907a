"""A deployment laid out for a cluster: the one input of every platform writer (RBG, LWS, Dynamo, Slurm).

Contract: `build_plan(deployment, options)` takes the SGLang argv of each engine role from
`schemas.sglang.export.export_commands` (the argv `specctl export sglang` prints: one source of truth) and
returns a `Plan`: per engine role a `RolePlan` (its argv, replicas = the role's instance count, port,
bootstrap port, GPUs and nodes per instance), the files the argv reference (adaptive JSON), the model
directories to mount, and the router's port. `RolePlan.launch(leader=, rank=, size=)` is the argv of one
process of an instance, with the platform's leader address / worker index / group size variables when the
instance spans several nodes (SGLang's `--nnodes --node-rank --dist-init-addr`, `--tp-size` = GPUs x nodes).
On a cluster every engine binds 0.0.0.0, `--base-gpu-id` is dropped (a container sees only its own GPUs) and
the adaptive file is read from `CONFIG_DIR`. Instances of one role must agree on everything but their
addresses (a platform replicates one template); a deployment whose instances differ is refused (exit 2).
`gate_script(pairs)` is the preflight gate: wait for each server's /health, then `specctl preflight` on every
pair; the router starts only after it exits 0.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.budget import request_budget_s
from specctl.schemas.deployment import Deployment

ROUTERS = ("smg", "sglang-router")
CONFIG_DIR = "/etc/specctl"
DEFAULT_IMAGE = "lmsysorg/sglang:v0.5.23"
DEFAULT_TOOL_IMAGE = "python:3.11-slim"
ENGINE_PATH_FLAGS = ("--model-path", "--speculative-draft-model-path")
# Flags whose value is an address, not part of what a role's instances must share.
_ADDRESS_FLAGS = ("--host", "--port", "--disaggregation-bootstrap-port", "--base-gpu-id")


@dataclass(frozen=True)
class PlatformOptions:
    """What a platform needs that a deployment does not say; every field has a default and a CLI flag."""

    name: str | None = None
    namespace: str = "default"
    image: str = DEFAULT_IMAGE
    router_image: str | None = None
    tool_image: str = DEFAULT_TOOL_IMAGE
    specctl_requirement: str = "specctl"
    gpus: int | None = None  # per pod / node; None: 0 when every engine runs on the CPU, else 1
    nodes: int = 1
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: tuple[tuple[str, str], ...] = ()
    model_claim: str = "models"
    model_dir: str | None = None
    router: str | None = None  # smg or sglang-router; None: the deployment's roles.router.kind (smg when unset)
    dist_port: int = 5000

    def __post_init__(self) -> None:
        if self.router is not None and self.router not in ROUTERS:
            raise UsageError(f"unknown router {self.router!r}", hint=f"one of: {', '.join(ROUTERS)}")
        if (self.gpus is not None and self.gpus < 0) or self.nodes < 1:
            raise UsageError("--gpus must be >= 0 and --nodes >= 1", hint="e.g. --gpus 8 --nodes 2 (TP 16)")
        if self.nodes > 1 and not self.gpus:
            raise UsageError("a role spanning several nodes needs GPUs (--gpus N)", hint="e.g. --gpus 8 --nodes 2")


@dataclass(frozen=True)
class RolePlan:
    role: str
    argv: tuple[str, ...]
    replicas: int
    port: int
    bootstrap_port: int | None
    gpus: int
    nodes: int

    @property
    def tp(self) -> int:
        return max(1, self.gpus) * self.nodes

    def launch(self, *, leader: str = "", rank: str = "0", size: str = "1", dist_port: int = 5000,
               distributed: bool = True) -> list[str]:
        """The argv of one process of an instance (see the module contract); `distributed=False` leaves the
        multi-node flags to a platform that adds them itself."""
        argv = list(self.argv)
        if self.tp > 1:
            argv += ["--tp-size", str(self.tp)]
        if self.nodes > 1 and distributed:
            argv += ["--nnodes", size, "--node-rank", rank, "--dist-init-addr", f"{leader}:{dist_port}"]
        return argv


@dataclass(frozen=True)
class Plan:
    deployment: Deployment
    options: PlatformOptions
    roles: dict[str, RolePlan]
    files: dict[str, str] = field(default_factory=dict)
    model_dirs: tuple[str, ...] = ()
    router_port: int = 30000
    gpus: int = 0  # per pod / node, resolved from the options and the deployment's devices

    @property
    def name(self) -> str:
        return dns_name(self.options.name or self.deployment.name)

    @property
    def router_kind(self) -> str:
        """`--router`, else the deployment's `roles.router.kind` (smg when unset)."""
        from specctl.schemas.sglang.router import router_kind

        return self.options.router or router_kind(self.deployment)

    @property
    def pd(self) -> bool:
        return "prefill" in self.roles and "decode" in self.roles


def dns_name(text: str) -> str:
    """A DNS-1123 label from a deployment name (lower case, `-` for other characters, at most 40 so that
    platform suffixes fit in 63)."""
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    while "--" in out:
        out = out.replace("--", "-")
    out = out[:40].strip("-")
    if not out or not out[0].isalpha():
        out = "d-" + out
    return out


def drop_flag(argv: list[str], flag: str) -> list[str]:
    if flag not in argv:
        return argv
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


def set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    if flag in argv:
        i = argv.index(flag)
        return [*argv[:i + 1], value, *argv[i + 2:]]
    return [*argv, flag, value]


def _shared_part(argv: list[str]) -> list[str]:
    for flag in _ADDRESS_FLAGS:
        argv = drop_flag(argv, flag)
    return argv


def build_plan(deployment: Deployment, options: PlatformOptions, *, cluster: bool = True) -> Plan:
    """The deployment laid out for a platform (see the module contract)."""
    from specctl.schemas.sglang.export import export_commands, role_argv

    cmds = export_commands(deployment, adaptive_file="adaptive.json")
    files = dict(cmds.files)
    roles: dict[str, RolePlan] = {}
    devices: list[str] = []
    for role in deployment.engine_roles:
        base = {"prefill": cmds.prefill, "decode": cmds.decode, "colocated": cmds.colocated}[role]
        if base is None:
            continue
        instances = deployment.instances(role)
        first = _shared_part(role_argv(instances[0], role, adaptive_file="adaptive.json")[0])
        for i, inst in enumerate(instances[1:], start=1):
            other = _shared_part(role_argv(inst, role, adaptive_file="adaptive.json")[0])
            if other != first:
                diff = sorted(set(other) ^ set(first))[:4]
                raise UsageError(
                    f"roles.{role}[{i}] differs from roles.{role}[0] in more than its address ({' '.join(diff)}); "
                    "a cluster role replicates one template",
                    hint=f"give every {role} instance the same settings, or export the instances as separate "
                         "deployments")
        argv = list(base)
        if cluster:
            argv = set_flag(argv, "--host", "0.0.0.0")
            argv = drop_flag(argv, "--base-gpu-id")
            for flag in ("--speculative-adaptive-config",):
                if flag in argv:
                    i = argv.index(flag) + 1
                    argv[i] = posixpath.join(CONFIG_DIR, argv[i])
        cfg = instances[0]
        devices.append(cfg.model.device)
        roles[role] = RolePlan(
            role=role, argv=tuple(argv), replicas=len(instances), port=int(cfg.port or 0),
            bootstrap_port=(cfg.bootstrap_port or 8998) if role == "prefill" else None,
            gpus=0, nodes=options.nodes)
    gpus = options.gpus if options.gpus is not None else (0 if all(d == "cpu" for d in devices) else 1)
    roles = {r: replace(rp, gpus=gpus) for r, rp in roles.items()}
    router_port = (deployment.role("router").port if "router" in deployment.roles else None) or 30000
    return Plan(deployment=deployment, options=options, roles=roles, files=files,
                model_dirs=_model_dirs(roles, options), router_port=router_port,
                gpus=gpus)


def _model_dirs(roles: dict[str, RolePlan], options: PlatformOptions) -> tuple[str, ...]:
    if options.model_dir:
        return (options.model_dir,)
    paths = sorted({r.argv[r.argv.index(f) + 1] for r in roles.values() for f in ENGINE_PATH_FLAGS if f in r.argv})
    absolute = [p for p in paths if p.startswith("/")]
    if not absolute:
        return ()
    common = posixpath.commonpath([posixpath.dirname(p) for p in absolute])
    return (common if common != "/" else posixpath.dirname(absolute[0]),)


def router_argv(plan: Plan, prefills: list[tuple[str, int]], decodes: list[str], *, host: str) -> list[str]:
    """The router (`--router`: smg or sglang-router) in front of the given prefill (URL, bootstrap port) and
    decode URLs, listening on host:router_port: the router's one command-line builder, at the platform's
    addresses, with the request budget (schemas/budget.py) as its request timeout, as `up` runs it."""
    from specctl.schemas.sglang.export import model_path
    from specctl.schemas.sglang.router import router_command

    target = str(plan.deployment.role("decode").model.target)
    return router_command(prefills, decodes, kind=plan.router_kind, host=host, port=plan.router_port,
                          request_timeout_s=request_budget_s(plan.deployment), served_model=model_path(target))


def gate_pairs(prefills: list[tuple[str, int]], decodes: list[str]) -> list[tuple[str, int, str]]:
    """The pairs the gate checks: every prefill against the first decode and the first prefill against every
    decode (each server is compared at least once; every decode pairs with every prefill at run time, and the
    settings preflight compares are the role's template, equal across its instances)."""
    pairs = [(u, b, decodes[0]) for u, b in prefills] + [(prefills[0][0], prefills[0][1], d) for d in decodes[1:]]
    return list(dict.fromkeys(pairs))


def wait_health_command(urls: list[str]) -> str:
    """Shell: block until each URL's /health answers 200 (python's urllib: no curl in a slim image)."""
    probe = "import sys, urllib.request as u; u.urlopen(sys.argv[1] + '/health', timeout=5)"  # raises unless 2xx
    lines = [f"for url in {' '.join(shlex.quote(u) for u in urls)}; do",
             f"  until python3 -c {shlex.quote(probe)} \"$url\" 2>/dev/null; do",
             "    echo \"waiting for $url/health\"; sleep 5",
             "  done",
             "done"]
    return "\n".join(lines)


def gate_script(pairs: list[tuple[str, int, str]], *, install: str | None, timeout_s: int = 600) -> str:
    """The preflight gate as a POSIX shell script (see the module contract). `install`: the pip requirement
    to install first (the torch-free tool), or None when specctl is on PATH."""
    urls = list(dict.fromkeys([u for u, _, _ in pairs] + [d for _, _, d in pairs]))
    lines = ["set -eu"]
    if install:
        lines.append(f"pip install --quiet --no-cache-dir {shlex.quote(install)}")
    lines.append(wait_health_command(urls))
    for p, boot, d in pairs:
        lines.append(f"specctl preflight --prefill {shlex.quote(p)} --bootstrap-port {boot} --decode {shlex.quote(d)} "
                     f"--timeout {timeout_s}")
    return "\n".join(lines) + "\n"


def offline_env() -> list[dict[str, Any]]:
    """Environment every exported engine and router gets: no model hub at run time."""
    return [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"}]
