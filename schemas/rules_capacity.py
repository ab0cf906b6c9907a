"""Rule 3, capacity (CAP3xx): the KV pool holds what the speculative decode loop needs at max batch.

Per engine role: every request in a full batch (`serve.max_batch_size`) verifies `steps + 1` tokens
at the largest selectable step and holds at least one page, so the pool (`cache.max_tokens` in pages
of `cache.page_size`) must cover both. Vocabulary agreement of draft and target is MOD702.
"""

from __future__ import annotations

from typing import Any

from specctl.schemas.catalog import RuleDoc, register
from specctl.schemas.deployment import union_candidates
from specctl.schemas.findings import Finding
from specctl.schemas.rules import RuleContext, finding

register(RuleDoc(
    "CAP301", "verify tokens exceed the KV pool", "error",
    "At serve.max_batch_size every request verifies steps + 1 tokens at once (the largest selectable step); "
    "the pool cache.max_tokens must hold them, or a full batch cannot be verified.",
    "Out-of-memory / 'not enough KV cache' at the first full batch, or requests preempted in a loop.",
    "Raise cache.max_tokens to at least max_batch_size * (max steps + 1), or lower serve.max_batch_size or the "
    "largest candidate step.",
    "cache: {max_tokens: 64}\nserve: {max_batch_size: 32}\nspeculative: {num_steps: 3}",
    "cache: {max_tokens: 32768}",
))
register(RuleDoc(
    "CAP302", "KV pool smaller than one page per request", "error",
    "Each running request holds at least one KV page; at serve.max_batch_size the pool needs "
    "max_batch_size * page_size tokens before any request has a prompt.",
    "Requests beyond max_tokens // page_size are never admitted: the configured batch size is unreachable.",
    "Raise cache.max_tokens to at least max_batch_size * page_size (plus prompt lengths), or lower "
    "serve.max_batch_size or cache.page_size.",
    "cache: {page_size: 64, max_tokens: 1024}\nserve: {max_batch_size: 32}",
    "cache: {page_size: 64, max_tokens: 65536}",
))


def _max_steps(spec: dict[str, Any]) -> int:
    if spec.get("algorithm") == "none":
        return 0
    union = union_candidates(spec.get("adaptive"))
    return max([spec.get("num_steps") or 0, *union])


def check(ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    for role, cfg in ctx.engine_roles("cache", "serve"):
        cache, serve, spec = cfg["cache"], cfg["serve"], cfg["speculative"]
        page, pool, batch = cache["page_size"], cache["max_tokens"], serve["max_batch_size"]
        pages = pool // page
        if pages < batch:
            out.append(finding(
                "CAP302", "error", ctx.path(role, "cache", "max_tokens"),
                f"[{role}] cache.max_tokens={pool} holds {pages} pages of {page} tokens, fewer than "
                f"serve.max_batch_size={batch} requests need (one page each)",
                f"raise cache.max_tokens to at least {batch * page}, or lower serve.max_batch_size to {max(pages, 1)}",
            ))
            continue
        # Only the prefill role never verifies draft tokens.
        if not ctx.clean(role, "speculative"):
            continue
        steps = 0 if role == "prefill" else _max_steps(spec)
        need = batch * (steps + 1)
        if steps > 0 and need > pool:
            out.append(finding(
                "CAP301", "error", ctx.path(role, "cache", "max_tokens"),
                f"[{role}] a full batch verifies {batch} x {steps + 1} = {need} tokens (largest step {steps}), "
                f"more than cache.max_tokens={pool}",
                f"raise cache.max_tokens to at least {need}, or lower serve.max_batch_size to {pool // (steps + 1)}",
            ))
    return out
