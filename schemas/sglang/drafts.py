"""Speculative drafts of an SGLang command: the draft checkpoint's own config.json against
`--speculative-algorithm`, and whether a draft is needed at all, in SGLang's flags.

What SGLang 0.5.23 does, from its code (`arg_groups/speculative_hook.py`, `configs/model_config.py`):
- NEXTN is EAGLE. EAGLE/NEXTN (and EAGLE3/STANDALONE, which run the same handler) without
  `--speculative-draft-model-path` take the target checkpoint itself as the draft for the architectures
  listed in `_handle_eagle_family` (DeepSeek-V3/V3.2/V4, GLM-4.5/5,
  Bailing, Mistral Large 3, HY, Qwen4-Exp: their MTP/NextN head); DSPARK does so when the checkpoint bundles
  a DSpark head (`dspark_*` fields). Every other EAGLE/EAGLE3/STANDALONE/DFLASH run needs the path (an MTP
  head of Qwen3-Next, Qwen3.5 or MiMo is used by passing the model's own path).
- A Gemma 4 assistant draft turns EAGLE/NEXTN into FROZEN_KV_MTP and is refused with EAGLE3
  (`_resolve_speculative_algorithm_alias`).
- An EAGLE3 draft (LlamaForCausalLMEagle3, or a `draft_vocab_size` field that only SGLang's EAGLE3 draft
  models read) run as EAGLE starts, but the draft reads hidden states it was not trained on: almost every
  token is rejected (accept length ~1.0). An EAGLE(1/2) draft run as EAGLE3 gets the three concatenated
  auxiliary hidden states its input layer was not built for.
- Draft tokens are verified by id: the draft's vocab_size must be the target's.

`check_draft(cmd, target_model, draft_config)` and `sglang_draft_findings(...)` never raise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.sglang.command import SGLangCommand
from specctl.schemas.sglang.families import FamilyError, SGLangModel, sglang_model, table

_DOCS = (
    ("MOD706", "EAGLE with an EAGLE3 draft", "error",
     "--speculative-algorithm EAGLE (or NEXTN) with a draft whose config.json is an EAGLE3 draft "
     "(LlamaForCausalLMEagle3, or draft_vocab_size). SGLang loads it, but feeds it the last hidden state "
     "instead of the three auxiliary layers it was trained on.",
     "never: silently ~every draft token rejected (accept length ~1.0), slower than no speculation",
     "use --speculative-algorithm EAGLE3 for an EAGLE3 draft",
     "--speculative-algorithm EAGLE --speculative-draft-model-path sglang-EAGLE3-LLaMA3.1-Instruct-8B",
     "--speculative-algorithm EAGLE3 --speculative-draft-model-path sglang-EAGLE3-LLaMA3.1-Instruct-8B"),
    ("MOD707", "EAGLE3 with an EAGLE draft", "error",
     "--speculative-algorithm EAGLE3 with an EAGLE(1/2) draft (LlamaForCausalLMEagle, Qwen2ForCausalLMEagle ...). "
     "EAGLE3 feeds the draft the concatenation of three auxiliary hidden states; an EAGLE draft's input layer "
     "expects one.",
     "at start-up or the first decode: a shape mismatch in the draft's input projection",
     "use --speculative-algorithm EAGLE for an EAGLE draft (or an EAGLE3 draft)",
     "--speculative-algorithm EAGLE3 --speculative-draft-model-path EAGLE-LLaMA3-Instruct-8B",
     "--speculative-algorithm EAGLE --speculative-draft-model-path EAGLE-LLaMA3-Instruct-8B"),
    ("MOD708", "Gemma 4 assistant draft with EAGLE3", "error",
     "A Gemma 4 assistant draft (Gemma4AssistantForCausalLM) runs as FROZEN_KV_MTP, which SGLang enters from "
     "EAGLE or NEXTN only.",
     "at start-up: 'Gemma4AssistantForCausalLM draft requires --speculative-algorithm NEXTN or EAGLE; EAGLE3 is "
     "not supported for this draft architecture.'",
     "use --speculative-algorithm NEXTN (or EAGLE)",
     "--speculative-algorithm EAGLE3 --speculative-draft-model-path gemma-4-e2b-it-assistant",
     "--speculative-algorithm NEXTN --speculative-draft-model-path gemma-4-e2b-it-assistant"),
    ("MOD710", "IQuest Q1 without its own MTP draft checkpoint", "error",
     "An IQuestQ1ForCausalLM target needs an independent IQuest Q1 MTP draft (model_type iquest_q1_mtp) whose "
     "hidden_size and vocab_size match the target's and whose num_target_layers is the target's "
     "num_hidden_layers (speculative_hook._handle_iquest_q1_mtp_draft).",
     "at start-up: 'IQuest Q1 requires an independent draft model path.' / 'IQuest Q1 requires an independent "
     "MTP draft checkpoint.' / 'MTP draft hidden size and vocabulary must match the target.' / 'MTP draft "
     "target layer count must match the target.'",
     "point --speculative-draft-model-path at the IQuest Q1 MTP checkpoint made for this target",
     "--model-path IQuest-Q1 --speculative-algorithm EAGLE --speculative-draft-model-path IQuest-Q1",
     "--model-path IQuest-Q1 --speculative-algorithm EAGLE --speculative-draft-model-path IQuest-Q1-MTP"),
    ("MOD709", "Gemma 4 assistant draft promoted to FROZEN_KV_MTP", "info",
     "With a Gemma 4 assistant draft SGLang replaces EAGLE/NEXTN by FROZEN_KV_MTP (the assistant reads the "
     "target's frozen KV); rules that depend on the algorithm see FROZEN_KV_MTP.",
     "never: a log line 'promoting --speculative-algorithm ... to FROZEN_KV_MTP'",
     "nothing to change; pass --speculative-algorithm FROZEN_KV_MTP to say so", "", ""),
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
    dest = "speculative_algorithm"
    name = draft.architecture
    out: list[Finding] = []
    if algo in ("EAGLE", "NEXTN") and draft.draft_kind == "eagle3":
        out.append(_f(cmd, "MOD706", "error", dest,
                      f"--speculative-algorithm {algo} with an EAGLE3 draft ({name}): SGLang starts, but the draft "
                      "gets the wrong hidden states and nearly every token is rejected (accept length ~1.0)",
                      "use --speculative-algorithm EAGLE3 for this draft"))
    elif algo == "EAGLE3" and draft.draft_kind == "eagle":
        out.append(_f(cmd, "MOD707", "error", dest,
                      f"--speculative-algorithm EAGLE3 with an EAGLE draft ({name}): EAGLE3 feeds three concatenated "
                      "auxiliary hidden states to a draft built for one",
                      "use --speculative-algorithm EAGLE (NEXTN) for this draft, or an EAGLE3 draft"))
    elif draft.draft_kind == "gemma4_assistant":
        if algo == "EAGLE3":
            out.append(_f(cmd, "MOD708", "error", dest,
                          "Gemma4AssistantForCausalLM draft requires --speculative-algorithm NEXTN or EAGLE; EAGLE3 "
                          "is not supported for this draft architecture (SGLang refuses at start-up)",
                          "use --speculative-algorithm NEXTN"))
        elif algo in ("EAGLE", "NEXTN"):
            out.append(_f(cmd, "MOD709", "info", dest,
                          f"a Gemma 4 assistant draft ({name}): SGLang promotes --speculative-algorithm {algo} to "
                          "FROZEN_KV_MTP", "nothing to change"))
    if target_model is not None and target_model.architecture == "IQuestQ1ForCausalLM" and algo in (
            "EAGLE", "NEXTN", "EAGLE3", "STANDALONE"):
        iq = _iquest_problem(target_model, draft_config, draft)
        if iq is not None:
            out.append(_f(cmd, "MOD710", "error", "speculative_draft_model_path", iq,
                          "point --speculative-draft-model-path at the IQuest Q1 MTP checkpoint of this target"))
            return out
    tv = target_model.vocab_size if target_model is not None else None
    if tv is not None and draft.vocab_size is not None and tv != draft.vocab_size:
        out.append(_f(cmd, "MOD702", "error", "speculative_draft_model_path",
                      f"the draft ({name}) has vocab_size {draft.vocab_size} but the target "
                      f"({target_model.architecture if target_model else '?'}) has {tv}; draft token ids would "
                      "mean different tokens",
                      f"use a draft trained with the target's tokenizer (vocab_size {tv})"))
    return out


def _iquest_problem(target: SGLangModel, draft_config: dict[str, Any], draft: SGLangModel) -> str | None:
    """SGLang's refusal of an IQuest Q1 draft (_handle_iquest_q1_mtp_draft), else None. Sizes the draft's
    config.json does not state (IQuestQ1MTPConfig fills them from target_config or its defaults) are not
    compared."""
    if draft_config.get("model_type") != "iquest_q1_mtp":
        return "IQuest Q1 requires an independent MTP draft checkpoint (SGLang refuses at start-up)"
    inner = draft_config.get("target_config") if isinstance(draft_config.get("target_config"), dict) else {}

    def stated(key: str) -> object:
        return draft_config.get(key, (inner or {}).get(key))

    for key, want in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size)):
        got = stated(key)
        if got is not None and want is not None and got != want:
            return (f"MTP draft hidden size and vocabulary must match the target (SGLang refuses at start-up): "
                    f"the draft's {key} is {got}, the target's {want}")
    layers = draft_config.get("num_target_layers") or (inner or {}).get("num_hidden_layers") or 88
    if layers != len(target.layer_kinds):
        return ("MTP draft target layer count must match the target (SGLang refuses at start-up): the draft's "
                f"num_target_layers is {layers}, the target has {len(target.layer_kinds)} layers")
    return None


def draft_from_target(algo: str, target_config: dict[str, Any] | None,
                      target_model: SGLangModel | None) -> bool:
    """True when SGLang fills --speculative-draft-model-path with --model-path for this target."""
    if target_model is None or target_config is None:
        return False
    if algo in ("EAGLE", "NEXTN", "EAGLE3", "STANDALONE"):  # all run _handle_eagle_family
        return target_model.architecture in table()["speculative"]["draft_defaults_to_target"]
    if algo == "DSPARK":
        tc = target_config.get("text_config") if isinstance(target_config.get("text_config"), dict) else {}
        return any(target_config.get(k) is not None or (tc or {}).get(k) is not None
                   for k in table()["speculative"]["dspark_bundle_fields"])
    return False


def _mod703(cmd: SGLangCommand, algo: str, target_config: dict[str, Any] | None,
            target_model: SGLangModel | None) -> Finding | None:
    if cmd.given("speculative_draft_model_path") or algo not in NEEDS_DRAFT:
        return None
    if draft_from_target(algo, target_config, target_model):
        return None  # SGLang uses the target checkpoint's own MTP/NextN (or bundled DSpark) head
    model_path = cmd.value("model_path")
    fix = "add --speculative-draft-model-path DRAFT_DIR"
    if target_model is not None and target_model.mtp is not None and algo in ("EAGLE", "NEXTN"):
        head = target_model.mtp
        return _f(cmd, "MOD703", "error", "speculative_algorithm",
                  f"--speculative-algorithm {algo} without --speculative-draft-model-path: {target_model.architecture} "
                  f"ships an MTP head ({head.describe()}), but SGLang takes the target as its own draft only for "
                  "DeepSeek/GLM-class architectures; here the draft path stays empty and the draft worker cannot load",
                  f"add --speculative-draft-model-path {model_path} (the model's own path loads its MTP head)")
    if target_model is None and target_config is None:
        return _f(cmd, "MOD703", "warning", "speculative_algorithm",
                  f"--speculative-algorithm {algo} without --speculative-draft-model-path, and the model's config.json "
                  "is not on this host: SGLang needs a draft path unless the target ships an MTP/NextN head it "
                  "loads by itself (DeepSeek-V3/V3.2/V4, GLM-4.5/5 ...)",
                  f"{fix}, or validate where the model's config.json is")
    return _f(cmd, "MOD703", "error", "speculative_algorithm",
              f"--speculative-algorithm {algo} needs --speculative-draft-model-path"
              + (f" ({target_model.architecture} ships no MTP/NextN head SGLang loads by itself)"
                 if target_model is not None else ""),
              f"{fix}, or use --speculative-algorithm NGRAM (no draft model)")


def sglang_draft_findings(cmd: SGLangCommand, target_model: SGLangModel | None,
                          facts_get: Callable[[str], object], findings: list[Finding]) -> list[Finding]:
    """`findings` with the deployment-schema MOD703/MOD702 replaced by these checks in SGLang's flags.

    `facts_get(ref)` is the validator's model-facts lookup (ModelFacts, "absent", or an error text)."""
    try:
        return [f for f in findings if f.code not in ("MOD703", "MOD702")] + _draft_findings(
            cmd, target_model, facts_get)
    except Exception:  # never let a draft check hide the rest of the report
        return findings


