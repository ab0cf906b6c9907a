"""`specctl export rbg|lws|dynamo` against real schemas, and the manifests read back by validate/import.

Schemas: Kubernetes' own (the `kubernetes-validate` package's JSON schemas of Kubernetes 1.37, strict: no
unknown field) for every built-in object (ConfigMap, Service, Deployment) and for the pod templates and
containers embedded in the custom resources (core/v1 PodTemplateSpec and Container, the types RBG, LWS and
Dynamo embed). The custom resources themselves are checked against their CRDs' OpenAPI schemas when
SPECCTL_CRD_DIR holds them (rbg.yaml, lws.yaml, dgd.yaml: the projects' CRD files), else `shared/k8s-crds/` beside
the checkout (where the steering repository may keep such data); the tree itself ships none.
SGLang 0.5.23's own parser (tests/sglang_oracle.py, a child process) must accept every engine container's
args. Round trip: a manifest validates to the same findings as the `export sglang` commands of the same
deployment, on the manifest's lines.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from specctl.cli.main import app
from specctl.schemas.platforms.manifest import read_manifest
from specctl.schemas.validator import Validator

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("rbg", "lws", "dynamo")
K8S_VERSION = "1.37"
runner = CliRunner()

TWO_DECODES = """version: 1
name: two-decodes
engine: sglang
model: {target: /models/Meta-Llama-3.1-8B-Instruct, dtype: bfloat16}
speculative: {algorithm: draft, draft: /models/Llama-3.2-1B-Instruct, num_steps: 3}
cache: {page_size: 16, max_tokens: 262144}
serve: {max_batch_size: 64}
roles:
  prefill: {host: 10.0.0.1, port: 30001, bootstrap_port: 8998}
  decode: [{host: 10.0.0.2, port: 30002}, {host: 10.0.0.3, port: 30002}]
  router: {host: 0.0.0.0, port: 30000}
"""


def export(kind: str, config: str, *extra: str) -> str:
    res = runner.invoke(app, ["export", kind, "-c", config, *extra])
    assert res.exit_code == 0, res.output
    return res.stdout


def cases(tmp: Path) -> list[tuple[str, list[str]]]:
    two = tmp / "two-decodes.yaml"
    two.write_text(TWO_DECODES)
    return [("llama-3.1-8b-pd", []), ("tiny-pd", []), ("llama-3.1-8b-pd", ["--gpus", "8", "--nodes", "2"]),
            (str(two), ["--namespace", "llm", "--node-selector", "gpu=h100", "--router", "sglang-router"])]


@cache
def k8s_schema(type_file: str) -> Any:
    """A validator for one Kubernetes type from kubernetes-validate's schemas (strict)."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a test dependency")
    from importlib.resources import files

    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    base = files(kv) / "kubernetes-json-schema" / f"v{K8S_VERSION}.0-local-strict"
    schema = json.loads((base / f"{type_file}.json").read_text())
    defs = json.loads((base / "_definitions.json").read_text())
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return Draft202012Validator(schema, registry=registry)


def check(type_file: str, obj: Any, where: str) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in k8s_schema(type_file).iter_errors(obj)]
    assert not errors, f"{where} is not a valid {type_file}: {errors[:5]}"


