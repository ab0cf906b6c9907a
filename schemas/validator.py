"""The validation pipeline: files -> findings (schema, semantic rules, step coverage, PD pair checks).

Contract: `Validator(overrides=..., initial_steps=..., graph_batch_sizes=..., kind=...)` is built once
per invocation (the JSON Schema is compiled once per process, model facts are read once per model);
`validate_paths(paths)` returns a `Report` with one `FileResult` per path, in order, and never raises
for bad content: a file that cannot be read becomes a `SCH000` finding and `Report.exit_code` 2.
Each deployment file goes: load (line/col) -> `--set` overrides -> JSON Schema (SCH0xx; a compiled
yes/no check first, `jsonschema` only for documents that fail it) -> merged
roles -> semantic rules on the roles whose sections passed the schema -> step coverage per engine
role (`check_deployment_steps`) -> positions attached. An SGLang adaptive-config JSON
(detected by shape, or `kind="sglang"`) goes through `parse_sglang_config` + `step_coverage` with the
given initial steps and graph batch sizes. An SGLang launch command (recognised by content:
`sglang.sniff.looks_like_command`, or `kind="sglang-command"`) is read flag by flag (SGL0xx),
mapped onto a deployment document (`sglang.mapping`) that goes through every rule above, with its
findings moved onto the flag behind each JSON path, plus the SGLang-only rules (SGL1xx); a prefill
and a decode command are also compared by `sglang.rules.check_pair` (SGL2xx). An exception while
validating one file becomes that file's SCH000 finding and exit 3, so the other files' report survives.
Then files declaring only prefill are paired, in order,
with files declaring only decode and cross-checked (rule 5 and cross-file topology); findings of a
pair land in the decode file, naming the prefill file.

Many files in one run: no module is loaded or code compiled per file; files are read by
the loader's fast path with lazy positions (only files with findings are re-parsed for lines); the
schema's yes/no check switches to generated code after the first files; roles are merged without
copies; step coverage and its rendering are memoized on what they read; the cyclic GC is paused.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import gc
import json
import re
import tempfile
import traceback
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specctl import presets
from specctl.errors import InvalidInput, UsageError
from specctl.schemas import rules_pd, rules_topology
from specctl.schemas.adaptive import (
    check_deployment_steps,
    looks_like_sglang_adaptive,
    parse_sglang_config,
    step_coverage,
)
from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.deployment import (
    ENGINE_ROLES,
    SECTIONS,
    Deployment,
    declared_roles,
    merge_roles,
    resolve_source,
)
from specctl.schemas.fastschema import compile_check, generate_check
from specctl.schemas.findings import Finding
from specctl.schemas.loader import Document, child_path, fast_data, parse_document, read_text
from specctl.schemas.model_facts import ModelFacts
from specctl.schemas.overrides import Override, apply_overrides, parse_overrides
from specctl.schemas.platforms.manifest import looks_like_manifest, read_manifest
from specctl.schemas.rules import FactsCache, RoleRef, RuleContext, rule_checks
from specctl.schemas.sglang.command import parse_command_text, release_note
from specctl.schemas.sglang.families import FamilyError, sglang_model
from specctl.schemas.sglang.sniff import looks_like_command
from specctl.schemas.sglang.startup import predict_startup

if TYPE_CHECKING:
    from specctl.schemas.adaptive_coverage import StepCoverage
    from specctl.schemas.rules import RuleContext

KINDS = ("auto", "deployment", "sglang", "sglang-command")

register(RuleDoc(
    "MAN001", "manifest without an SGLang container", "error",
    "A RoleBasedGroup, LeaderWorkerSet or DynamoGraphDeployment file is read as the SGLang commands of its "
    "containers (command + args, or sh -c SCRIPT); this one has none, so nothing in it could be checked.",
    "Nothing is checked; the servers it starts may still disagree.",
    "Run the engines as `python3 -m sglang.launch_server ...` (or `python3 -m dynamo.sglang ...`) in the "
    "container's command/args.",
    "command: [/entrypoint.sh]", "command: [python3, -m, sglang.launch_server, --model-path, /models/m]",
))

register(RuleDoc(
    "SCH000", "file cannot be read", "error",
    "The file could not be read or parsed as one YAML/JSON mapping: missing, a directory, not UTF-8, a syntax "
    "error, empty, too large (1 MiB), nested too deep, an alias bomb, integers beyond 64 bits, NaN/inf, a "
    "top-level list, or a non-string key. validate exits with 2.",
    "The engine's config loader fails at start-up with a parser traceback.",
    "Fix the file at the reported line; `specctl presets show tiny-colocated` prints a valid starting point.",
    "on: 1        # YAML reads `on` as a boolean key", '"on": 1',
))
register(RuleDoc(
    "SCH001", "unknown key", "error",
    "Deployment files reject unknown keys (additionalProperties: false), so a typo is an error instead of a "
    "setting silently ignored.",
    "Nothing at start-up: the misspelled setting is silently ignored and its default used.",
    "Fix the spelling (validate suggests the closest known key) or remove the key.",
    "speculative: {num_step: 3}", "speculative: {num_steps: 3}",
))
register(RuleDoc(
    "SCH002", "wrong type", "error",
    "A value has the wrong JSON type (e.g. a string where an integer is expected; booleans are not integers).",
    "TypeError or ValueError at start-up, or `true` silently read as 1.",
    "Write a value of the expected type.",
    "cache: {page_size: '16'}", "cache: {page_size: 16}",
))
register(RuleDoc(
    "SCH003", "missing required key", "error",
    "A required key is absent (e.g. version, model.target, a role's port, a bucket's candidate_steps).",
    "KeyError at start-up.",
    "Add the key.",
    "model: {dtype: float32}", "model: {target: builtin:tiny-hybrid, dtype: float32}",
))
register(RuleDoc(
    "SCH004", "value not allowed", "error",
    "A value is outside what the field allows: not one of its choices, out of range, an empty or duplicated "
    "list, a malformed name or device, or a bucket key that is not a positive integer.",
    "ValueError at start-up, or a setting that cannot work (update_interval 0 divides by zero).",
    "Use a value the field allows; the message names the bound or the choices.",
    "speculative: {algorithm: eagle}", "speculative: {algorithm: draft}",
))
register(RuleDoc(
    "SCH005", "duplicate key", "error",
    "The same key appears twice in one mapping; the later value silently wins.",
    "Nothing: the first value is silently ignored.",
    "Remove one of the two keys.",
    "cache: {page_size: 16, page_size: 32}", "cache: {page_size: 16}",
))


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The deployment JSON Schema (package data)."""
    text = (resources.files("specctl.schemas") / "deployment.schema.json").read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


