"""A deployment as one Slurm batch script: `srun` steps for prefill and decode, the preflight gate, the router.

Contract: `slurm_script(plan, *, partition=None, time=None, spread=False) -> str` (bash, for `sbatch`). The
script writes the files the engines read into its work directory (`$SPECCTL_WORKDIR`, default
`./{name}-$SLURM_JOB_ID`): the deployment (`deploy.yaml`: specctl's builtin engine serves it with
`specctl serve --role R -c deploy.yaml`, and preflight checks every server against it) and the adaptive JSON
of SGLang's argv (the role argv `specctl export sglang` prints). It starts every engine instance as an
`srun` step (output in `{role}-{i}.log`), waits for each /health while checking that no step has died, runs
`specctl preflight` on every prefill/decode pair (its rows land in the job's output), and starts the router
only when that exits 0; otherwise it stops the steps and exits 3. Once the router runs, the first step to
exit stops the others and ends the job with that step's status (3 when it was 0: a server must not stop by
itself). Without `spread` every step runs on the job's first node, at the deployment's addresses (one GPU
node, or a CPU test); with `spread` (or instances of several nodes) each instance gets its own nodes, binds
0.0.0.0 and is reached by node name, and a multi-node instance is one step of one task per node whose rank
is Slurm's SLURM_PROCID. The tools (python3, specctl, the router, SGLang) must be on the nodes' PATH:
`sbatch` passes the submitting shell's environment.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from specctl.schemas.platforms.plan import Plan, drop_flag, gate_pairs, router_argv, set_flag

_SAFE = re.compile(r"^[A-Za-z0-9_./:=@%+,-]+$")


def word(text: str) -> str:
    """One shell word; `${...}` references stay live (double quotes), everything else is literal."""
    if _SAFE.match(text):
        return text
    if "${" in text:
        return '"' + re.sub(r'(["\\`])', r"\\\1", text) + '"'
    return shlex.quote(text)


def _heredoc(name: str, text: str) -> list[str]:
    tag = "SPECCTL_EOF"
    return [f"cat > {name} <<'{tag}'", text.rstrip("\n"), tag]


def _yaml(data: dict[str, Any]) -> str:
    import yaml  # type: ignore[import-untyped, unused-ignore]

    return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110))


def _placements(plan: Plan, spread: bool) -> tuple[int, dict[tuple[str, int], int]]:
    """(nodes the job needs, first node index of each instance)."""
    multi = any(rp.nodes > 1 for rp in plan.roles.values())
    if not (spread or multi):
        return 1, {(r, i): 0 for r, rp in plan.roles.items() for i in range(rp.replicas)}
    out: dict[tuple[str, int], int] = {}
    k = 0
    for r, rp in plan.roles.items():
        for i in range(rp.replicas):
            out[(r, i)] = k
            k += rp.nodes
    return k, out


def slurm_script(plan: Plan, *, partition: str | None = None, time: str | None = None, spread: bool = False) -> str:
    """The batch script (see the module contract)."""


    nodes, place = _placements(plan, spread)
    local = nodes == 1
    builtin = plan.deployment.engine != "sglang"
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={plan.name}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --output={plan.name}-%j.out"]
    lines.append(f"#SBATCH --partition={partition}" if partition else
                 "# #SBATCH --partition=NAME   (the partition to run in: --partition)")
    lines.append(f"#SBATCH --time={time}" if time else "# #SBATCH --time=HH:MM:SS   (a time limit: --time)")
    if plan.gpus:
        per_node = plan.gpus * (max(rp.replicas for rp in plan.roles.values()) * len(plan.roles) if local else 1)
        lines.append(f"#SBATCH --gpus-per-node={per_node}   # GPUs per node (--gpus per instance)")
    lines += [
        f"# Deployment {plan.deployment.name!r}, written by `specctl export slurm`. Submit: sbatch THIS_FILE",
        "# The router starts only after `specctl preflight` passes on every prefill/decode pair (rows below in",
        "# the job's output); when any part stops, the job stops the others.",
        "set -u",
        f'WORKDIR="${{SPECCTL_WORKDIR:-$PWD/{plan.name}-$SLURM_JOB_ID}}"',
        'mkdir -p "$WORKDIR" && cd "$WORKDIR" || exit 2',
        "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1",
        'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
    ]
    lines += _heredoc("deploy.yaml", _yaml(plan.deployment.raw))
    for name, text in plan.files.items():
        lines += _heredoc(name, text)
    lines += [
        "PIDS=()",
        "stop_all() {",
        '  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done',
        "  wait",
        "}",
        "alive() {",
        '  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done',
        "}",
        "show_logs() { for f in *.log; do echo \"== $f (last lines)\"; tail -n 20 \"$f\"; done; }",
        "wait_health() {",
        "  until python3 -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=5)' \"$1/health\""
        " 2>/dev/null; do",
        '    if ! alive; then echo "specctl: a server exited before $1 was healthy; stopping the job"; show_logs;'
        " stop_all; exit 3; fi",
        "    sleep 2",
        "  done",
        "}",
    ]
    prefills: list[tuple[str, int]] = []
    decodes: list[str] = []
    urls: list[str] = []
    for role, rp in plan.roles.items():
        for i in range(rp.replicas):
            k = place[(role, i)]
            host = "127.0.0.1" if local else f"${{NODES[{k}]}}"
            argv = _engine_argv(plan, role, i, builtin=builtin, local=local)
            if not local and not builtin:  # an instance has its node(s) to itself: all their GPUs
                argv = drop_flag(set_flag(argv, "--host", "0.0.0.0"), "--base-gpu-id")
            inst = plan.deployment.instances(role)[i]
            url = f"http://{_connectable(inst.host or '127.0.0.1') if local else host}:{inst.port}"
            urls.append(url)
            if role == "prefill":
                prefills.append((url, inst.bootstrap_port or rp.bootstrap_port or 8998))
            elif role == "decode":
                decodes.append(url)
            lines.append(f"echo \"specctl: starting {role} {i}\"")
            lines.append(_srun(plan, role, i, k, argv, local=local))
            lines.append("PIDS+=($!)")
    lines += [f"wait_health {word(u)}" for u in urls]
    if plan.pd:
        for p, boot, d in gate_pairs(prefills, decodes):
            # specctl's own prefill pairs over ZeroMQ on its bootstrap port: preflight asks it over HTTP instead
            boot_arg = "" if builtin else f" --bootstrap-port {boot}"
            lines += [f"if ! specctl preflight --prefill {word(p)}{boot_arg} --decode {word(d)} -c deploy.yaml "
                      "--timeout 120; then",
                      '  echo "specctl: preflight refused the pair: stopping the job before the router starts"',
                      "  stop_all; exit 3", "fi"]
        rhost = "127.0.0.1" if local else "0.0.0.0"
        if local and "router" in plan.deployment.roles:
            rhost = plan.deployment.role("router").host or "127.0.0.1"
        rargv = router_argv(plan, prefills, decodes, host=rhost)
        rurl = f"http://{_connectable(rhost) if local else '${NODES[0]}'}:{plan.router_port}"
        lines += ['echo "specctl: preflight passed; starting the router"',
                  f"srun --overlap --nodes=1 --ntasks=1 -w \"${{NODES[0]}}\" --output=router.log "
                  f"{' '.join(word(a) for a in rargv)} &",
                  "PIDS+=($!)",
                  f"wait_health {word(rurl)}",
                  f'echo "specctl: router ready on port {plan.router_port}"']
    lines += ["wait -n", "status=$?",
              'echo "specctl: a part of the deployment exited (status $status); stopping the others"',
              "show_logs", "stop_all",
              'exit $(( status == 0 ? 3 : status ))']
    return "\n".join(lines) + "\n"


def _engine_argv(plan: Plan, role: str, index: int, *, builtin: bool, local: bool) -> list[str]:
    rp = plan.roles[role]
    if builtin:
        argv = ["specctl", "serve", "--role", role, "-c", "deploy.yaml"]
        if index:
            argv += ["--instance", str(index)]
        if not local:
            argv += ["--set", f"roles.{role}.host=0.0.0.0" if rp.replicas == 1 else
                     f"roles.{role}[{index}].host=0.0.0.0"]
        return argv
    argv = rp.launch(leader="${LEADER}", rank="${SLURM_PROCID}", size=str(rp.nodes),
                     dist_port=plan.options.dist_port)
    if index and rp.replicas > 1:
        inst = plan.deployment.instances(role)[index]
        argv = set_flag(argv, "--port", str(inst.port))
        if role == "prefill" and inst.bootstrap_port is not None:
            argv = set_flag(argv, "--disaggregation-bootstrap-port", str(inst.bootstrap_port))
    return argv


def _connectable(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


def _srun(plan: Plan, role: str, index: int, first_node: int, argv: list[str], *, local: bool) -> str:
    rp = plan.roles[role]
    log = f"{role}-{index}.log"
    if rp.nodes > 1 and not local:
        nodes = ",".join(f"${{NODES[{first_node + j}]}}" for j in range(rp.nodes))
        inner = " ".join(shlex.quote(a) if "${" not in a else '"' + a.replace("${", "$").replace("}", "") + '"'
                         for a in argv)
        return (f"LEADER=\"${{NODES[{first_node}]}}\" srun --overlap --nodes={rp.nodes} --ntasks={rp.nodes} "
                f"--ntasks-per-node=1 -w \"{nodes}\" --output={log} --export=ALL,LEADER bash -c {shlex.quote(inner)} &")
    return f"srun --overlap --nodes=1 --ntasks=1 -w \"${{NODES[{first_node}]}}\" --output={log} " + \
        " ".join(word(a) for a in argv) + " &"
