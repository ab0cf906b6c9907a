"""The Kubernetes pieces every manifest shares: the engine container, the router's pod with its preflight
gate, the adaptive-config ConfigMap and the model volume.

Contract: plain dicts in the shapes of Kubernetes' core/v1 types (Container, PodTemplateSpec, ConfigMap),
with `yamltext.Note` on the values a user must fill in (image, GPU resource name, node selector, model
volume). The platform writers (rbg, lws, dynamo) place them; nothing here names a platform.
"""

from __future__ import annotations

from typing import Any

from specctl.schemas.platforms.plan import CONFIG_DIR, Plan, gate_pairs, gate_script, offline_env
from specctl.schemas.platforms.yamltext import Note

CONFIG_VOLUME = "specctl-config"
MODEL_VOLUME = "models"


def image_note(plan: Plan) -> Note:
    return Note(plan.options.image, "an image with SGLang (--image); the engines' argv run in it")


def config_map_name(plan: Plan) -> str:
    return f"{plan.name}-config"


def config_map(plan: Plan) -> dict[str, Any] | None:
    """The adaptive JSON files the engines read (--speculative-adaptive-config), or None when there are none."""
    if not plan.files:
        return None
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(plan), "namespace": namespace(plan)},
            "data": dict(plan.files)}


def namespace(plan: Plan) -> Note:
    return Note(plan.options.namespace, "the namespace to deploy in (--namespace)")


def volumes(plan: Plan) -> list[Any]:
    out: list[Any] = []
    if plan.files:
        out.append({"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(plan)}})
    if plan.model_dirs:
        out.append(Note({"name": MODEL_VOLUME,
                         "persistentVolumeClaim": {"claimName": plan.options.model_claim, "readOnly": True}},
                        f"the claim holding the model weights, mounted at {plan.model_dirs[0]} "
                        "(--model-claim, --model-dir)"))
    out.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    return out


def volume_mounts(plan: Plan) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if plan.files:
        out.append({"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True})
    if plan.model_dirs:
        out.append({"name": MODEL_VOLUME, "mountPath": plan.model_dirs[0], "readOnly": True})
    out.append({"name": "dshm", "mountPath": "/dev/shm"})
    return out


def gpu_resources(plan: Plan) -> dict[str, Any]:
    gpus = plan.gpus
    if gpus <= 0:
        return {}
    res = {plan.options.gpu_resource: str(gpus)}
    return {"limits": Note(res, "GPUs per pod (--gpus); the resource name is the cluster's device plugin's "
                                "(--gpu-resource, e.g. nvidia.com/gpu, amd.com/gpu)"),
            "requests": dict(res)}


def health_probe(port_name: str) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": port_name}, "periodSeconds": 10, "failureThreshold": 3}


def engine_container(plan: Plan, role: str, argv: list[str], *, probe: bool = True) -> dict[str, Any]:
    """One engine process (a leader or a worker of a multi-node instance: only the leader serves HTTP)."""
    rp = plan.roles[role]
    ports: list[dict[str, Any]] = [{"name": "http", "containerPort": rp.port}]
    if rp.bootstrap_port is not None:
        ports.append({"name": "bootstrap", "containerPort": rp.bootstrap_port})
    c: dict[str, Any] = {"name": "sglang", "image": image_note(plan), "command": argv, "env": offline_env(),
                         "ports": ports}
    if probe:
        c["readinessProbe"] = health_probe("http")
        # A model takes minutes to load: readiness gates traffic, startup bounds the load.
        c["startupProbe"] = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                             "failureThreshold": 180}
    res = gpu_resources(plan)
    if res:
        c["resources"] = res
    c["volumeMounts"] = volume_mounts(plan)
    return c


def node_selector(plan: Plan) -> Note:
    sel = dict(plan.options.node_selector)
    return Note(sel, "nodes to run on (--node-selector KEY=VALUE, repeatable), e.g. a GPU type label")


def pod_spec(plan: Plan, containers: list[dict[str, Any]], *, init: list[dict[str, Any]] | None = None,
             engine: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": node_selector(plan)}
    if init:
        spec["initContainers"] = init
    spec["containers"] = containers
    if engine:
        spec["volumes"] = volumes(plan)
    return spec


def pod_template(plan: Plan, labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"labels": labels}, "spec": spec}


def gate_container(plan: Plan, prefills: list[tuple[str, int]], decodes: list[str]) -> dict[str, Any]:
    """The init container that holds the router back until `specctl preflight` passes on every pair (its rows
    go to this container's log: kubectl logs POD -c preflight)."""

    script = gate_script(gate_pairs(prefills, decodes), install=plan.options.specctl_requirement)
    return {"name": "preflight",
            "image": Note(plan.options.tool_image, "any image with python3 and pip (--tool-image); it installs the "
                                                   f"torch-free tool: pip install {plan.options.specctl_requirement}"),
            "command": ["sh", "-c", script], "env": offline_env()}


def router_container(plan: Plan, argv: list[str]) -> dict[str, Any]:
    image = plan.options.router_image or plan.options.image
    return {"name": "router",
            "image": Note(image, f"an image with the {plan.router_kind} router (--router-image)"),
            "command": argv, "env": offline_env(),
            "ports": [{"name": "http", "containerPort": plan.router_port}],
            "readinessProbe": health_probe("http")}