@functools.lru_cache(maxsize=1)
def _compiled() -> Any:
    # Compiled once per process: 1,000 files cost one compilation.
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped, unused-ignore]  # noqa: PLC0415 - jsonschema: only for documents that fail the compiled check (`specctl validate` start-up)

    return Draft202012Validator(schema())


@dataclass(frozen=True)
class FileResult:
    """The outcome for one input file."""

    path: str
    findings: tuple[Finding, ...]
    kind: str  # "deployment" | "sglang" | "unreadable"
    reachable: dict[str, Any] | None = None
    reachable_text: str | None = None
    data: dict[str, Any] | None = field(default=None, repr=False)
    load_error: UsageError | None = field(default=None, repr=False)
    roles: tuple[str, ...] = ()
    # An SGLang launch command: the release and GPU it was checked for and what SGLang resolves silently
    # (`startup.Startup.resolved`, by ServerArgs field), as predicted without SGLang.
    sglang: dict[str, Any] | None = None

    def ok(self, strict: bool = False) -> bool:
        bad = ("error", "warning") if strict else ("error",)
        return self.load_error is None and not any(f.severity in bad for f in self.findings)

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok(strict),
            "findings": [f.to_json() for f in self.findings],
            "reachable": self.reachable,
            **({"sglang": self.sglang} if self.sglang is not None else {}),
        }


@dataclass(frozen=True)
class Report:
    """All files of one `validate` invocation."""

    files: tuple[FileResult, ...]
    strict: bool = False

    @property
    def ok(self) -> bool:
        return all(f.ok(self.strict) for f in self.files)

    @property
    def exit_code(self) -> int:
        if any(getattr(f.load_error, "exit_code", 2) == 3 for f in self.files):
            return 3  # an internal error: never reported as "your input is invalid"
        if any(f.load_error is not None for f in self.files):
            return 2
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "files": [f.to_json(self.strict) for f in self.files]}


@dataclass
class _State:
    """Per-file working state kept until pair checks are done."""

    doc: Document
    findings: list[Finding]
    kind: str
    ctx: Any = None  # RuleContext for deployments
    reachable: dict[str, Any] | None = None
    reachable_text: str | None = None
    load_error: UsageError | None = None
    sglang: Any = None  # (SGLangCommand, Mapped, SGLangModel | None, Startup) for an SGLang launch command


