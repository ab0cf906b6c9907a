"""`specctl import sglang P [D] [-o FILE]` and `specctl export sglang -c DEPLOY [--out DIR]`.

Thin wrappers over `specctl.schemas.sglang.importer.import_commands` and
`specctl.schemas.sglang.export.export_commands`. Exit 0 ok; 1 a command file has reading errors
(its findings are printed); 2 usage errors or unreadable files.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from specctl.cli.common import OutputFormat, handle_errors
from specctl.cli.main import app
from specctl.cli.options import ConfigOption, SetOption

import_app = typer.Typer(help="Read other tools' deployments into a specctl deployment file.", no_args_is_help=True)
export_app = typer.Typer(help="Write a specctl deployment in other tools' dialects.", no_args_is_help=True)
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")


@import_app.command("sglang")
def import_sglang(
    paths: Annotated[list[str], typer.Argument(help="The prefill and decode command files (or one server's).",
                                               metavar="PREFILL.sh [DECODE.sh]", show_default=False)],
    out: Annotated[Optional[str], typer.Option(  # noqa: UP045 - Typer reads annotations at runtime
        "-o", "--output", metavar="DEPLOY.yaml", help="Write the deployment here (default: stdout).",
        show_default=False)] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="The deployment's name.",  # noqa: UP045
                                                show_default=False)] = None,
) -> None:
    """Turn SGLang launch commands into a deployment file (adaptive config inlined)."""
    with handle_errors():
        from pathlib import Path

        from specctl.schemas.sglang.importer import import_commands, to_yaml

        imported = import_commands(paths, name=name)
        for file, f in imported.findings:
            where = f"{file}:{f.line}" if f.line else file
            sys.stderr.write(f"{where}: {f.code} {f.path}: {f.severity}: {f.message}\n    fix: {f.fix}\n")
        if not imported.ok or not imported.data:
            raise typer.Exit(1)
        for role, flags in imported.unmapped.items():
            sys.stderr.write(f"note: {role}: not represented in the deployment (kept as a comment): "
                             f"{' '.join(flags)}\n")
        text = to_yaml(imported.data, imported.unmapped)
        if out:
            Path(out).write_text(text, encoding="utf-8")
            sys.stderr.write(f"wrote {out}; check it with: specctl validate {out}\n")
        else:
            sys.stdout.write(text)


_MANIFEST_KINDS = {"rbg": "RoleBasedGroup", "lws": "LeaderWorkerSet", "dynamo": "DynamoGraphDeployment",
                   "llm-d": "llm-d values"}


def _import_manifest(kind: str, path: str, out: str | None, name: str | None) -> None:
    with handle_errors():
        from pathlib import Path

        from specctl.errors import UsageError
        from specctl.schemas.loader import read_text
        from specctl.schemas.platforms.manifest import read_manifest
        from specctl.schemas.sglang.command import parse_command_text
        from specctl.schemas.sglang.importer import import_parsed, to_yaml

        want = _MANIFEST_KINDS[kind]
        with read_manifest(read_text(path), name=path) as manifest:
            if want not in manifest.kinds:
                found = [k for k, v in _MANIFEST_KINDS.items() if v in manifest.kinds]
                raise UsageError(f"{path} holds no {want} (kinds: {', '.join(manifest.kinds) or 'none'})",
                                 hint=f"specctl import {found[0]} {path}" if found else
                                 "give a manifest exported by specctl export rbg|lws|dynamo, or llm-d values")
            cmds = [parse_command_text(c.text, name=path, base_dir=manifest.files_dir or Path(path).parent)
                    for c in manifest.commands]
            engines = [c for c in cmds if c.role in ("prefill", "decode")] or cmds[:1]
            if not engines:
                raise UsageError(f"{path}: no container runs SGLang", hint="specctl validate it for details")
            imported = import_parsed(sorted(engines, key=lambda c: c.role != "prefill"),
                                     name=name or Path(path).stem)
        for file, f in imported.findings:
            where = f"{file}:{f.line}" if f.line else file
            sys.stderr.write(f"{where}: {f.code} {f.path}: {f.severity}: {f.message}\n    fix: {f.fix}\n")
        if not imported.ok or not imported.data:
            raise typer.Exit(1)
        text = to_yaml(imported.data, imported.unmapped).replace("by `specctl import sglang`",
                                                                f"by `specctl import {kind}` from {path}")
        if out:
            Path(out).write_text(text, encoding="utf-8")
            sys.stderr.write(f"wrote {out}; check it with: specctl validate {out}\n")
        else:
            sys.stdout.write(text)


def _register_import(kind: str, what: str) -> None:
    def command(
        path: Annotated[str, typer.Argument(help="The manifest (YAML).", metavar="MANIFEST.yaml",
                                            show_default=False)],
        out: Annotated[Optional[str], typer.Option(  # noqa: UP045
            "-o", "--output", metavar="DEPLOY.yaml", help="Write the deployment here (default: stdout).",
            show_default=False)] = None,
        name: Annotated[Optional[str], typer.Option("--name", help="The deployment's name.",  # noqa: UP045
                                                    show_default=False)] = None,
    ) -> None:
        _import_manifest(kind, path, out, name)

    command.__doc__ = (f"Turn a {what}'s SGLang containers (prefill and decode) into a deployment file "
                       "(their ConfigMap's adaptive config inlined).")
    import_app.command(kind)(command)


_register_import("rbg", "RoleBasedGroup")
_register_import("lws", "LeaderWorkerSet")
_register_import("dynamo", "DynamoGraphDeployment")
_register_import("llm-d", "llm-d modelservice values file")


@export_app.command("sglang")
def export_sglang(
    config: ConfigOption,
    set_values: SetOption = None,
    out: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--out", metavar="DIR", help="Write prefill.sh, decode.sh, router.sh (or server.sh) and adaptive.json here.",
        show_default=False)] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="Output format: text (shell) or json "
                                                 '({"prefill": [...], "decode": [...], "router": [...], '
                                                 '"files": {...}}).')] = OutputFormat.text,
) -> None:
    """Print the SGLang server and sglang-router commands of a deployment (full flag names only)."""
    with handle_errors():
        import json
        from pathlib import Path

        from specctl.schemas.sglang.export import export_commands, shell_script
        from specctl.schemas.validator import load_deployment

        cmds = export_commands(load_deployment(config, overrides=set_values or ()))
        scripts = {name: argv for name, argv in (("prefill.sh", cmds.prefill), ("decode.sh", cmds.decode),
                                                 ("server.sh", cmds.colocated), ("router.sh", cmds.router))
                   if argv}
        if out:
            d = Path(out)
            d.mkdir(parents=True, exist_ok=True)
            for name, argv in scripts.items():
                (d / name).write_text("#!/bin/sh\nexport HF_HUB_OFFLINE=1\n" + shell_script(argv), encoding="utf-8")
            for name, text in cmds.files.items():
                (d / name).write_text(text, encoding="utf-8")
            sys.stderr.write(f"wrote {', '.join([*scripts, *cmds.files])} to {d}/ (run them from there)\n")
        if output is OutputFormat.json:
            sys.stdout.write(json.dumps(cmds.to_json(), indent=2) + "\n")
        elif not out:
            for name, argv in scripts.items():
                sys.stdout.write(f"# {name}\n{shell_script(argv)}\n")
            for name, text in cmds.files.items():
                sys.stdout.write(f"# {name} (referenced by --speculative-adaptive-config)\n{text}\n")


_PLATFORM_EPILOG = (
    "Every value a deployment does not hold is a flag with a default, and is marked with a comment in the "
    "output: --image, --namespace, --node-selector, --gpu-resource, --gpus, --nodes, --model-claim. The engines "
    "run the argv `specctl export sglang` prints; the router ({router}) starts only after `specctl preflight` "
    "passes on the prefill/decode pairs. Check the result with `specctl validate FILE` (it reads manifests)."
)

NameOpt = Annotated[Optional[str], typer.Option(  # noqa: UP045
    "--name", help="Resource name (default: the deployment's name).", show_default=False)]
NamespaceOpt = Annotated[str, typer.Option("--namespace", help="Kubernetes namespace.")]
ImageOpt = Annotated[str, typer.Option("--image", help="Engine image (with SGLang).")]
RouterImageOpt = Annotated[Optional[str], typer.Option(  # noqa: UP045
    "--router-image", help="Router image (default: --image).", show_default=False)]
ToolImageOpt = Annotated[str, typer.Option("--tool-image", help="Image of the preflight init container "
                                                                "(python3 + pip; it installs specctl).")]
RequirementOpt = Annotated[str, typer.Option("--specctl-requirement", metavar="REQ",
                                             help="What the init container pip-installs (the torch-free tool).")]
GpusOpt = Annotated[Optional[int], typer.Option(  # noqa: UP045
    "--gpus", min=0, help="GPUs per pod/node (default: 0 when every engine runs on the CPU, else 1); "
                          "--tp-size = GPUs x nodes.", show_default=False)]
NodesOpt = Annotated[int, typer.Option("--nodes", min=1, help="Nodes per engine instance (multi-node tensor "
                                                             "parallelism through the platform's leader address).")]
GpuResourceOpt = Annotated[str, typer.Option("--gpu-resource", help="The cluster's GPU resource name.")]
SelectorOpt = Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
    "--node-selector", metavar="KEY=VALUE", help="A node label the pods need (repeatable).", show_default=False)]
ClaimOpt = Annotated[str, typer.Option("--model-claim", help="PersistentVolumeClaim holding the model weights.")]
ModelDirOpt = Annotated[Optional[str], typer.Option(  # noqa: UP045
    "--model-dir", help="Where the claim is mounted (default: the directory holding the deployment's models).",
    show_default=False)]
RouterOpt = Annotated[Optional[str], typer.Option(  # noqa: UP045
    "--router", metavar="smg|sglang-router", help="The router in front (default: the deployment's roles.router.kind, "
    "smg when unset).", show_default=False)]
OutOpt = Annotated[Optional[str], typer.Option(  # noqa: UP045
    "--out", metavar="DIR", help="Write the file here (default: stdout).", show_default=False)]
FormatOpt = Annotated[OutputFormat, typer.Option("--format", help="text (YAML / the script) or json (the same "
                                                                  "documents as JSON).")]


def _platform_plan(config: str, set_values: list[str] | None, **opts: object) -> object:
    from specctl.errors import UsageError
    from specctl.schemas.platforms.plan import PlatformOptions, build_plan
    from specctl.schemas.validator import load_deployment

    selectors: list[tuple[str, str]] = []
    for item in opts.pop("node_selector", None) or []:  # type: ignore[attr-defined]
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise UsageError(f"--node-selector {item!r}: expected KEY=VALUE", hint="e.g. --node-selector gpu=h100")
        selectors.append((key, value))
    cluster = bool(opts.pop("cluster", True))
    options = PlatformOptions(node_selector=tuple(selectors), **opts)  # type: ignore[arg-type]
    return build_plan(load_deployment(config, overrides=set_values or ()), options, cluster=cluster)


def _emit(text: str, docs: object, out: str | None, filename: str, output: OutputFormat) -> None:
    import json
    from pathlib import Path

    from specctl.schemas.platforms.yamltext import plain

    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / filename).write_text(text, encoding="utf-8")
        sys.stderr.write(f"wrote {d / filename}\n")
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps(plain(docs), indent=2) + "\n")
    elif not out:
        sys.stdout.write(text)


def _k8s_export(kind: str, config: str, set_values: list[str] | None, out: str | None, output: OutputFormat,
                **opts: object) -> None:
    with handle_errors():
        from specctl.schemas.platforms import dynamo, lws, rbg
        from specctl.schemas.platforms.plan import Plan

        plan = _platform_plan(config, set_values, **opts)
        assert isinstance(plan, Plan)
        writers = {"rbg": (rbg.rbg_documents, rbg.rbg_manifest),
                   "lws": (lws.lws_documents, lws.lws_manifest),
                   "dynamo": (dynamo.dynamo_documents, dynamo.dynamo_manifest)}
        documents, manifest = writers[kind]
        _emit(manifest(plan), documents(plan), out, f"{plan.name}-{kind}.yaml", output)


def _register_k8s(kind: str, title: str) -> None:
    def command(
        config: ConfigOption,
        set_values: SetOption = None,
        out: OutOpt = None,
        name: NameOpt = None,
        namespace: NamespaceOpt = "default",
        image: ImageOpt = "lmsysorg/sglang:v0.5.23",
        router_image: RouterImageOpt = None,
        tool_image: ToolImageOpt = "python:3.11-slim",
        specctl_requirement: RequirementOpt = "specctl",
        gpus: GpusOpt = None,
        nodes: NodesOpt = 1,
        gpu_resource: GpuResourceOpt = "nvidia.com/gpu",
        node_selector: SelectorOpt = None,
        model_claim: ClaimOpt = "models",
        model_dir: ModelDirOpt = None,
        router: RouterOpt = None,
        output: FormatOpt = OutputFormat.text,
    ) -> None:
        _k8s_export(kind, config, set_values, out, output, name=name, namespace=namespace, image=image,
                    router_image=router_image, tool_image=tool_image, specctl_requirement=specctl_requirement,
                    gpus=gpus, nodes=nodes, gpu_resource=gpu_resource, node_selector=node_selector,
                    model_claim=model_claim, model_dir=model_dir, router=router)

    command.__doc__ = title
    router = "--router; the deployment's roles.router.kind, smg when unset"
    export_app.command(kind, epilog=_PLATFORM_EPILOG.format(router=router))(command)


_register_k8s("rbg", "Print a RoleBasedGroup (workloads.x-k8s.io/v1alpha2): router, prefill and decode roles.")
_register_k8s("lws", "Print LeaderWorkerSets (one per role), their leader Services and the router Deployment.")
_register_k8s("dynamo", "Print a DynamoGraphDeployment: python3 -m dynamo.sglang workers with SGLang's flags.")


@export_app.command("slurm", epilog=(
    "The script starts prefill and decode with srun, waits for their /health, runs `specctl preflight` on "
    "every pair (rows in the job's output) and only then starts the router; when any part stops, it stops "
    "the others. Exit 3 when preflight refuses the pair or a part dies. Tools come from the PATH of the "
    "shell that runs sbatch."))
def export_slurm(
    config: ConfigOption,
    set_values: SetOption = None,
    out: OutOpt = None,
    name: NameOpt = None,
    gpus: GpusOpt = None,
    nodes: NodesOpt = 1,
    router: RouterOpt = None,
    partition: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--partition", help="Slurm partition (default: the cluster's).", show_default=False)] = None,
    time: Annotated[Optional[str], typer.Option(  # noqa: UP045
        "--time", metavar="HH:MM:SS", help="Job time limit (default: the partition's).", show_default=False)] = None,
    spread: Annotated[bool, typer.Option("--spread", help="Each engine instance on its own node(s), reached "
                                                          "by node name (default: all on the first node).")] = False,
    output: FormatOpt = OutputFormat.text,
) -> None:
    """Print one sbatch script: srun prefill and decode, wait for /health, preflight, then the router."""
    with handle_errors():
        from specctl.schemas.platforms.plan import Plan
        from specctl.schemas.platforms.slurm import slurm_script

        plan = _platform_plan(config, set_values, name=name, gpus=gpus, nodes=nodes, router=router, cluster=False)
        assert isinstance(plan, Plan)
        text = slurm_script(plan, partition=partition, time=time, spread=spread)
        _emit(text, {"script": text}, out, f"{plan.name}.sbatch", output)
