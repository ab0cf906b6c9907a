"""A deployment as one RoleBasedGroup (`workloads.x-k8s.io/v1alpha2`, sgl-project/rbg): router, prefill and
decode roles.

Contract: `rbg_manifest(plan) -> str` (YAML: the RoleBasedGroup, then the adaptive-config ConfigMap when the
engines read one). An engine role is a `standalonePattern` (one pod per instance) or, when an instance spans
several nodes, a `leaderWorkerPattern` of `size` = nodes whose processes read RBG's RBG_LWP_LEADER_ADDRESS,
RBG_LWP_WORKER_INDEX and RBG_LWP_GROUP_SIZE. `replicas` = the role's instance count. The router role depends
on prefill and decode and runs the preflight gate as an init container. Pods are addressed through RBG's
per-role headless service `s-{group}-{role}`: a standalone pod is `{group}-{role}-{i}`, a leader
`{group}-{role}-{i}-0`.
"""

from __future__ import annotations

from typing import Any

from specctl.schemas.platforms import kubernetes as k8s
from specctl.schemas.platforms.plan import Plan, router_argv
from specctl.schemas.platforms.yamltext import Note, dump_all

API_VERSION = "workloads.x-k8s.io/v1alpha2"
LEADER = "$(RBG_LWP_LEADER_ADDRESS)"
RANK = "$(RBG_LWP_WORKER_INDEX)"
SIZE = "$(RBG_LWP_GROUP_SIZE)"


def pod_host(plan: Plan, role: str, index: int) -> str:
    rp = plan.roles[role]
    pod = f"{plan.name}-{role}-{index}" + ("-0" if rp.nodes > 1 else "")
    return f"{pod}.s-{plan.name}-{role}"


def _engine_role(plan: Plan, role: str) -> dict[str, Any]:
    rp = plan.roles[role]
    labels = {"app": plan.name, "role": role}
    out: dict[str, Any] = {"name": role, "replicas": Note(rp.replicas, f"{role} instances (the deployment's "
                                                                        f"roles.{role} list)")}
    if rp.nodes > 1:
        c = k8s.engine_container(plan, role, rp.launch(leader=LEADER, rank=RANK, size=SIZE,
                                                      dist_port=plan.options.dist_port))
        worker = k8s.engine_container(plan, role, rp.launch(leader=LEADER, rank=RANK, size=SIZE,
                                                           dist_port=plan.options.dist_port), probe=False)
        out["leaderWorkerPattern"] = {
            "size": Note(rp.nodes, "pods per instance (--nodes): one per node, tensor parallel across them"),
            "template": k8s.pod_template(plan, labels, k8s.pod_spec(plan, [worker])),
            "leaderTemplatePatch": {"spec": {"containers": [c]}},
        }
    else:
        c = k8s.engine_container(plan, role, rp.launch())
        out["standalonePattern"] = {"template": k8s.pod_template(plan, labels, k8s.pod_spec(plan, [c]))}
    return out


def _router_role(plan: Plan) -> dict[str, Any]:
    pre = plan.roles["prefill"]
    prefills = [(f"http://{pod_host(plan, 'prefill', i)}:{pre.port}", pre.bootstrap_port or 8998)
                for i in range(pre.replicas)]
    dec = plan.roles["decode"]
    decodes = [f"http://{pod_host(plan, 'decode', i)}:{dec.port}" for i in range(dec.replicas)]
    spec = k8s.pod_spec(plan, [k8s.router_container(plan, router_argv(plan, prefills, decodes, host="0.0.0.0"))],
                        init=[k8s.gate_container(plan, prefills, decodes)], engine=False)
    return {"name": "router", "replicas": 1, "dependencies": ["prefill", "decode"],
            "standalonePattern": {"template": k8s.pod_template(plan, {"app": plan.name, "role": "router"}, spec)}}


def rbg_documents(plan: Plan) -> list[Any]:
    roles = [_engine_role(plan, r) for r in plan.roles]
    if plan.pd:
        roles.insert(0, _router_role(plan))
    group = {"apiVersion": API_VERSION, "kind": "RoleBasedGroup",
             "metadata": {"name": plan.name, "namespace": k8s.namespace(plan)}, "spec": {"roles": roles}}
    cm = k8s.config_map(plan)
    return [group] + ([cm] if cm else [])


def rbg_manifest(plan: Plan) -> str:
    head = (f"RoleBasedGroup of deployment {plan.deployment.name!r}, written by `specctl export rbg`.\n"
            "Fill in the commented fields (or pass them as flags); check it with: specctl validate THIS_FILE\n"
            "The router starts after its init container `preflight` passes: kubectl logs POD -c preflight")
    return dump_all(rbg_documents(plan), header=head)
