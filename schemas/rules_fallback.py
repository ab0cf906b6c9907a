"""Rule 4, silent fallbacks (FBK4xx, warnings): settings a real engine quietly downgrades or ignores.

Each finding names the setting, what actually happens, and how to say what is meant.
"""

from __future__ import annotations

from typing import Any

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.findings import Finding
from specctl.schemas.rules import RuleContext, finding

register(RuleDoc(
    "FBK401", "adaptive steps with tree drafting", "warning",
    "Adaptive steps need a linear draft chain; with speculative.topk > 1 (tree drafting) SGLang silently "
    "disables the adaptive policy and runs the fixed num_steps.",
    "No error: the buckets are ignored and throughput differs from what was tuned.",
    "Set speculative.topk: 1 to keep adaptive steps, or remove speculative.adaptive.",
    "speculative: {topk: 4, adaptive: {...}}", "speculative: {topk: 1, adaptive: {...}}",
))
register(RuleDoc(
    "FBK402", "batches larger than every graph batch size", "warning",
    "serve.max_batch_size exceeds the largest serve.graph_batch_sizes entry; larger batches are not padded "
    "and run without a prebuilt (captured) state, the slow eager path.",
    "No error: throughput drops at high load.",
    "Add serve.max_batch_size (or a size >= it) to graph_batch_sizes, or lower max_batch_size.",
    "serve: {max_batch_size: 64, graph_batch_sizes: [1, 2, 4, 8]}",
    "serve: {max_batch_size: 64, graph_batch_sizes: [1, 2, 4, 8, 16, 32, 64]}",
))
register(RuleDoc(
    "FBK403", "max_tokens not a multiple of page_size", "warning",
    "The KV pool is allocated in whole pages; the remainder of cache.max_tokens is silently dropped.",
    "No error: the pool is smaller than configured.",
    "Make cache.max_tokens a multiple of cache.page_size.",
    "cache: {page_size: 16, max_tokens: 1000}", "cache: {page_size: 16, max_tokens: 1008}",
))
register(RuleDoc(
    "FBK404", "speculative setting ignored by the algorithm", "warning",
    "A speculative setting does nothing for the chosen algorithm: draft/adaptive/num_steps with algorithm none, "
    "a draft model with ngram, or an ngram block with draft.",
    "No error: the setting is silently ignored (e.g. no speculation at all with algorithm none).",
    "Set speculative.algorithm to the one the setting belongs to, or remove the setting.",
    "speculative: {algorithm: none, draft: builtin:tiny-draft}",
    "speculative: {algorithm: draft, draft: builtin:tiny-draft}",
))
register(RuleDoc(
    "FBK405", "ngram min_match above max_match", "warning",
    "Prompt lookup tries suffix lengths from max_match down to min_match; with min_match > max_match no length "
    "is tried, so nothing is ever drafted.",
    "No error: decoding silently runs without speculation.",
    "Set speculative.ngram.min_match <= max_match.",
    "ngram: {min_match: 5, max_match: 2}", "ngram: {min_match: 2, max_match: 5}",
))
register(RuleDoc(
    "FBK406", "bootstrap_port on a role other than prefill", "warning",
    "Only prefill listens on a bootstrap port (decode registers there); on another role it is ignored.",
    "No error: the port is never opened.",
    "Move bootstrap_port to roles.prefill, or remove it.",
    "roles: {decode: {port: 30002, bootstrap_port: 8998}}",
    "roles: {prefill: {port: 30001, bootstrap_port: 8998}, decode: {port: 30002}}",
))


