"""A deployment as NVIDIA Dynamo's DynamoGraphDeployment (`nvidia.com/v1alpha1`): a Frontend and a prefill and
a decode worker running `python3 -m dynamo.sglang` with SGLang's flags.

Contract: `dynamo_manifest(plan) -> str` (YAML: the DynamoGraphDeployment and a ConfigMap). A worker's args
are the role's SGLang argv after the launcher; `replicas` = the role's instance count, `resources.limits.gpu`
= GPUs per node, `multinode.nodeCount` = nodes per instance (Dynamo's operator adds SGLang's
--dist-init-addr/--nnodes/--node-rank to multi-node workers; the argv carries --tp-size). Dynamo's Frontend
routes, so there is no SGLang router. Dynamo workers serve no SGLang HTTP API, so `specctl preflight` cannot
reach them: the gate is the Frontend's init container running `specctl validate` on the two workers' exact
commands (shipped in the ConfigMap), which refuses a mismatched pair by the same rules before the Frontend
starts. Probes are left to the operator (it probes each component's /health on its system port).
"""

from __future__ import annotations

import shlex
from typing import Any

from specctl.schemas.platforms import kubernetes as k8s
from specctl.schemas.platforms.plan import CONFIG_DIR, Plan, offline_env
from specctl.schemas.platforms.yamltext import Note, dump_all

API_VERSION = "nvidia.com/v1alpha1"
LAUNCH = ["python3", "-m", "dynamo.sglang"]


def worker_args(plan: Plan, role: str) -> list[str]:
    """The role's SGLang flags (its argv after `python -m sglang.launch_server`)."""
    argv = plan.roles[role].launch(distributed=False)
    return argv[3:]


def _command_file(plan: Plan, role: str) -> str:
    """The flags the worker runs, as the SGLang server command `specctl validate` reads."""
    argv = ["python3", "-m", "sglang.launch_server", *worker_args(plan, role)]
    return (f"#!/bin/sh\n# the SGLang flags of the {role} worker (python3 -m dynamo.sglang runs them)\n"
            + " ".join(shlex.quote(a) for a in argv) + "\n")


def _worker(plan: Plan, role: str) -> dict[str, Any]:
    rp = plan.roles[role]
    main: dict[str, Any] = {"image": k8s.image_note(plan), "command": LAUNCH, "args": worker_args(plan, role),
                            "env": offline_env(), "volumeMounts": k8s.volume_mounts(plan)}
    out: dict[str, Any] = {"componentType": "worker", "subComponentType": role,
                           "replicas": Note(rp.replicas, f"{role} instances (the deployment's roles.{role} list)")}
    if plan.gpus > 0:
        limits: dict[str, Any] = {"gpu": str(plan.gpus)}
        if plan.options.gpu_resource != "nvidia.com/gpu":
            limits["gpuType"] = plan.options.gpu_resource
        out["resources"] = {"limits": Note(limits, "GPUs per node (--gpus; --gpu-resource for a non-NVIDIA type)")}
    if rp.nodes > 1:
        out["multinode"] = {"nodeCount": Note(rp.nodes, "nodes per instance (--nodes)")}
    out["extraPodSpec"] = {"nodeSelector": k8s.node_selector(plan), "volumes": k8s.volumes(plan),
                           "mainContainer": main}
    return out


def _frontend(plan: Plan) -> dict[str, Any]:
    files = [f"{CONFIG_DIR}/{r}.sh" for r in plan.roles]
    script = (f"set -eu\npip install --quiet --no-cache-dir {shlex.quote(plan.options.specctl_requirement)}\n"
              f"specctl validate {' '.join(files)}\n")
    gate = {"name": "preflight",
            "image": Note(plan.options.tool_image, "any image with python3 and pip (--tool-image)"),
            "command": ["sh", "-c", script], "env": offline_env(),
            "volumeMounts": [{"name": k8s.CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}]}
    return {"componentType": "frontend", "replicas": 1,
            "extraPodSpec": {"nodeSelector": k8s.node_selector(plan), "initContainers": [gate],
                             "volumes": [{"name": k8s.CONFIG_VOLUME,
                                          "configMap": {"name": k8s.config_map_name(plan)}}],
                             "mainContainer": {"image": k8s.image_note(plan)}}}


def dynamo_documents(plan: Plan) -> list[Any]:
    services: dict[str, Any] = {"Frontend": _frontend(plan)}
    for role in plan.roles:
        services[role] = _worker(plan, role)
    dgd = {"apiVersion": API_VERSION, "kind": "DynamoGraphDeployment",
           "metadata": {"name": plan.name, "namespace": k8s.namespace(plan)},
           "spec": {"backendFramework": "sglang", "services": services}}
    data = dict(plan.files)
    for role in plan.roles:
        data[f"{role}.sh"] = _command_file(plan, role)
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": k8s.config_map_name(plan), "namespace": k8s.namespace(plan)}, "data": data}
    return [dgd, cm]


def dynamo_manifest(plan: Plan) -> str:
    head = (f"DynamoGraphDeployment of deployment {plan.deployment.name!r}, written by `specctl export dynamo`.\n"
            "Fill in the commented fields (or pass them as flags); check it with: specctl validate THIS_FILE\n"
            "The Frontend starts after its init container `preflight` passes: kubectl logs POD -c preflight")
    return dump_all(dynamo_documents(plan), header=head)