class Validator:
    """One validation run's settings and caches (see the module contract)."""

    def __init__(
        self,
        *,
        overrides: Sequence[str | Override] = (),
        initial_steps: int | None = None,
        graph_batch_sizes: Sequence[int] | None = None,
        kind: str = "auto",
        strict: bool = False,
        sglang_gpu: str = "H100",
        sglang_version: str | None = None,
        resolve: Any = None,
    ) -> None:
        if kind not in KINDS:
            raise UsageError(f"unknown input kind {kind!r}", hint=f"one of: {', '.join(KINDS)}")
        # Parsed up front: a bad --set is a usage error before any file is read.
        self.overrides: tuple[Override, ...] = tuple(
            o if isinstance(o, Override) else parse_overrides([o])[0] for o in overrides
        )
        self.initial_steps = initial_steps
        self.graph_batch_sizes = tuple(graph_batch_sizes or ())
        self.kind = kind
        self.strict = strict
        self.sglang_gpu = sglang_gpu  # the GPU SGLang's start-up choices are predicted for
        self.resolve = resolve  # a sglang.verdicts.ResolveRequest: also run SGLang's own start-up resolution
        self.facts = FactsCache()
        self._coverage_cache: dict[str, tuple[StepCoverage | None, list[Finding]]] = {}
        self._rendered_cache: dict[int, tuple[StepCoverage, dict[str, Any], str]] = {}
        self._checks: list[Any] | None = None
        self.sglang_version = sglang_version
        self._release: Any = None  # the SGLang release of launch commands (sglang.release.ReleaseChoice)
        if sglang_version is not None:
            self.sglang_release()  # a bad --sglang-version is a usage error before any file is read

    # -- public ------------------------------------------------------------------------------------

    def sglang_release(self) -> Any:
        """The SGLang release launch commands are checked against (`sglang.release.choose_release`): the
        named one, else that of `--set sglang.python=...`, else the installed SGLang's, else the newest."""
        if self._release is None:
            from specctl.schemas.sglang.release import choose_release  # noqa: PLC0415 - `specctl validate` start-up: SGLang-command support, loaded for SGLang files only

            python = next((o.value for o in self.overrides if o.keys == ("sglang", "python")
                           and isinstance(o.value, str)), None)
            self._release = choose_release(self.sglang_version, python)
        return self._release

    def validate_paths(self, paths: Iterable[str | Path]) -> Report:
        with _gc_paused():
            states = [self._validate_one(p) for p in paths]
            self._pair(states)
            if self.resolve is not None:
                self._sglang_resolution(states)
            return Report(files=tuple(self._finish(s) for s in states), strict=self.strict)

    def validate_file(self, path: str | Path) -> FileResult:
        return self.validate_paths([path]).files[0]

    def validate_document(self, doc: Document) -> FileResult:
        state = self._validate_doc(doc)
        self._pair([state])
        return self._finish(state)

    # -- per file ----------------------------------------------------------------------------------

    def _validate_one(self, path: str | Path) -> _State:
        """One file's findings; never raises: an internal error becomes an SCH000 finding (exit 3 via
        `Report.exit_code`), so the other files' report survives."""
        try:
            return self._validate_one_unguarded(path)
        except Exception as exc:  # noqa: BLE001 - one bad file must never lose the others' report
            state = _State(doc=Document(name=str(path), data={}), findings=[], kind="unreadable")
            _internal(state, exc, "validating this file")
            return state

    def _validate_one_unguarded(self, path: str | Path) -> _State:
        path = _resolve(path)
        try:
            text = read_text(path)
            if self.kind == "auto":
                if looks_like_manifest(text):
                    return self._manifest(path, text)
            if self.kind in ("auto", "sglang-command"):
                if self.kind == "sglang-command" or looks_like_command(text):
                    return self._sglang_command(path, text)
            data = fast_data(text)
            doc = Document(str(path), data, None, source=text) if data is not None \
                else parse_document(text, name=str(path))
        except UsageError as exc:
            m = re.match(r"^.*?:(\d+)(?::(\d+))?: ", str(exc))
            line = int(m.group(1)) if m else None
            col = int(m.group(2)) if m and m.group(2) else None
            msg = str(exc)
            prefix = f"{path}:"
            if msg.startswith(prefix):  # the reporter prints file:line itself
                msg = re.sub(r"^\d+(?::\d+)?: ", "", msg[len(prefix):]) if m else msg[len(prefix):].lstrip()
            elif msg.startswith(str(path)):
                msg = msg[len(str(path)):].lstrip(": ")
            f = Finding("SCH000", "error", "$", msg, exc.hint or "fix the file so it parses as one YAML/JSON mapping",
                        line, col)
            return _State(doc=Document(name=str(path), data={}), findings=[f], kind="unreadable", load_error=exc)
        return self._validate_doc(doc)

    def _manifest(self, path: str | Path, text: str) -> _State:
        """A Kubernetes manifest (RBG, LWS, DGD): each SGLang container's command validated like a command file
        (its findings on the manifest's lines, their path prefixed by the container's label), prefill and
        decode paired; a manifest with no SGLang container is an MAN001 error."""

        with read_manifest(text, name=str(path)) as manifest:
            labelled = [(c.label, self._sglang_command(path, c.text, base_dir=manifest.files_dir))
                        for c in manifest.commands]
            states = [s for _, s in labelled]
            self._pair(states)
            findings = [replace(f, path=f"{label}: {f.path}") for label, s in labelled
                        for f in self._finish(s).findings]
        if not labelled:
            kinds = ", ".join(k for k in manifest.kinds if k) or "none"
            findings.append(Finding("MAN001", "error", "$", f"no container runs SGLang in this manifest (kinds: "
                                    f"{kinds})", "give the engine containers `python3 -m sglang.launch_server ...` "
                                    "(or python3 -m dynamo.sglang) as command/args", 1, None))
        return _State(doc=Document(name=str(path), data={}), findings=findings, kind="manifest")

    def _sglang_command(self, path: str | Path, text: str, *, base_dir: Path | None = None) -> _State:
        """An SGLang launch command: flag findings, then the mapped deployment through every rule."""
        from specctl.schemas.sglang.drafts import sglang_draft_findings  # noqa: PLC0415 - `specctl validate` start-up: SGLang-command support, loaded for SGLang files only
        from specctl.schemas.sglang.mapping import to_deployment  # noqa: PLC0415 - `specctl validate` start-up: SGLang-command support, loaded for SGLang files only
        from specctl.schemas.sglang.rules import check_command  # noqa: PLC0415 - `specctl validate` start-up: SGLang-command support, loaded for SGLang files only

        release = self.sglang_release()
        cmd = parse_command_text(text, name=str(path), base_dir=base_dir or Path(path).parent,
                                 release=release.release, release_named=release.named)
        release_note(cmd, release.note)
        if not cmd.recognised or "model_path" not in cmd.options:
            doc = Document(name=str(path), data={}, positions={"$": (cmd.first_line, 1)})
            return _State(doc=doc, findings=list(cmd.findings), kind="sglang-command")
        ref = cmd.value("model_path")
        got = self.facts.get(ref) if isinstance(ref, str) and ref else None
        model = None
        config_dtype = None
        if isinstance(got, ModelFacts):
            try:
                model = sglang_model(got.config)
            except FamilyError:
                model = None
            config_dtype = model.torch_dtype if model is not None else None
        mapped = to_deployment(cmd, config_dtype=config_dtype)
        doc = Document(name=str(path), data=mapped.data, positions=mapped.positions)
        state = self._validate_doc(doc, kind="deployment")
        state.kind = "sglang-command"
        state.findings[:0] = list(cmd.findings) + mapped.adaptive_findings
        startup = predict_startup(cmd, model, gpu=self.sglang_gpu, release=self.sglang_release().release)
        state.findings.extend([*startup.errors, *startup.warnings, *check_command(cmd, model, startup)])
        state.findings = sglang_draft_findings(cmd, model, self.facts.get, state.findings)
        state.sglang = (cmd, mapped, model, startup)
        return state

    def _validate_doc(self, doc: Document, *, kind: str | None = None) -> _State:
        findings: list[Finding] = [
            Finding("SCH005", "error", path, f"duplicate key {path.rsplit('.', 1)[-1]!r}; the later value wins",
                    "remove one of the two keys", line, col)
            for path, line, col in doc.duplicates
        ]
        if self.overrides:
            doc = _overridden(doc, self.overrides)
        kind = kind or self.kind
        if kind == "sglang-command":
            kind = "deployment"
        if kind == "auto":
            kind = "sglang" if looks_like_sglang_adaptive(doc.data) else "deployment"
        state = _State(doc=doc, findings=findings, kind=kind)
        if kind == "sglang":
            self._sglang(state)
        else:
            self._deployment(state)
        return state

    def _sglang(self, state: _State) -> None:
        cfg, found = parse_sglang_config(state.doc.data, base_path="$")
        state.findings.extend(found)
        if cfg is None:
            return
        coverage, more = step_coverage(
            cfg, initial_steps=self.initial_steps, graph_batch_sizes=self.graph_batch_sizes,
            max_batch_size=None, base_path="$",
        )
        state.findings.extend(more)
        state.reachable = coverage.to_json()
        state.reachable_text = coverage.render_text()

    def _deployment(self, state: _State) -> None:
        data = state.doc.data
        schema_findings = schema_errors(data)
        state.findings.extend(schema_findings)
        # An unknown key is dropped by the merge and harms no rule; other schema errors make the
        # values under them untrustworthy, so the roles using them skip semantic rules.
        bad_paths = [f.path for f in schema_findings if f.code != "SCH001"]
        roles = declared_roles(data)
        bad_sections: dict[str, set[str]] = {}
        for role in roles:
            bad_sections[role] = {
                sec for sec in SECTIONS for p in bad_paths
                if _under(p, f"$.{sec}") or _under(p, child_path(child_path("$.roles", role), sec))
            }
        ctx = RuleContext(
            name=state.doc.name,
            data=data,
            roles=merge_roles(data, roles),
            facts_cache=self.facts,
            topology_clean=not any(_under(p, pre) for p in bad_paths for pre in ("$.roles", "$.transfer")),
            all_roles=roles,
            bad_sections=bad_sections,
        )
        state.ctx = ctx
        rule_findings: list[Finding] = []
        if self._checks is None:
            self._checks = rule_checks()
        for check in self._checks:
            rule_findings.extend(check(ctx))
        rule_findings.extend(self._steps(ctx, state))
        engine_roles = [r for r in roles if r in ENGINE_ROLES]
        state.findings.extend(_merge_roles(rule_findings, single=len(engine_roles) <= 1))

    def _steps(self, ctx: RuleContext, state: _State) -> list[Finding]:
        """Step coverage (ADP1xx) per engine role; the table of the decoding role."""
        out: list[Finding] = []
        tables: dict[str, StepCoverage] = {}
        for role, cfg in ctx.engine_roles("speculative", "serve"):
            base = "$"
            raw_role = ctx.section("roles").get(role)
            if isinstance(raw_role, dict) and isinstance(raw_role.get("speculative"), dict):
                base = child_path("$.roles", role)
            engine = str(ctx.data.get("engine") or "builtin")
            coverage, found = self._coverage(cfg, base, engine)
            out.extend(found)
            if coverage is not None:
                tables[role] = coverage
        for role in ("decode", "colocated", "prefill"):
            if role in tables:
                state.reachable, state.reachable_text = self._rendered(tables[role])
                break
        return out

    def _coverage(self, cfg: dict[str, Any], base: str, engine: str) -> tuple[StepCoverage | None, list[Finding]]:
        """`check_deployment_steps` memoized on what it reads: files of one invocation (a repo's
        deployments, a PD pair) mostly share their speculative/serve sections. The key is the repr:
        equal reprs mean equal JSON values of equal types (1, 1.0 and True differ), in equal order."""
        key = repr((base, engine, cfg.get("speculative"), cfg.get("serve")))
        hit = self._coverage_cache.get(key)
        if hit is None:
            hit = check_deployment_steps(cfg, base_path=base, engine=engine)
            self._coverage_cache[key] = hit
        return hit[0], list(hit[1])

    def _rendered(self, coverage: StepCoverage) -> tuple[dict[str, Any], str]:
        """(JSON, text table) of a coverage result, once per distinct result (they are cached above and
        read-only: reports only serialise them)."""
        hit = self._rendered_cache.get(id(coverage))
        if hit is None or hit[0] is not coverage:
            hit = (coverage, coverage.to_json(), coverage.render_text())
            self._rendered_cache[id(coverage)] = hit
        return hit[1], hit[2]

    # -- pairs ---------------------------------------------------------------------------------------

    def _pair(self, states: list[_State]) -> None:
        prefills = [s for s in states if s.ctx is not None and "prefill" in s.ctx.all_roles
                    and "decode" not in s.ctx.all_roles]
        decodes = [s for s in states if s.ctx is not None and "decode" in s.ctx.all_roles
                   and "prefill" not in s.ctx.all_roles]
        for p, d in zip(prefills, decodes, strict=False):  # extra lone sides get PD511 below
            if not (p.ctx.clean("prefill") and d.ctx.clean("decode")):
                continue  # a side failed the schema; its findings say why
            pr, dr = RoleRef(p.ctx, "prefill"), RoleRef(d.ctx, "decode")
            try:
                found = rules_pd.check_pair(pr, dr) + rules_topology.check_pair(pr, dr)
                if p.sglang is not None and d.sglang is not None:
                    from specctl.schemas.sglang.rules import check_pair as sglang_pair  # noqa: PLC0415 - `specctl validate` start-up: SGLang-command support, loaded for SGLang files only
                    found += sglang_pair(p.sglang[0], d.sglang[0], p.sglang[2], d.sglang[2], p.sglang[3],
                                         d.sglang[3], release=self.sglang_release().release)
            except Exception as exc:  # noqa: BLE001 - a bug in a pair rule must not lose the report
                _internal(d, exc, f"comparing it with {p.doc.name}")
                continue
            d.findings.extend(found)
        n = min(len(prefills), len(decodes))
        for s, own, other in [(s, "prefill", "decode") for s in prefills[n:]] + [
            (s, "decode", "prefill") for s in decodes[n:]
        ]:
            s.findings.append(Finding(
                "PD511", "info", child_path("$.roles", own),
                f"this file declares {own} but no {other}; prefill/decode symmetry is not cross-checked",
                f"validate it together with its {other} file: specctl validate PREFILL.yaml DECODE.yaml",
            ))

    def _sglang_resolution(self, states: list[_State]) -> None:
        """SGLang's own verdict on every SGLang command (and each role of an engine: sglang deployment)."""

        from specctl.schemas.sglang.verdicts import command_target, deployment_targets, resolve_findings  # noqa: PLC0415 - `specctl validate` start-up: loaded only with --resolve

        with tempfile.TemporaryDirectory(prefix="specctl-resolve-") as folder:
            targets, owners = [], []
            for s in states:
                if s.load_error is not None:
                    continue
                try:
                    if s.kind == "sglang-command":
                        t = command_target(s.doc.name)
                        found = [t] if t is not None else []
                    elif s.kind == "deployment" and not any(f.severity == "error" for f in s.findings):
                        found = deployment_targets(_deployment(s.doc.data, Path(s.doc.name)), folder)
                    else:
                        found = []
                except Exception as exc:  # noqa: BLE001 - a bug here must not lose the report
                    _internal(s, exc, "preparing SGLang's resolution")
                    continue
                targets += found
                owners += [s] * len(found)
            for s, verdict in zip(owners, resolve_findings(targets, self.resolve), strict=True):
                s.findings.extend(verdict)

    def _finish(self, s: _State) -> FileResult:
        seen: set[tuple[str, str, str]] = set()
        out: list[Finding] = []
        for f in s.findings:
            if s.sglang is not None:
                from specctl.schemas.sglang.mapping import DECIDED_BY_SGLANG  # noqa: PLC0415 - `specctl validate` start-up: SGLang-command support, loaded for SGLang files only

                if f.code in DECIDED_BY_SGLANG and f.path.startswith("$"):
                    continue  # a deployment rule SGLang decides itself; the start-up prediction says so in flags
                f = _on_flag(f, s)
                if f.code == "TOP602":  # SGLang binds names and the shell expands ${VAR}: nothing to refuse
                    host = s.sglang[0].value("host")
                    f = replace(f, severity="info", message=f"--host {host} is a name or an unexpanded variable: "
                                "the port-collision check cannot tell which machine it is (cannot check)",
                                fix="nothing to do; give the two servers different ports if they share a machine")
            key = (f.code, f.path, f.message)
            if key in seen:
                continue
            seen.add(key)
            if f.line is None and s.load_error is None:
                pos = s.doc.position(f.path)
                if pos is not None:
                    f = replace(f, line=pos[0], column=pos[1])
            out.append(f)
        out.sort(key=lambda f: (f.line if f.line is not None else 1 << 30, f.column or 0, f.code, f.path))
        return FileResult(
            path=s.doc.name,
            findings=tuple(out),
            kind=s.kind,
            reachable=s.reachable,
            reachable_text=s.reachable_text,
            data=s.doc.data if s.load_error is None and s.kind != "manifest" else None,  # a manifest is no deployment
            load_error=s.load_error,
            roles=s.ctx.all_roles if s.ctx is not None else (),
            sglang=self._sglang_json(s),
        )

    def _sglang_json(self, s: _State) -> dict[str, Any] | None:
        if s.sglang is None or len(s.sglang) < 4:
            return None
        cmd, startup = s.sglang[0], s.sglang[3]
        return {"release": cmd.release, "gpu": self.sglang_gpu,
                "resolved": {k: startup.resolved[k] for k in sorted(startup.resolved)}}