def embedded(doc: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(schema type, object, where) of every Kubernetes type a custom resource embeds."""
    out: list[tuple[str, Any, str]] = []
    if doc["kind"] == "RoleBasedGroup":
        for role in doc["spec"]["roles"]:
            for pattern in ("standalonePattern", "leaderWorkerPattern"):
                p = role.get(pattern) or {}
                if "template" in p:
                    out.append(("podtemplatespec-v1", p["template"], f"{role['name']}.{pattern}.template"))
                if "leaderTemplatePatch" in p:
                    for c in p["leaderTemplatePatch"]["spec"]["containers"]:
                        out.append(("container-v1", c, f"{role['name']}.leaderTemplatePatch"))
    elif doc["kind"] == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            if key in t:
                out.append(("podtemplatespec-v1", t[key], f"{doc['metadata']['name']}.{key}"))
    elif doc["kind"] == "DynamoGraphDeployment":
        for name, svc in doc["spec"]["services"].items():
            extra = dict(svc["extraPodSpec"])
            main = extra.pop("mainContainer")
            # the operator names the main container and fills in the containers list itself
            out.append(("container-v1", {"name": "main", **main}, f"{name}.extraPodSpec.mainContainer"))
            out.append(("podspec-v1", {**extra, "containers": []}, f"{name}.extraPodSpec"))
    return out


def crd_dir() -> str | None:
    """SPECCTL_CRD_DIR, else shared/k8s-crds beside the checkout, when either exists."""
    folder = os.environ.get("SPECCTL_CRD_DIR")
    if folder:
        return folder
    shared = Path(__file__).resolve().parents[2] / "shared" / "k8s-crds"
    return str(shared) if shared.is_dir() else None


@cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    folder = crd_dir()
    if not folder:
        return None
    for f in Path(folder).glob("*.yaml"):
        crd = yaml.load(f.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe loader
        if crd.get("kind") != "CustomResourceDefinition" or crd["spec"]["names"]["kind"] != kind:
            continue
        group, version = api_version.split("/")
        for v in crd["spec"]["versions"]:
            if crd["spec"]["group"] == group and v["name"] == version:
                return dict(v["schema"]["openAPIV3Schema"])
    return None


@pytest.mark.parametrize("kind", KINDS)
def test_every_object_validates_against_kubernetes_schemas(kind: str, tmp_path: Path) -> None:
    import kubernetes_validate

    for config, extra in cases(tmp_path):
        docs = [d for d in yaml.safe_load_all(export(kind, config, *extra)) if d]
        assert docs
        for doc in docs:
            where = f"{kind} {config} {extra} {doc['kind']}"
            if doc["apiVersion"] in ("v1", "apps/v1"):
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
                continue
            found = embedded(doc)
            assert found, where
            for type_file, obj, place in found:
                check(type_file, obj, f"{where} {place}")
            schema = crd_schema(doc["apiVersion"], doc["kind"])
            if schema is not None:
                from jsonschema import Draft7Validator

                errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                          for e in Draft7Validator(schema).iter_errors(doc)]
                assert not errors, f"{where} fails its CRD schema: {errors[:5]}"


@pytest.mark.skipif(crd_dir() is None, reason="no CRD files of RBG, LWS and Dynamo (SPECCTL_CRD_DIR, or "
                    "shared/k8s-crds beside the checkout): the tree may not ship files of other projects")
@pytest.mark.parametrize("kind", KINDS)
def test_custom_resources_have_their_crd_schema(kind: str) -> None:
    docs = [d for d in yaml.safe_load_all(export(kind, "llama-3.1-8b-pd")) if d]
    custom = [d for d in docs if d["apiVersion"] not in ("v1", "apps/v1")]
    assert custom
    missing = [d["kind"] for d in custom if crd_schema(d["apiVersion"], d["kind"]) is None]
    if missing:
        pytest.skip(f"{crd_dir()} has no CRD of {', '.join(missing)}")


def test_multi_node_roles_use_each_platforms_group_variables() -> None:
    rbg = export("rbg", "llama-3.1-8b-pd", "--gpus", "8", "--nodes", "2")
    lws = export("lws", "llama-3.1-8b-pd", "--gpus", "8", "--nodes", "2")
    dgd = yaml.safe_load_all(export("dynamo", "llama-3.1-8b-pd", "--gpus", "8", "--nodes", "2"))
    for text, prefix in ((rbg, "RBG_LWP"), (lws, "LWS")):
        for var in ("LEADER_ADDRESS", "WORKER_INDEX", "GROUP_SIZE"):
            assert f"$({prefix}_{var})" in text
    services = next(d for d in dgd if d["kind"] == "DynamoGraphDeployment")["spec"]["services"]
    assert services["decode"]["multinode"] == {"nodeCount": 2}
    args = services["decode"]["extraPodSpec"]["mainContainer"]["args"]
    assert args[args.index("--tp-size") + 1] == "16" and "--nnodes" not in args  # the operator adds those


def test_user_fields_are_flags_with_comments() -> None:
    text = export("rbg", "llama-3.1-8b-pd", "--image", "reg/sglang:x", "--namespace", "prod", "--node-selector",
                  "gpu=h100", "--gpu-resource", "amd.com/gpu")
    for needle in ("image: reg/sglang:x  # ", "namespace: prod  # ", "(--node-selector", "amd.com/gpu"):
        assert needle in text
    doc = next(yaml.safe_load_all(text))
    decode = next(r for r in doc["spec"]["roles"] if r["name"] == "decode")
    spec = decode["standalonePattern"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "h100"}
    assert spec["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "1"}


@pytest.mark.parametrize(("argv", "needle"), [
    (["--router", "nginx"], "router"),
    (["--node-selector", "gpu"], "KEY=VALUE"),
    (["--nodes", "2", "--gpus", "0"], "GPUs"),
])
def test_bad_flags_are_usage_errors(argv: list[str], needle: str) -> None:
    res = runner.invoke(app, ["export", "rbg", "-c", "llama-3.1-8b-pd", *argv])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output


def test_instances_that_differ_beyond_their_address_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(TWO_DECODES.replace("{host: 10.0.0.3, port: 30002}",
                                     "{host: 10.0.0.3, port: 30002, serve: {max_batch_size: 32}}"))
    res = runner.invoke(app, ["export", "lws", "-c", str(f)])
    assert res.exit_code == 2 and "roles.decode[1]" in res.output


def findings(paths: list[str]) -> Counter[tuple[str, str, str]]:
    report = Validator().validate_paths(paths)
    return Counter((f.code, f.path.split(": ", 1)[-1], f.message) for r in report.files for f in r.findings)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", ["llama-3.1-8b-pd", "tiny-pd"])
def test_a_manifest_validates_to_the_findings_of_its_sglang_commands(kind: str, config: str, tmp_path: Path) -> None:
    manifest = tmp_path / f"{kind}.yaml"
    manifest.write_text(export(kind, config))
    res = runner.invoke(app, ["export", "sglang", "-c", config, "--out", str(tmp_path / "sh")])
    assert res.exit_code == 0, res.output
    got = findings([str(manifest)])
    want = findings([str(tmp_path / "sh" / "prefill.sh"), str(tmp_path / "sh" / "decode.sh")])
    assert got == want
    deployment = Validator().validate_paths([config]).files[0]
    # SGLang itself refuses specctl's builtin models (SGL300 on every exported command); everything else a
    # manifest's commands give is what the deployment gives.
    refusal = {(c, m) for c, _, m in got if c == "SGL300"}
    assert all("specctl builtin model" in m for _, m in refusal) and (not refusal or config == "tiny-pd")
    assert {c for c, _, _ in got} - {"SGL300"} == {f.code for f in deployment.findings}


@pytest.mark.parametrize("kind", KINDS)
def test_findings_point_at_the_manifests_line(kind: str, tmp_path: Path) -> None:
    lines = export(kind, "llama-3.1-8b-pd").splitlines()
    # the decode container's --page-size value: the first one after decode's --disaggregation-mode
    start = next(i for i, line in enumerate(lines)
                 if line.strip() == "- decode" and "disaggregation-mode" in lines[i - 1])
    flag = next(i for i in range(start, len(lines)) if lines[i].strip() == "- --page-size")
    lines[flag + 1] = lines[flag + 1].replace('"16"', '"32"')
    f = tmp_path / "m.yaml"
    f.write_text("\n".join(lines) + "\n")
    result = Validator().validate_paths([str(f)]).files[0]
    errors = [x for x in result.findings if x.severity == "error"]
    assert errors, result.findings
    hit = [x for x in errors if "decode" in x.path.split(": ")[0] and x.line in (flag + 1, flag + 2)]
    assert hit, errors
    res = runner.invoke(app, ["validate", str(f)])
    assert res.exit_code == 1 and f"{f}:{hit[0].line}:" in res.output


def test_a_manifest_without_sglang_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text("apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: x}\nspec:\n"
                 "  leaderWorkerTemplate:\n    workerTemplate:\n      spec:\n        containers:\n"
                 "          - {name: a, image: b, command: [/entrypoint.sh]}\n")
    result = Validator().validate_paths([str(f)]).files[0]
    assert [x.code for x in result.findings] == ["MAN001"]


@pytest.mark.parametrize("kind", KINDS)
def test_import_reads_a_manifest_back_to_an_equivalent_deployment(kind: str, tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(export(kind, "llama-3.1-8b-pd"))
    out = tmp_path / "d.yaml"
    res = runner.invoke(app, ["import", kind, str(manifest), "-o", str(out)])
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(out.read_text())
    src = yaml.safe_load((ROOT / "presets" / "llama-3.1-8b-pd.yaml").read_text())
    for key in ("cache", "serve"):
        assert data[key] == src[key]
    assert data["speculative"]["draft"] == src["speculative"]["draft"]
    assert {int(k): v for k, v in data["speculative"]["adaptive"]["buckets"].items()} == \
        {int(k): v for k, v in src["speculative"]["adaptive"]["buckets"].items()}
    assert {r: data["roles"][r]["port"] for r in ("prefill", "decode")} == {"prefill": 30001, "decode": 30002}
    other = next(k for k in KINDS if k != kind)
    wrong = runner.invoke(app, ["import", other, str(manifest)])
    assert wrong.exit_code == 2 and f"specctl import {kind}" in wrong.output


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                    reason="sglang is not installed (scripts/setup.sh installs it --no-deps)")
def test_sglangs_parser_accepts_every_engine_container(tmp_path: Path) -> None:
    manifests = []
    for kind in KINDS:
        for config, extra in cases(tmp_path):
            manifests.append(read_manifest(export(kind, config, *extra), name=f"{kind} {config} {extra}"))
    try:
        argvs = [(m.name, c.label, shlex.split(c.text.replace("\\\n", " "))) for m in manifests for c in m.commands]
        assert len(argvs) == 2 * len(manifests)
        requests = [{"op": "parse", "argv": a[3:], "abbrev": False} for _, _, a in argvs]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        proc = subprocess.run([sys.executable, str(ROOT / "tests" / "sglang_oracle.py")],
                              input=json.dumps(requests), capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for (name, label, argv), answer in zip(argvs, json.loads(proc.stdout), strict=True):
            assert answer["ok"], (name, label, answer["error"])
            assert label.endswith(answer["values"]["disaggregation_mode"])  # RBG role, LWS set, DGD service
            if "--nnodes" in argv:
                assert answer["values"]["tp_size"] == 16 and answer["values"]["nnodes"] == 2
    finally:
        for m in manifests:
            m.close()


def test_exports_and_manifest_validation_import_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from specctl.cli.main import app\n"
        "r = CliRunner()\n"
        "for kind in ('rbg', 'lws', 'dynamo', 'slurm'):\n"
        "    res = r.invoke(app, ['export', kind, '-c', 'llama-3.1-8b-pd', '--format', 'json'])\n"
        "    assert res.exit_code == 0, res.output\n"
        f"    open({str(tmp_path)!r} + '/' + kind + '.json', 'w').write(res.stdout)\n"
        f"res = r.invoke(app, ['export', 'rbg', '-c', 'llama-3.1-8b-pd', '--out', {str(tmp_path)!r}])\n"
        f"res = r.invoke(app, ['validate', {str(tmp_path / 'llama-3-1-8b-pd-rbg.yaml')!r}])\n"
        "assert res.exit_code == 0, res.output\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang'))\n"
        "assert not bad, bad[:5]\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    docs = json.loads((tmp_path / "rbg.json").read_text())
    assert [d["kind"] for d in docs] == ["RoleBasedGroup", "ConfigMap"]
    assert json.loads((tmp_path / "slurm.json").read_text())["script"].startswith("#!/bin/bash")


LLMD_VALUES = """modelArtifacts:
  uri: pvc://models/Meta-Llama-3.1-8B-Instruct
decode:
  replicas: 2
  containers:
    - name: sglang
      image: lmsysorg/sglang:v0.5.23
      modelCommand: custom
      command: [python3, -m, sglang.launch_server]
      args: [--model-path, /models/Meta-Llama-3.1-8B-Instruct, --disaggregation-mode, decode, --port, "8200",
             --page-size, "PAGE"]
prefill:
  replicas: 1
  containers:
    - name: sglang
      image: lmsysorg/sglang:v0.5.23
      modelCommand: custom
      command: [python3, -m, sglang.launch_server]
      args: [--model-path, /models/Meta-Llama-3.1-8B-Instruct, --disaggregation-mode, prefill, --port, "8000",
             --page-size, "16"]
"""


@pytest.mark.parametrize(("page", "errors"), [("16", 0), ("32", 1)])
def test_an_llm_d_values_file_is_read_as_its_containers_commands(tmp_path: Path, page: str, errors: int) -> None:
    f = tmp_path / "values.yaml"
    f.write_text(LLMD_VALUES.replace("PAGE", page))
    result = Validator().validate_paths([str(f)]).files[0]
    assert {x.path.split(": ")[0] for x in result.findings} == {"prefill", "decode"}
    found = [x for x in result.findings if x.severity == "error"]
    assert len(found) == errors
    if errors:  # on the line of decode's args, which holds --page-size
        assert found[0].path == "decode: --page-size" and found[0].line == 11


def test_import_reads_an_llm_d_values_file(tmp_path: Path) -> None:
    f = tmp_path / "values.yaml"
    f.write_text(LLMD_VALUES.replace("PAGE", "16"))
    out = tmp_path / "d.yaml"
    res = runner.invoke(app, ["import", "llm-d", str(f), "-o", str(out)])
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(out.read_text())
    assert data["cache"]["page_size"] == 16
    assert {r: data["roles"][r]["port"] for r in ("prefill", "decode")} == {"prefill": 8000, "decode": 8200}