def _config_of(got: object) -> dict[str, Any] | None:
    cfg = getattr(got, "config", None)
    return cfg if isinstance(cfg, dict) else None


def _draft_findings(cmd: SGLangCommand, target_model: SGLangModel | None,
                    facts_get: Callable[[str], object]) -> list[Finding]:
    algo = _algorithm(cmd)
    if algo is None:
        return []
    ref = cmd.value("model_path")
    target_config = _config_of(facts_get(ref)) if isinstance(ref, str) and ref else None
    out: list[Finding] = []
    missing = _mod703(cmd, algo, target_config, target_model)
    if missing is not None:
        out.append(missing)
    draft_ref = cmd.value("speculative_draft_model_path")
    if (target_model is not None and target_model.architecture == "IQuestQ1ForCausalLM" and draft_ref == ref
            and algo in ("EAGLE", "NEXTN", "EAGLE3", "STANDALONE")):
        out.append(_f(cmd, "MOD710", "error", "speculative_draft_model_path",
                      "IQuest Q1 requires an independent draft model path (SGLang refuses the target's own path)",
                      "point --speculative-draft-model-path at the IQuest Q1 MTP checkpoint of this target"))
    elif isinstance(draft_ref, str) and draft_ref and draft_ref != ref:
        out += check_draft(cmd, target_model, _config_of(facts_get(draft_ref)))
    return out