class InternalError(UsageError):
    """A bug met while validating one file: reported as that file's finding, exit 3."""

    exit_code = 3


def _internal(state: _State, exc: Exception, doing: str) -> None:
    """Record a bug met while `doing` as the state's SCH000 finding; the report then exits 3."""

    where = traceback.extract_tb(exc.__traceback__)[-1]
    msg = f"internal error while {doing}: {type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"
    state.findings.append(Finding("SCH000", "error", "$", msg,
                                  "this is a bug in specctl; please report it with the file(s)"))
    state.load_error = InternalError(msg)


def _on_flag(f: Finding, s: _State) -> Finding:
    """A rule's finding on a mapped SGLang command, moved onto the SGLang flag behind its JSON path and
    worded in SGLang's terms (flags, never deployment-schema fields or builtin models)."""
    from specctl.schemas.sglang.mapping import in_sglang_dialect  # noqa: PLC0415 - `specctl validate` start-up: SGLang-command support, loaded for SGLang files only
    from specctl.schemas.sglang.rules import SGLANG_WHEN  # noqa: PLC0415 - `specctl validate` start-up: SGLang-command support, loaded for SGLang files only

    cmd, mapped = s.sglang[0], s.sglang[1]
    if not f.path.startswith("$"):
        return replace(f, message=in_sglang_dialect(f.message), fix=in_sglang_dialect(f.fix))
    flag = mapped.flag_for(f.path, cmd)
    if flag is None:
        return replace(f, message=in_sglang_dialect(f.message), fix=in_sglang_dialect(f.fix))
    pos = s.doc.position(f.path)
    when = SGLANG_WHEN.get(f.code)
    message = in_sglang_dialect(f.message)
    message = f"{message}; SGLang fails {when}" if when and not when.startswith("never") else \
        (f"{message}; {when}" if when else message)
    fix = in_sglang_dialect(f.fix)
    if flag not in fix:
        fix = f"{fix} ({flag})"
    return replace(f, path=flag, message=message, fix=fix,
                   line=f.line if f.line is not None else (pos[0] if pos else None),
                   column=f.column if f.column is not None else (pos[1] if pos else None))


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while files are validated: the per-file data is acyclic (freed by
    reference counting), and with many files the collector's passes over every live object cost 10-20%."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _resolve(path: str | Path) -> str | Path:
    """A path, or the file of a preset name when no such file exists."""
    if "/" in str(path) or Path(path).exists():
        return path

    return presets.path(str(path)) if str(path) in presets.names() else path


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "[")


