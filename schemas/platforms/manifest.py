"""Kubernetes manifests read back as SGLang commands (what `validate` and `import` do with them).

Contract: `looks_like_manifest(text)` tells a RoleBasedGroup / LeaderWorkerSet / DynamoGraphDeployment file
(or a multi-document file holding one), or an llm-d modelservice values file (top-level `modelArtifacts` and
`prefill`/`decode`, whose containers give `command`/`args` with `modelCommand: custom`), from other YAML, by
its top-level lines only. `read_manifest(text, name=)`
returns a `Manifest`: one `ContainerCommand` per container that runs SGLang (`python[3] -m
sglang.launch_server`, `sglang serve`, `python3 -m dynamo.sglang` - Dynamo's worker takes SGLang's flags - given
as command + args, or inside `sh -c SCRIPT`), labelled by where it sits (RBG role name, LWS/Deployment name,
DGD service name), as shell text in which every word stays on its manifest line, so findings point at the
manifest's lines (an llm-d values file's containers: prefill / decode). Kubernetes `$(VAR)` references are
expanded from the container's literal `env` values and the platform's group variables (worker index 0, group
size = the pattern's size, leader address `leader`), as the pod would see them. Files the commands read from a
ConfigMap of the same manifest (a `--speculative-adaptive-config` under a mounted ConfigMap) are written into
`Manifest.files_dir` (a temporary directory, removed by `Manifest.close()` / the context manager) and the word
points there. One command per label: a multi-node role's leader, which serves HTTP, is the one read. Raises
`UsageError` (exit 2) for text that is not YAML.
"""

from __future__ import annotations

import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.sglang.command import ShellError, shell_words

KINDS = ("RoleBasedGroup", "LeaderWorkerSet", "DynamoGraphDeployment")
_KIND_LINE = re.compile(r"^kind:\s*[\"']?(" + "|".join(KINDS) + r")[\"']?\s*(?:#.*)?$", re.MULTILINE)
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_SHELLS = ("sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash", "/usr/bin/env")
_LEADER_KEYS = ("leaderTemplate", "leaderTemplatePatch")
_SIZE_KEYS = ("leaderWorkerPattern", "leaderWorkerTemplate")


# llm-d's modelservice Helm values: top-level modelArtifacts plus prefill/decode sections of containers
LLMD_VALUES = "llm-d values"
_LLMD = re.compile(r"^modelArtifacts:", re.MULTILINE)
_LLMD_ROLE = re.compile(r"^(?:prefill|decode):", re.MULTILINE)


def looks_like_manifest(text: str) -> bool:
    return bool(_KIND_LINE.search(text) or (_LLMD.search(text) and _LLMD_ROLE.search(text)))


@dataclass
class ContainerCommand:
    label: str
    text: str  # shell text, each word on its manifest line
    line: int
    leader: bool = False


@dataclass
class Manifest:
    name: str
    kinds: list[str] = field(default_factory=list)
    commands: list[ContainerCommand] = field(default_factory=list)
    files_dir: Path | None = None

    def close(self) -> None:
        if self.files_dir is not None:
            shutil.rmtree(self.files_dir, ignore_errors=True)
            self.files_dir = None

    def __enter__(self) -> Manifest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Word:
    text: str
    line: int  # 1-based


def _scalar_words(node: Any) -> list[_Word] | None:
    import yaml  # type: ignore[import-untyped, unused-ignore]  # noqa: PLC0415 - PyYAML: only for manifests and exports (`specctl validate` start-up)

    if not isinstance(node, yaml.SequenceNode):
        return None
    out: list[_Word] = []
    for item in node.value:
        if not isinstance(item, yaml.ScalarNode):
            return None
        out.append(_Word(str(item.value), item.start_mark.line + 1 + (1 if item.style in ("|", ">") else 0)))
    return out


def _get(node: Any, key: str) -> Any:
    import yaml  # noqa: PLC0415 - PyYAML: only for manifests and exports (`specctl validate` start-up)

    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v
    return None


