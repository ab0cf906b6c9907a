"""Model facts (MOD7xx): what the target and draft models' config.json say, read without weights.

A `builtin:` model is always checked; a local directory that does not exist here (a path on the
serving host) is reported once as info and the rules that need its facts are skipped.
"""

from __future__ import annotations

from typing import Any

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.model_facts import ModelFacts
from specctl.schemas.rules import RuleContext, finding

register(RuleDoc(
    "MOD701", "model not on this host", "info",
    "A model directory in the file does not exist on the machine running validate (typically a path on the "
    "serving host). Its config.json cannot be read, so the rules that need the model's facts (state_types, "
    "vocabulary, layer layout) are skipped for it; everything else is checked.",
    "None here; on the serving host a wrong path fails at load time.",
    "Run validate on the serving host (or with the model's config.json at that path) for the full check.",
    "model: {target: /models/Llama-3.1-8B}   # not on this laptop", "(same file, validated on the GPU host)",
))
register(RuleDoc(
    "MOD702", "draft and target vocabularies differ", "error",
    "Draft tokens are verified by the target by token id, so draft and target must share one vocabulary.",
    "Garbage acceptance (ids mean different tokens) or an index error in verify when the draft's vocab is larger.",
    "Pick a draft model trained with the target's tokenizer (same vocab_size).",
    "model: {target: llama-3.1-8b}   # vocab 128256\nspeculative: {draft: qwen2-0.5b}   # vocab 151936",
    "speculative: {draft: llama-3.2-1b}   # vocab 128256",
))
register(RuleDoc(
    "MOD703", "algorithm draft without a draft model", "error",
    "speculative.algorithm: draft needs speculative.draft (a builtin:NAME or a model directory). In an SGLang "
    "command: --speculative-algorithm EAGLE/EAGLE3/STANDALONE/DFLASH without --speculative-draft-model-path, "
    "unless the target ships an MTP/NextN head SGLang loads by itself (DeepSeek-V3/V3.2/V4, GLM-4.5/5 ... with "
    "EAGLE/NEXTN) or a bundled DSpark head (DSPARK); Qwen3-Next/Qwen3.5/MiMo heads need the model's own path.",
    "The engine cannot build a drafter and refuses to start.",
    "Set speculative.draft, or use algorithm: ngram (no model) or none. SGLang: add "
    "--speculative-draft-model-path (the model's own path for its MTP head), or --speculative-algorithm NGRAM.",
    "speculative: {algorithm: draft}", "speculative: {algorithm: draft, draft: builtin:tiny-draft}",
))
register(RuleDoc(
    "MOD705", "architecture not known to specctl", "info",
    "The model's config.json names an architecture that neither the builtin engine nor specctl's table of "
    "SGLang families knows; its layers are taken as plain full attention (no state_types) and the other rules "
    "still run.",
    "Possibly a late PD transfer error if the model carries per-request state SGLang registers.",
    "Check cache.state_types by hand against SGLang's setup_state_kv_args for this model.",
))
register(RuleDoc(
    "MOD704", "model config unusable", "error",
    "The model reference is an unknown builtin, or its config.json is unreadable or of an unsupported "
    "architecture, so the engine cannot build it.",
    "Model load fails at start-up.",
    "Use a known builtin (builtin:tiny-hybrid, builtin:tiny-draft) or a Llama/Qwen2/builtin-hybrid Hugging Face "
    "directory with a config.json.",
    "model: {target: builtin:tiny-hybird}", "model: {target: builtin:tiny-hybrid}",
))


def model_refs(ctx: RuleContext, role: str, cfg: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(what, ref, path) for the target and, when used, the draft model of a role."""
    refs = [("target", cfg["model"].get("target"), ctx.path(role, "model", "target"))]
    spec = cfg["speculative"]
    if spec.get("algorithm") == "draft" and spec.get("draft"):
        refs.append(("draft", spec["draft"], ctx.path(role, "speculative", "draft")))
    return refs


def check(ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    for role, cfg in ctx.engine_roles("model", "speculative"):
        facts: dict[str, ModelFacts | None] = {}
        for what, ref, path in model_refs(ctx, role, cfg):
            if not isinstance(ref, str):
                continue
            got = ctx.facts_cache.get(ref)
            facts[what] = got if isinstance(got, ModelFacts) else None
            if got == "absent":
                out.append(finding(
                    "MOD701", "info", path,
                    f"{what} model {ref} is not on this host; checks that need its config.json are skipped "
                    "(the rest is checked)",
                    f"validate on the serving host, or put its config.json at {ref}/config.json here",
                ))
            elif isinstance(got, ModelFacts) and not got.known:
                out.append(finding(
                    "MOD705", "info", path,
                    f"{what} model {ref}: architecture {got.architecture!r} is not one specctl knows; its layers are "
                    "taken as plain attention with no state_types (the rest is checked)",
                    "check cache.state_types by hand, or `specctl model DIR` once the family is supported",
                ))
            elif isinstance(got, str):
                out.append(finding("MOD704", "error", path, f"{what} model: {got}",
                                   "use builtin:tiny-hybrid / builtin:tiny-draft or a supported HF directory"))
        spec = cfg["speculative"]
        if spec.get("algorithm") == "draft" and not spec.get("draft"):
            out.append(finding(
                "MOD703", "error", ctx.path(role, "speculative", "algorithm"),
                "speculative.algorithm is draft but speculative.draft is not set",
                "set speculative.draft (e.g. builtin:tiny-draft), or use algorithm: ngram or none",
            ))
        t, d = facts.get("target"), facts.get("draft")
        if t is not None and d is not None and t.vocab_size != d.vocab_size:
            out.append(finding(
                "MOD702", "error", ctx.path(role, "speculative", "draft"),
                f"draft {d.ref} has vocab_size {d.vocab_size} but target {t.ref} has {t.vocab_size}; "
                "draft token ids would mean different tokens",
                f"use a draft model with the target's tokenizer (vocab_size {t.vocab_size})",
            ))
    return out
