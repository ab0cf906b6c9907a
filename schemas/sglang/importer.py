"""SGLang launch commands (prefill + decode, or one server) as one specctl deployment document.

Contract: `import_commands(paths) -> Imported(data, findings)`; `import_parsed(commands)` does the same for
commands already read (a Kubernetes manifest's containers). Each file is read as `validate` reads
it (`command.parse_command_text`, `mapping.to_deployment`); the sections both sides agree on become
the top-level sections and what differs becomes a per-role override, so `specctl validate` of the
result reports the same disagreements as `specctl validate prefill.sh decode.sh`. The adaptive
config is inlined (`speculative.adaptive`). `findings` are the commands' own reading errors (SGL0xx):
the caller refuses to write a deployment from a command it could not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.findings import Finding
from specctl.schemas.loader import read_text
from specctl.schemas.model_facts import load_model_facts
from specctl.schemas.sglang.command import SGLangCommand, parse_command_text
from specctl.schemas.sglang.mapping import to_deployment, unmapped_flags
from specctl.schemas.validator import schema

SECTIONS = ("model", "speculative", "cache", "serve", "transfer")


@dataclass
class Imported:
    data: dict[str, Any]
    findings: list[tuple[str, Finding]] = field(default_factory=list)  # (file, finding)
    # role -> flags the deployment model cannot hold (reported, and kept as a comment in the YAML)
    unmapped: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for _, f in self.findings)


def _read(path: str) -> SGLangCommand:
    text = read_text(path)
    return parse_command_text(text, name=path, base_dir=Path(path).parent)


def _config_dtype(cmd: SGLangCommand) -> str | None:
    ref = cmd.value("model_path")
    if not isinstance(ref, str) or not (Path(ref) / "config.json").is_file():
        return None
    try:
        dt = load_model_facts(ref, engine=False).config.get("torch_dtype")
    except UsageError:
        return None
    return dt if isinstance(dt, str) else None


def import_commands(paths: list[str], *, name: str | None = None) -> Imported:
    if not 1 <= len(paths) <= 2:
        raise UsageError(f"give one or two SGLang command files, got {len(paths)}",
                         hint="specctl import sglang prefill.sh decode.sh -o deploy.yaml")
    return import_parsed([_read(p) for p in paths], name=name)


def import_parsed(cmds: list[SGLangCommand], *, name: str | None = None) -> Imported:
    """`import_commands` on commands already read (e.g. a manifest's containers)."""
    findings = [(c.name, f) for c in cmds for f in c.findings if f.code.startswith("SGL0")]
    roles = [c.role for c in cmds]
    if len(cmds) == 2 and sorted(roles) != ["decode", "prefill"]:
        raise UsageError(f"expected one prefill and one decode command (--disaggregation-mode), got "
                         f"{' and '.join(roles)}", hint="pass the prefill command file and the decode command file")
    mapped = {c.role: to_deployment(c, config_dtype=_config_dtype(c)).data for c in cmds if c.recognised}
    if len(mapped) != len(cmds):
        return Imported({}, findings)
    # decode's sections are the base: it is the side whose speculation and batching matter most
    base_role = "decode" if "decode" in mapped else next(iter(mapped))
    base = mapped[base_role]
    data: dict[str, Any] = {"version": 1, "name": name or "sglang-import"}

    if "engine" in schema().get("properties", {}):  # `engine: sglang` (once the schema has the field)
        data["engine"] = "sglang"
    for sec in SECTIONS:
        data[sec] = base[sec]
    roles_out: dict[str, Any] = {}
    for role, m in mapped.items():
        entry = dict(m["roles"][role])
        for sec in SECTIONS:
            if m[sec] != base[sec]:
                entry[sec] = {k: v for k, v in m[sec].items() if base[sec].get(k) != v}
        roles_out[role] = entry
    data["roles"] = roles_out
    unmapped = {c.role: flags for c in cmds if (flags := unmapped_flags(c))}
    return Imported(data, findings, unmapped)


def to_yaml(data: dict[str, Any], unmapped: dict[str, list[str]] | None = None) -> str:
    import yaml  # type: ignore[import-untyped, unused-ignore]  # noqa: PLC0415 - PyYAML: only for manifests and exports (`specctl validate` start-up)

    text: str = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)
    head = "# imported from SGLang launch commands by `specctl import sglang`\n"
    for role, flags in (unmapped or {}).items():
        head += f"# {role}: SGLang flags with no field in a deployment (pass them yourself): {' '.join(flags)}\n"
    return head + text
