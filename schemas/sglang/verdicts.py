"""SGLang's own start-up verdicts as findings (`specctl validate --resolve`), labelled as SGLang's.

`resolve_findings(targets, request)` runs SGLang's resolution (`resolver.resolve`: the SGLang of
`request.python`, in child processes, for the declared GPU) on every launch command of the validated
files and answers, per file, the findings:
- SGL900 (info): SGLang accepted the command; the values it resolved that matter for serving;
- SGL901 (error): SGLang refused the command at start-up: its exception, message and raise site;
- SGL902 (warning): SGLang's resolution could not run (no SGLang for that interpreter, a release that does
  not load, a crash, a timeout): the check was not made;
- SGL903 (warning): a prefill and a decode command that SGLang resolves to different values of a field both
  sides must share (page size, KV dtype, speculative shape, attention TP); SGL904 (info) for fields that may
  differ by design (attention backends).
Nothing here imports torch or sglang; the child does, in its own process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.deployment import Deployment
from specctl.schemas.findings import Finding
from specctl.schemas.sglang.command import _launcher, parse_command_text, shell_words
from specctl.schemas.sglang.export import export_commands
from specctl.schemas.sglang.resolver import (
    Release,
    ResolveCase,
    ResolverUnavailable,
    Verdict,
    has_sglang,
    resolve,
)
from specctl.schemas.sglang.startup import GPUS

_WHEN = "specctl validate --resolve: SGLang's own prepare_server_args + ServerArgs.resolve_once() on a declared GPU"
for _doc in (
    RuleDoc("SGL900", "SGLang's own start-up resolution accepts the command", "info",
            "SGLang resolved this command on the declared GPU without an error; the finding lists what it chose "
            "silently (speculative algorithm and shape, attention backends, page size, ...).", _WHEN,
            "nothing to fix; compare the values with what you meant to run"),
    RuleDoc("SGL901", "SGLang's own start-up resolution refuses the command", "error",
            "SGLang raised while resolving this command's flags, environment and config.json on the declared "
            "GPU: the server would stop before loading weights. The message is SGLang's, with its raise site.",
            _WHEN + " raised (the exception is quoted)", "change the flag or variable SGLang's message names",
            "--speculative-draft-window-size 0", "--speculative-draft-window-size 512"),
    RuleDoc("SGL902", "SGLang's own start-up resolution could not run", "warning",
            "The interpreter given has no SGLang, its SGLang does not load with the device declared, or the "
            "resolution crashed or timed out: SGLang's own checks were not made for this command.", _WHEN,
            "point --sglang-python (or the deployment's sglang.python) at the Python that has SGLang installed"),
    RuleDoc("SGL903", "prefill and decode resolve to different values they must share", "warning",
            "SGLang's own resolution of the two commands gives different page sizes, KV cache dtypes, speculative "
            "algorithm/steps/topk/draft tokens or attention TP: KV and draft state handed from prefill to decode "
            "would not fit.", _WHEN + ", both roles",
            "give both commands the same value (set the flag explicitly on both sides)",
            "prefill: (page size chosen by SGLang: 1)", "--page-size 64 on both"),
    RuleDoc("SGL904", "prefill and decode resolve to different attention backends", "info",
            "SGLang chose different attention backends for the two roles (for example by mode or GPU): allowed, "
            "listed so that the difference is seen.", _WHEN + ", both roles",
            "set --attention-backend on both commands if the two roles must match"),
):
    register(_doc)

# Fields both roles of a PD pair must agree on, and fields shown on acceptance.
SHARED = ("page_size", "kv_cache_dtype", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
          "speculative_num_draft_tokens", "speculative_draft_model_path")
BACKENDS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
            "speculative_draft_attention_backend")
SHOWN = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
         "speculative_draft_model_path", "speculative_adaptive", "attention_backend", "prefill_attention_backend",
         "decode_attention_backend", "page_size", "kv_cache_dtype", "max_running_requests", "chunked_prefill_size",
         "mem_fraction_static", "disaggregation_mode", "disaggregation_transfer_backend")


@dataclass(frozen=True)
class ResolveRequest:
    """What --resolve asks: the GPU to declare, the interpreter whose SGLang resolves, the time allowed."""

    gpu: str = "H100"
    python: str | None = None  # None: the deployment's sglang.python, else this interpreter if it has SGLang
    case_timeout: float = 60.0
    start_timeout: float = 300.0


@dataclass
class Target:
    """One launch command to resolve: the file it came from, its role, argv, env and interpreter."""

    name: str
    role: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None  # from the deployment's sglang.python
    cwd: str | None = None


def attention_tp(resolved: Mapping[str, Any]) -> int | None:
    tp, dp = resolved.get("tp_size"), resolved.get("attn_dp_size") or 1
    if not isinstance(tp, int) or not isinstance(dp, int) or dp < 1:
        return None
    return tp // dp


def _python_for(target: Target, request: ResolveRequest) -> str | None:
    if request.python:
        return request.python
    if target.python:
        return target.python
    return sys.executable if has_sglang() else None


def _label(release: Release, gpu: str) -> str:
    return f"SGLang {release.sglang}'s own start-up resolution ({gpu})"


def _show(resolved: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={resolved[k]}" for k in SHOWN if resolved.get(k) not in (None, False))


def verdict_finding(v: Verdict, release: Release, gpu: str, role: str) -> Finding:
    label = _label(release, gpu)
    if v.ok:
        return Finding("SGL900", "info", "$", f"{label} accepts the {role} command: {_show(v.resolved)}",
                       "nothing to fix; these are the values SGLang will run")
    assert v.error is not None
    if v.infrastructure:
        return Finding("SGL902", "warning", "$", f"{label} could not finish: {v.error.type}: {v.error.message}",
                       "rerun with a longer time or check the interpreter's SGLang install (--sglang-python PATH)")
    where = f" (raised at {v.error.site} in {v.error.function})" if v.error.site else ""
    return Finding("SGL901", "error", "$", f"{label} refuses the {role} command: {v.error.type}: "
                   f"{v.error.message.strip()}{where}", "change what SGLang's message names, then validate again")


def pair_findings(prefill: Mapping[str, Any], decode: Mapping[str, Any]) -> list[Finding]:
    """The fields two resolved roles disagree on (SGL903 for shared fields, SGL904 for backends)."""
    out: list[Finding] = []
    diffs = [f"{k}: prefill {prefill.get(k)!r}, decode {decode.get(k)!r}" for k in SHARED
             if prefill.get(k) != decode.get(k)]
    ptp, dtp = attention_tp(prefill), attention_tp(decode)
    if ptp != dtp:
        diffs.append(f"attention TP (tp_size / attn_dp_size): prefill {ptp}, decode {dtp}")
    if diffs:
        out.append(Finding("SGL903", "warning", "$", "SGLang resolves the prefill and decode commands differently: "
                           + "; ".join(diffs), "give both commands the same value, explicitly"))
    bdiffs = [f"{k}: prefill {prefill.get(k)!r}, decode {decode.get(k)!r}" for k in BACKENDS
              if prefill.get(k) != decode.get(k)]
    if bdiffs:
        out.append(Finding("SGL904", "info", "$", "SGLang chooses different attention backends per role: "
                           + "; ".join(bdiffs), "set --attention-backend on both commands if they must match"))
    return out


def resolve_findings(targets: Sequence[Target], request: ResolveRequest) -> list[list[Finding]]:
    """Per target, SGLang's verdict as findings; prefill/decode pairs (in order) also diffed. Never raises."""
    if request.gpu not in GPUS:
        raise ValueError(f"--gpu {request.gpu!r}: one of {', '.join(GPUS)}")
    out: list[list[Finding]] = [[] for _ in targets]
    groups: dict[tuple[str, str | None], list[int]] = {}
    for i, t in enumerate(targets):
        py = _python_for(t, request)
        if py is None:
            out[i].append(Finding(
                "SGL902", "warning", "$", "SGLang's own start-up resolution was not run: this interpreter has no "
                "SGLang and none was named", "pass --sglang-python /path/to/python (the Python that has SGLang), "
                "or set sglang.python in the deployment"))
            continue
        groups.setdefault((py, t.cwd), []).append(i)
    resolved: dict[int, Mapping[str, Any]] = {}
    for (py, cwd), idxs in groups.items():
        cases = [ResolveCase(tuple(targets[i].argv), dict(targets[i].env), request.gpu) for i in idxs]
        try:
            release, verdicts = resolve(cases, python=py, cwd=cwd or os.getcwd(), case_timeout=request.case_timeout,
                                        start_timeout=request.start_timeout)
        except ResolverUnavailable as exc:
            for i in idxs:
                out[i].append(Finding("SGL902", "warning", "$", f"SGLang's own start-up resolution could not run: "
                                      f"{exc}", "point --sglang-python at the Python that has SGLang installed"))
            continue
        for i, v in zip(idxs, verdicts, strict=True):
            out[i].append(verdict_finding(v, release, request.gpu, targets[i].role))
            if v.ok:
                resolved[i] = v.resolved
    prefills = [i for i, t in enumerate(targets) if t.role == "prefill"]
    decodes = [i for i, t in enumerate(targets) if t.role == "decode"]
    for p, d in zip(prefills, decodes, strict=False):
        if p in resolved and d in resolved:
            out[d].extend(pair_findings(resolved[p], resolved[d]))
    return out