def check(ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    for role, cfg in ctx.engine_roles("speculative", "serve", "cache"):
        spec, serve, cache = cfg["speculative"], cfg["serve"], cfg["cache"]
        algo = spec["algorithm"]
        if spec.get("adaptive") and algo != "none" and spec.get("topk", 1) > 1:
            out.append(finding(
                "FBK401", "warning", ctx.path(role, "speculative", "topk"),
                f"[{role}] speculative.topk={spec['topk']} (tree drafting) silently disables adaptive steps; "
                f"the fixed num_steps={spec['num_steps']} runs instead",
                "set speculative.topk: 1 to keep adaptive steps, or remove speculative.adaptive",
            ))
        graphs = serve.get("graph_batch_sizes") or []
        if graphs and role != "prefill" and serve["max_batch_size"] > max(graphs):
            out.append(finding(
                "FBK402", "warning", ctx.path(role, "serve", "graph_batch_sizes"),
                f"[{role}] serve.max_batch_size={serve['max_batch_size']} exceeds the largest graph batch size "
                f"{max(graphs)}; batches of {max(graphs) + 1}..{serve['max_batch_size']} run unpadded on the slow path",
                f"add {serve['max_batch_size']} to serve.graph_batch_sizes, or lower serve.max_batch_size "
                f"to {max(graphs)}",
            ))
        if cache["max_tokens"] % cache["page_size"]:
            usable = cache["max_tokens"] // cache["page_size"] * cache["page_size"]
            out.append(finding(
                "FBK403", "warning", ctx.path(role, "cache", "max_tokens"),
                f"[{role}] cache.max_tokens={cache['max_tokens']} is not a multiple of page_size="
                f"{cache['page_size']}; only {usable} tokens are usable",
                f"set cache.max_tokens to {usable} or {usable + cache['page_size']}",
            ))
        out.extend(_ignored(ctx, role, spec))
        ngram = spec.get("ngram") or {}
        if algo == "ngram" and ngram.get("min_match", 1) > ngram.get("max_match", 4):
            out.append(finding(
                "FBK405", "warning", ctx.path(role, "speculative", "ngram", "min_match"),
                f"[{role}] speculative.ngram.min_match={ngram['min_match']} > max_match={ngram['max_match']}: "
                "no suffix length is tried, so nothing is ever drafted",
                f"set min_match <= max_match, e.g. min_match: {ngram['max_match']}, max_match: {ngram['min_match']}",
            ))
    roles = ctx.section("roles")
    if ctx.topology_clean:
        for role, rcfg in roles.items():
            if role != "prefill" and isinstance(rcfg, dict) and "bootstrap_port" in rcfg:
                out.append(finding(
                    "FBK406", "warning", f"$.roles.{role}.bootstrap_port",
                    f"roles.{role}.bootstrap_port={rcfg['bootstrap_port']} is ignored: only prefill opens a "
                    "bootstrap port",
                    f"move bootstrap_port to roles.prefill, or remove it from roles.{role}",
                ))
    return out


def _ignored(ctx: RuleContext, role: str, spec: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    algo = spec["algorithm"]
    raw_spec = _written(ctx, role)
    ignored: list[tuple[str, str]] = []
    if algo == "none":
        ignored += [(k, "algorithm none runs no speculation") for k in ("draft", "adaptive", "num_steps", "ngram")
                    if raw_spec.get(k) not in (None, 0)]
    elif algo == "ngram":
        ignored += [(k, "algorithm ngram drafts from the prompt, not a model") for k in ("draft",)
                    if raw_spec.get(k) is not None]
    elif algo == "draft":
        ignored += [(k, "algorithm draft uses the draft model, not prompt lookup") for k in ("ngram",)
                    if raw_spec.get(k) is not None]
    for key, why in ignored:
        out.append(finding(
            "FBK404", "warning", ctx.path(role, "speculative", key),
            f"[{role}] speculative.{key} is ignored: {why}",
            f"set speculative.algorithm to the one that uses {key}, or remove speculative.{key}",
        ))
    return out


def _written(ctx: RuleContext, role: str) -> dict[str, Any]:
    """The speculative keys the user wrote (top level + role override), without defaults."""
    top = ctx.section("speculative")
    raw = ctx.section("roles").get(role)
    over = raw.get("speculative") if isinstance(raw, dict) else None
    return {**top, **(over if isinstance(over, dict) else {})}
