"""A deployment as LeaderWorkerSets (`leaderworkerset.x-k8s.io/v1`, kubernetes-sigs/lws): one per engine role,
a Service in front of each role's leaders, and the router as a Deployment.

Contract: `lws_manifest(plan) -> str` (YAML documents). A LeaderWorkerSet `{name}-{role}` has `replicas` =
the role's instance count and `leaderWorkerTemplate.size` = nodes per instance; multi-node processes read
LWS_LEADER_ADDRESS, LWS_WORKER_INDEX and LWS_GROUP_SIZE. Leaders are addressed one by one through the headless
service LWS creates under the set's name (`{set}-{i}.{set}`): a PD router must reach the prefill whose
bootstrap port it names, so it lists every leader rather than a load-balanced Service; the `{set}-leader`
Service selects the leaders (worker index 0) for clients and monitoring. The router Deployment runs the
preflight gate as an init container.
"""

from __future__ import annotations

from typing import Any

from specctl.schemas.platforms import kubernetes as k8s
from specctl.schemas.platforms.plan import Plan, router_argv
from specctl.schemas.platforms.yamltext import Note, dump_all

API_VERSION = "leaderworkerset.x-k8s.io/v1"
LEADER = "$(LWS_LEADER_ADDRESS)"
RANK = "$(LWS_WORKER_INDEX)"
SIZE = "$(LWS_GROUP_SIZE)"
SET_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


def set_name(plan: Plan, role: str) -> str:
    return f"{plan.name}-{role}"


def leader_host(plan: Plan, role: str, index: int) -> str:
    s = set_name(plan, role)
    return f"{s}-{index}.{s}"


def _set(plan: Plan, role: str) -> dict[str, Any]:
    rp = plan.roles[role]
    labels = {"app": plan.name, "role": role}
    dist = plan.options.dist_port
    leader = k8s.engine_container(plan, role, rp.launch(leader=LEADER, rank=RANK, size=SIZE, dist_port=dist))
    template: dict[str, Any] = {"size": Note(rp.nodes, "pods per instance (--nodes): one per node, tensor "
                                                       "parallel across them")}
    if rp.nodes > 1:
        worker = k8s.engine_container(plan, role, rp.launch(leader=LEADER, rank=RANK, size=SIZE, dist_port=dist),
                                      probe=False)
        template["leaderTemplate"] = k8s.pod_template(plan, labels, k8s.pod_spec(plan, [leader]))
        template["workerTemplate"] = k8s.pod_template(plan, labels, k8s.pod_spec(plan, [worker]))
    else:
        template["workerTemplate"] = k8s.pod_template(plan, labels, k8s.pod_spec(plan, [leader]))
    return {"apiVersion": API_VERSION, "kind": "LeaderWorkerSet",
            "metadata": {"name": set_name(plan, role), "namespace": k8s.namespace(plan)},
            "spec": {"replicas": Note(rp.replicas, f"{role} instances (the deployment's roles.{role} list)"),
                     "leaderWorkerTemplate": template}}


def _leader_service(plan: Plan, role: str) -> dict[str, Any]:
    rp = plan.roles[role]
    ports: list[dict[str, Any]] = [{"name": "http", "port": rp.port, "targetPort": rp.port}]
    if rp.bootstrap_port is not None:
        ports.append({"name": "bootstrap", "port": rp.bootstrap_port, "targetPort": rp.bootstrap_port})
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"{set_name(plan, role)}-leader", "namespace": k8s.namespace(plan)},
            "spec": {"selector": {SET_LABEL: set_name(plan, role), WORKER_LABEL: "0"}, "ports": ports}}


def _router(plan: Plan) -> list[dict[str, Any]]:
    pre, dec = plan.roles["prefill"], plan.roles["decode"]
    prefills = [(f"http://{leader_host(plan, 'prefill', i)}:{pre.port}", pre.bootstrap_port or 8998)
                for i in range(pre.replicas)]
    decodes = [f"http://{leader_host(plan, 'decode', i)}:{dec.port}" for i in range(dec.replicas)]
    labels = {"app": plan.name, "role": "router"}
    spec = k8s.pod_spec(plan, [k8s.router_container(plan, router_argv(plan, prefills, decodes, host="0.0.0.0"))],
                        init=[k8s.gate_container(plan, prefills, decodes)], engine=False)
    name = f"{plan.name}-router"
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": name, "namespace": k8s.namespace(plan)},
                  "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                           "template": k8s.pod_template(plan, labels, spec)}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": k8s.namespace(plan)},
               "spec": {"selector": labels, "ports": [{"name": "http", "port": plan.router_port,
                                                        "targetPort": plan.router_port}]}}
    return [deployment, service]


def lws_documents(plan: Plan) -> list[Any]:
    docs: list[Any] = []
    for role in plan.roles:
        docs += [_set(plan, role), _leader_service(plan, role)]
    if plan.pd:
        docs += _router(plan)
    cm = k8s.config_map(plan)
    return docs + ([cm] if cm else [])


def lws_manifest(plan: Plan) -> str:
    head = (f"LeaderWorkerSets of deployment {plan.deployment.name!r}, written by `specctl export lws`.\n"
            "Fill in the commented fields (or pass them as flags); check it with: specctl validate THIS_FILE\n"
            "The router starts after its init container `preflight` passes: kubectl logs POD -c preflight")
    return dump_all(lws_documents(plan), header=head)