def _plain(node: Any) -> Any:
    import yaml  # noqa: PLC0415 - PyYAML: only for manifests and exports (`specctl validate` start-up)

    if isinstance(node, yaml.MappingNode):
        return {str(k.value): _plain(v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    if isinstance(node, yaml.SequenceNode):
        return [_plain(v) for v in node.value]
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _expand(word: str, env: dict[str, str], size: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in env:
            return env[name]
        if name.endswith("WORKER_INDEX"):
            return "0"
        if name.endswith("GROUP_SIZE"):
            return size
        if name.endswith("LEADER_ADDRESS"):
            return "leader"
        return m.group(0)

    return _VAR.sub(sub, word)


def _launch_words(words: list[_Word]) -> list[_Word] | None:
    """The SGLang launch among the words (the words of `sh -c SCRIPT` split on their lines), or None."""
    texts = [w.text for w in words]
    if len(words) >= 3 and texts[0] in _SHELLS and "-c" in texts[1:3]:
        i = texts.index("-c", 1)
        if i + 1 < len(words):
            script = words[i + 1]

            try:
                commands = shell_words(script.text)
            except ShellError:
                return None
            for c in commands:
                found = _launch_words([_Word(w.text, script.line + w.line - 1) for w in c if not w.op])
                if found:
                    return found
        return None
    joined = " ".join(texts[:6])
    if "sglang.launch_server" in joined or "dynamo.sglang" in joined or texts[:2] == ["sglang", "serve"]:
        return [_Word("sglang.launch_server" if w.text == "dynamo.sglang" else w.text, w.line) for w in words]
    return None


def _to_text(words: list[_Word]) -> str:
    """Shell text with each word on its line (`\\` continues across lines, blank ones included)."""
    first, last = words[0].line, words[-1].line
    by_line: dict[int, list[str]] = {}
    for w in words:
        by_line.setdefault(w.line, []).append(shlex.quote(w.text))
    lines = ["\\"] * (first - 1)  # keeps line numbers; a lone `\` joins the next line
    for n in range(first, last + 1):
        body = " ".join(by_line.get(n, []))
        lines.append(body + (" \\" if n < last and body else ("\\" if n < last else "")))
    return "\n".join(lines) + "\n"


def _walk(node: Any, path: tuple[str, ...], out: list[tuple[tuple[str, ...], Any, str]], size: str) -> None:
    import yaml  # noqa: PLC0415 - PyYAML: only for manifests and exports (`specctl validate` start-up)

    if isinstance(node, yaml.MappingNode):
        for key in _SIZE_KEYS:
            pattern = _get(node, key)
            s = _get(pattern, "size") if pattern is not None else None
            if isinstance(s, yaml.ScalarNode):
                size = str(s.value)
        if _get(node, "command") is not None or _get(node, "args") is not None:
            out.append((path, node, size))
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                _walk(v, (*path, str(k.value)), out, size)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _walk(v, (*path, str(i)), out, size)


def _label(kind: str, doc: Any, path: tuple[str, ...]) -> str:
    plain_name = _plain(_get(_get(doc, "metadata"), "name")) or kind
    if kind == "RoleBasedGroup" and path[:2] == ("spec", "roles") and len(path) > 2:
        role = _get(_get(doc, "spec"), "roles").value[int(path[2])]
        return str(_plain(_get(role, "name")) or path[2])
    if kind == "DynamoGraphDeployment" and path[:2] == ("spec", "services") and len(path) > 2:
        return path[2]
    if kind == LLMD_VALUES and path:
        return path[0]
    return str(plain_name)


def _config_maps(docs: list[Any]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for doc in docs:
        if _plain(_get(doc, "kind")) == "ConfigMap":
            data = _plain(_get(doc, "data")) or {}
            out[str(_plain(_get(_get(doc, "metadata"), "name")))] = {str(k): str(v) for k, v in data.items()}
    return out


def _mounted_files(doc: Any, cms: dict[str, dict[str, str]]) -> dict[str, tuple[str, str]]:
    """mount path/key -> (config map, key) for every ConfigMap volume mounted in the document."""
    found: list[tuple[tuple[str, ...], Any, str]] = []
    volumes: dict[str, str] = {}
    mounts: list[tuple[str, str]] = []

    def visit(node: Any) -> None:
        plain = _plain(node)
        stack = [plain]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                cm = x.get("configMap")
                if isinstance(cm, dict) and "name" in x:
                    volumes[str(x["name"])] = str(cm.get("name"))
                if "mountPath" in x and "name" in x:
                    mounts.append((str(x["name"]), str(x["mountPath"])))
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)

    visit(doc)
    del found
    out: dict[str, tuple[str, str]] = {}
    for vol, mount in mounts:
        cm = volumes.get(vol)
        for key in cms.get(cm or "", {}):
            out[f"{mount.rstrip('/')}/{key}"] = (cm or "", key)
    return out


def read_manifest(text: str, *, name: str) -> Manifest:
    """The manifest's SGLang commands (see the module contract)."""
    import yaml  # noqa: PLC0415 - PyYAML: only for manifests and exports (`specctl validate` start-up)

    try:
        docs = [d for d in yaml.compose_all(text, Loader=yaml.SafeLoader) if d is not None]
    except yaml.YAMLError as exc:
        raise UsageError(f"{name}: not YAML: {exc}", hint="fix the manifest so kubectl could read it") from None
    cms = _config_maps(docs)
    manifest = Manifest(name=name)
    chosen: dict[str, ContainerCommand] = {}
    for doc in docs:
        kind = str(_plain(_get(doc, "kind")) or (LLMD_VALUES if _get(doc, "modelArtifacts") is not None else ""))
        manifest.kinds.append(kind)
        if kind == "ConfigMap":
            continue
        files = _mounted_files(doc, cms)
        found: list[tuple[tuple[str, ...], Any, str]] = []
        _walk(doc, (), found, "1")
        for path, node, size in found:
            words = (_scalar_words(_get(node, "command")) or []) + (_scalar_words(_get(node, "args")) or [])
            if not words:
                continue
            env = {str(e.get("name")): str(e["value"]) for e in (_plain(_get(node, "env")) or [])
                   if isinstance(e, dict) and "value" in e}
            words = [_Word(_expand(w.text, env, size), w.line) for w in words]
            launch = _launch_words(words)
            if launch is None:
                continue
            for w in launch:
                if w.text in files:
                    w.text = str(_materialise(manifest, cms, files[w.text]))
            label = _label(kind, doc, path)
            leader = any(p in _LEADER_KEYS for p in path)
            cmd = ContainerCommand(label=label, text=_to_text(launch), line=launch[0].line, leader=leader)
            if label not in chosen or (leader and not chosen[label].leader):
                chosen[label] = cmd
    manifest.commands = sorted(chosen.values(), key=lambda c: c.line)
    return manifest


def _materialise(manifest: Manifest, cms: dict[str, dict[str, str]], ref: tuple[str, str]) -> Path:
    if manifest.files_dir is None:
        manifest.files_dir = Path(tempfile.mkdtemp(prefix="specctl-manifest-"))
    cm, key = ref
    target = manifest.files_dir / cm / key
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(cms[cm][key], encoding="utf-8")
    return target