def command_target(path: str) -> Target | None:
    """The SGLang launch command of a command file, as SGLang's own parser would receive it."""


    text = Path(path).read_text(encoding="utf-8", errors="replace")
    cmd = parse_command_text(text, name=path, base_dir=Path(path).parent)
    if not cmd.recognised:
        return None
    for words in shell_words(text):
        found = _launcher(words)
        if found is not None:
            argv = [w.text for w in words[found[1]:] if not w.op]
            return Target(name=path, role=cmd.role, argv=argv, env=dict(cmd.env))
    return None


def deployment_targets(dep: Deployment, folder: str) -> list[Target]:
    """Each role's exported SGLang command of an `engine: sglang` deployment (files it names go to `folder`)."""

    path = dep.path or dep.name
    if dep.engine != "sglang":
        return []
    cmds = export_commands(dep)
    written: dict[str, str] = {}
    for name, text in cmds.files.items():
        written[name] = os.path.join(folder, os.path.basename(name))
        with open(written[name], "w", encoding="utf-8") as fh:
            fh.write(text)
    out = []
    for role in ("prefill", "decode", "colocated"):
        argv = getattr(cmds, role)
        if not argv:
            continue
        start = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
        out.append(Target(name=path, role=role, argv=[written.get(a, a) for a in argv[start:]],
                          python=dep.sglang_python))
    return out
