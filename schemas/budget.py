"""The end-to-end time budget of one disaggregated request, derived from the deployment, and the generation limit
that keeps it finite.

Contract:
- `request_budget_s(deployment)` is how long one request may take from the router's point of view: its PD
  stages (decode's claim acknowledged, prefill's HTTP half paired with it, its KV sent: each bounded by
  `transfer.timeout_s` on the engines, `PD_STAGES` of them; a prompt's prefill is inside the last one) plus the
  longest generation the deployment allows, `generation_limit(role)` tokens at no slower than `TOKEN_BOUND_S`
  a token. It is the router's request timeout, the one figure `up`, `serve --role router` and every export
  that runs a router (`export sglang`'s router.sh, rbg, lws, slurm) write, so a decode that stopped answering
  (SIGSTOP, a hung host) fails its requests within it, and a request still working within it is never cut.
- The budget is finite and at most `budget_ceiling_s(transfer.timeout_s)` = `PD_STAGES x timeout_s +
  GENERATION_CEILING_S`, whatever the context: `generation_limit(role)` is the model's context and KV pool
  bound, capped at `MAX_NEW_TOKENS` (`GENERATION_CEILING_S` of generation at `TOKEN_BOUND_S` a token).
- The front enforces that limit: the prefill and decode engines refuse a request asking to generate more than
  `MAX_NEW_TOKENS` (400 naming `max_tokens`), so no admitted request outlives the router's timeout by design.
  Engines that do not enforce it (engine: sglang) have such a request cut by the router at the budget.
- The routers cannot cut a stalled stream sooner: neither smg 1.13.0 nor sglang-router 0.3.2 has an idle or
  per-chunk upstream timeout, and `--request-timeout-secs` bounds the whole request (its streamed body included).

Torch-free (the router's argv and the exports import it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specctl.schemas.deployment import Deployment
    from specctl.schemas.role_config import RoleConfig

PD_STAGES = 3  # claim acknowledged, HTTP half paired with its claim, KV sent: each within transfer.timeout_s
TOKEN_BOUND_S = 0.05  # the slowest a live decode may generate one token (one step of a full batch)
DEFAULT_TIMEOUT_S = 30.0
# The longest generation one request may run behind the router (smg's own default request timeout).
GENERATION_CEILING_S = 1800
MAX_NEW_TOKENS = int(GENERATION_CEILING_S / TOKEN_BOUND_S)  # the most tokens one disaggregated request generates
DEFAULT_CONTEXT = 4096  # the bound of a role whose model and pool say nothing


def max_request_tokens(role: RoleConfig) -> int:
    """The most tokens (prompt + completion) one request of `role` can hold: the model's context, bounded by
    the KV pool (`cache.max_tokens`)."""
    pool = role.cache.max_tokens
    context = 0
    target = role.model.target
    if target:
        from specctl.errors import SpecctlError
        from specctl.schemas.model_facts import load_model_facts

        try:
            context = int(load_model_facts(str(target), engine=False).config.get("max_position_embeddings") or 0)
        except SpecctlError:
            context = 0  # a model validate would refuse: the pool still bounds the request
    bounds = [n for n in (pool, context) if n > 0]
    return min(bounds) if bounds else DEFAULT_CONTEXT


def generation_limit(role: RoleConfig) -> int:
    """The most tokens one request of `role` may generate: what its context and pool hold, at most
    `MAX_NEW_TOKENS`."""
    return min(max_request_tokens(role), MAX_NEW_TOKENS)


def budget_for(timeout_s: float, tokens: int) -> float:
    """`PD_STAGES` transfer timeouts plus `tokens` generated at `TOKEN_BOUND_S` each."""
    return PD_STAGES * float(timeout_s) + int(tokens) * TOKEN_BOUND_S


def budget_ceiling_s(timeout_s: float) -> float:
    """The most a request's budget can be with this `transfer.timeout_s`, whatever the model's context."""
    return budget_for(timeout_s, MAX_NEW_TOKENS)


def transfer_timeout_s(role: RoleConfig) -> float:
    return role.transfer.timeout_s


def request_budget_s(deployment: Deployment) -> int:
    """The router's request timeout for `deployment`, in whole seconds (see the module docstring)."""
    decode = deployment.role("decode")
    return math.ceil(budget_for(transfer_timeout_s(decode), generation_limit(decode)))