_ROLE_TAG = re.compile(r"^\[(\w+)\] ")


def _merge_roles(findings: list[Finding], *, single: bool) -> list[Finding]:
    """One finding for a shared setting: `[prefill] x` + `[decode] x` at one path -> `[prefill, decode] x`."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    order: list[tuple[tuple[str, str, str], Finding]] = []
    for f in findings:
        m = _ROLE_TAG.match(f.message)
        role = m.group(1) if m else ""
        body = f.message[m.end():] if m else f.message
        key = (f.code, f.path, body)
        if key not in groups:
            groups[key] = []
            order.append((key, f))
        if role and role not in groups[key]:
            groups[key].append(role)
    out = []
    for key, f in order:
        roles = groups[key]
        msg = key[2] if single or not roles else f"[{', '.join(roles)}] {key[2]}"
        out.append(replace(f, message=msg))
    return out


def _overridden(doc: Document, overrides: Sequence[Override]) -> Document:
    return doc.with_data(apply_overrides(doc.data, overrides), [o.path for o in overrides])


# -- JSON Schema errors -> findings ------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _fast() -> Any:
    try:
        return compile_check(schema())
    except NotImplementedError:  # a keyword the fast path does not know: always use jsonschema
        return None


@functools.lru_cache(maxsize=1)
def _generated() -> Any:
    return generate_check(schema()) if _fast() is not None else None


# Documents checked before switching to the generated check: compiling it costs a few milliseconds, which a
# one-file run (editors, CI hooks) should not pay; from here on it saves tens of microseconds per file.
_GENERATE_AFTER = 32
_checked = 0


def schema_errors(data: Any) -> list[Finding]:
    """Every JSON Schema violation of a deployment document as SCH00x findings."""
    global _checked
    _checked += 1
    fast = _generated() if _checked > _GENERATE_AFTER else _fast()
    if fast is not None and fast(data):
        return []  # certainly valid: skip jsonschema's slower walk (see fastschema)
    out: list[Finding] = []
    for err in _compiled().iter_errors(data):
        out.extend(_to_findings(err))
    return out


def _path(parts: Iterable[Any]) -> str:
    p = "$"
    for k in parts:
        p = child_path(p, k)
    return p


def _fmt(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def _to_findings(err: Any) -> list[Finding]:
    path = _path(err.absolute_path)
    kw = err.validator
    desc = err.schema.get("description", "") if isinstance(err.schema, dict) else ""
    field = path[2:] if path != "$" else "the document"
    if kw == "additionalProperties":
        props = err.schema.get("properties", {})
        patterns = list(err.schema.get("patternProperties", {}))
        out = []
        for key in err.instance:
            if key in props or any(re.search(pat, key) for pat in patterns):
                continue
            kpath = child_path(path, key)
            if patterns:  # bucket table: keys are batch sizes
                out.append(Finding(
                    "SCH004", "error", kpath,
                    f"bucket key {key!r} is not a positive integer batch size",
                    "write the batch-size lower bound as an integer key, e.g. `8:` (SGLang silently skips "
                    "non-integer keys)",
                ))
                continue
            close = difflib.get_close_matches(key, list(props), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            out.append(Finding(
                "SCH001", "error", kpath, f"unknown key {key!r} in {field}",
                f"{hint}known keys: {', '.join(props)}",
            ))
        return out
    if kw == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        prop_schema = err.schema.get("properties", {})
        return [
            Finding("SCH003", "error", path, f"{field} is missing required key {k!r}",
                    f"add {k}: ..." + (f" ({prop_schema[k].get('description', '')})"
                                       if isinstance(prop_schema.get(k), dict) and prop_schema[k].get("description")
                                       else ""))
            for k in missing
        ]
    if kw == "type":
        want = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        got = _json_type(err.instance)
        return [Finding("SCH002", "error", path, f"{field} must be {' or '.join(want)}, got {got} {_fmt(err.instance)}",
                        f"write {' or '.join(want)}" + (f": {desc}" if desc else ""))]
    if kw in ("enum", "const"):
        allowed = err.validator_value if kw == "enum" else [err.validator_value]
        close = difflib.get_close_matches(str(err.instance), [str(a) for a in allowed], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return [Finding("SCH004", "error", path, f"{field} is {_fmt(err.instance)}, not one of {_fmt(allowed)}",
                        f"{hint}use one of: {', '.join(_fmt(a) for a in allowed)}")]
    bounds = {
        "minimum": "at least", "maximum": "at most", "exclusiveMinimum": "greater than",
        "exclusiveMaximum": "less than",
    }
    if kw in bounds:
        return [Finding("SCH004", "error", path,
                        f"{field} is {_fmt(err.instance)}; it must be {bounds[kw]} {err.validator_value}",
                        f"use a value {bounds[kw]} {err.validator_value}" + (f" ({desc})" if desc else ""))]
    if kw == "uniqueItems":
        dup = sorted({_fmt(x) for x in err.instance if err.instance.count(x) > 1})
        return [Finding("SCH004", "error", path, f"{field} lists {', '.join(dup)} more than once",
                        "remove the duplicates")]
    if kw in ("minItems", "minProperties"):
        return [Finding("SCH004", "error", path, f"{field} is empty", "add at least one entry"
                        + (f" ({desc})" if desc else ""))]
    if kw == "pattern":
        return [Finding("SCH004", "error", path, f"{field} {_fmt(err.instance)} has the wrong form",
                        desc or f"match the pattern {err.validator_value}")]
    if kw == "minLength":
        return [Finding("SCH004", "error", path, f"{field} is empty", desc or "write a non-empty value")]
    return [Finding("SCH004", "error", path, f"{field}: {err.message}", desc or "see `specctl schema`")]


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def load_deployment(source: str | Path, *, overrides: Sequence[str] = ()) -> Deployment:
    """Load, override and validate a deployment (the contract is `specctl.schemas.deployment`'s)."""
    path = resolve_source(source)
    validator = Validator(overrides=overrides, kind="deployment")
    result = validator.validate_file(path)
    if result.load_error is not None:
        raise result.load_error
    errors = [f for f in result.findings if f.severity == "error"]
    if errors:
        first = errors[0]
        where = f"{path}:{first.line}" if first.line else str(path)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        exc = InvalidInput(
            f"{where}: {first.code} {first.path}: {first.message}{more}",
            hint=f"{first.fix}  Run `specctl validate {path}` for every finding.".strip(),
        )
        exc.findings = errors  # type: ignore[attr-defined]
        raise exc
    return _deployment(result.data or {}, path, tuple(result.findings))


def _deployment(data: dict[str, Any], path: Path, findings: tuple[Finding, ...] = ()) -> Deployment:
    """The `Deployment` of a document that validated (`data`: after overrides)."""
    return Deployment(name=str(data.get("name") or path.stem), path=str(path), raw=data,
                      roles=declared_roles(data), findings=findings)
