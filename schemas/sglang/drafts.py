"""Speculative drafts of an SGLang command: the draft checkpoint's own config.json against
`--speculative-algorithm`, in SGLang's flags, for what SGLang does not check at start-up.

What SGLang decides at start-up about drafts (NEXTN is EAGLE; the target as its own draft for MTP
architectures; a Gemma 4 assistant draft turning EAGLE/NEXTN into FROZEN_KV_MTP and refused with EAGLE3;
IQuest Q1 drafts; an EAGLE3 draft run as EAGLE) is `startup.predict_startup`'s, proven against SGLang's
own resolution. Here, what SGLang never refuses but runs wrongly:
- an EAGLE(1/2) draft run as EAGLE3 gets the three concatenated auxiliary hidden states its input layer
  was not built for (MOD707);
- draft tokens are verified by id: the draft's vocab_size must be the target's (MOD702).

`check_draft(cmd, target_model, draft_config)` and `sglang_draft_findings(...)` never raise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.sglang.command import SGLangCommand
from specctl.schemas.sglang.families import FamilyError, SGLangModel, sglang_model

_DOCS = (
    ("MOD707", "EAGLE3 with an EAGLE draft", "error",
     "--speculative-algorithm EAGLE3 with an EAGLE(1/2) draft (LlamaForCausalLMEagle, Qwen2ForCausalLMEagle ...). "
     "EAGLE3 feeds the draft the concatenation of three auxiliary hidden states; an EAGLE draft's input layer "
     "expects one.",
     "at start-up or the first decode: a shape mismatch in the draft's input projection",
     "use --speculative-algorithm EAGLE for an EAGLE draft (or an EAGLE3 draft)",
     "--speculative-algorithm EAGLE3 --speculative-draft-model-path EAGLE-LLaMA3-Instruct-8B",
     "--speculative-algorithm EAGLE --speculative-draft-model-path EAGLE-LLaMA3-Instruct-8B"),
)
for _d in _DOCS:
    register(RuleDoc(*_d))  # type: ignore[arg-type]
SGLANG_ONLY = frozenset(d[0] for d in _DOCS)  # codes only SGLang commands can raise

NEEDS_DRAFT = frozenset({"EAGLE", "NEXTN", "EAGLE3", "STANDALONE", "DFLASH", "DSPARK", "FROZEN_KV_MTP"})


def _f(cmd: SGLangCommand, code: str, sev: str, dest: str, msg: str, fix: str) -> Finding:
    line, col = cmd.where(dest)
    return Finding(code, sev, cmd.flag_name(dest), msg, fix, line, col)  # type: ignore[arg-type]


def _algorithm(cmd: SGLangCommand) -> str | None:
    algo = cmd.value("speculative_algorithm")
    return algo.upper() if isinstance(algo, str) and algo.upper() != "NONE" else None


def check_draft(cmd: SGLangCommand, target_model: SGLangModel | None,
                draft_config: dict[str, Any] | None) -> list[Finding]:
    """Findings about the draft checkpoint's config.json for this command's algorithm; [] when unknown."""
    try:
        return _check_draft(cmd, target_model, draft_config)
    except Exception:  # a garbled config is the loader's finding (MOD704), never a crash here
        return []


def _check_draft(cmd: SGLangCommand, target_model: SGLangModel | None,
                 draft_config: dict[str, Any] | None) -> list[Finding]:
    algo = _algorithm(cmd)
    if algo is None or algo not in NEEDS_DRAFT or draft_config is None:
        return []
    try:
        draft = sglang_model(draft_config)
    except FamilyError:
        return []
    name = draft.architecture
    out: list[Finding] = []
    if algo == "EAGLE3" and draft.draft_kind == "eagle":
        out.append(_f(cmd, "MOD707", "error", "speculative_algorithm",
                      f"--speculative-algorithm EAGLE3 with an EAGLE draft ({name}): EAGLE3 feeds three concatenated "
                      "auxiliary hidden states to a draft built for one",
                      "use --speculative-algorithm EAGLE (NEXTN) for this draft, or an EAGLE3 draft"))
    tv = target_model.vocab_size if target_model is not None else None
    if tv is not None and draft.vocab_size is not None and tv != draft.vocab_size:
        out.append(_f(cmd, "MOD702", "error", "speculative_draft_model_path",
                      f"the draft ({name}) has vocab_size {draft.vocab_size} but the target "
                      f"({target_model.architecture if target_model else '?'}) has {tv}; draft token ids would "
                      "mean different tokens",
                      f"use a draft trained with the target's tokenizer (vocab_size {tv})"))
    return out


def sglang_draft_findings(cmd: SGLangCommand, target_model: SGLangModel | None,
                          facts_get: Callable[[str], object], findings: list[Finding]) -> list[Finding]:
    """`findings` with the deployment-schema MOD702 replaced by these checks in SGLang's flags.

    `facts_get(ref)` is the validator's model-facts lookup (ModelFacts, "absent", or an error text)."""
    try:
        return [f for f in findings if f.code != "MOD702"] + _draft_findings(cmd, target_model, facts_get)
    except Exception:  # never let a draft check hide the rest of the report
        return findings


def _config_of(got: object) -> dict[str, Any] | None:
    cfg = getattr(got, "config", None)
    return cfg if isinstance(cfg, dict) else None


def _draft_findings(cmd: SGLangCommand, target_model: SGLangModel | None,
                    facts_get: Callable[[str], object]) -> list[Finding]:
    if _algorithm(cmd) is None:
        return []
    ref = cmd.value("model_path")
    draft_ref = cmd.value("speculative_draft_model_path")
    if isinstance(draft_ref, str) and draft_ref and draft_ref != ref:
        return check_draft(cmd, target_model, _config_of(facts_get(draft_ref)))
    return []
