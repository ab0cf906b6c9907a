"""The end-to-end time budget of one disaggregated request, derived from the deployment.

Contract: `request_budget_s(deployment)` is how long one request may take from the router's point of view:
its PD stages (decode's claim acknowledged, prefill's HTTP half and its KV sent: each bounded by
`transfer.timeout_s` on the engines, `PD_STAGES` of them) plus the longest generation the deployment allows
(the most tokens one request can hold, `min(model context, cache.max_tokens)`, at no slower than
`TOKEN_BOUND_S` a token). The router's request timeout is this budget (as `up` runs it and as the exports
write it), so a decode that stopped answering (SIGSTOP, a hung host) fails its requests within the budget,
not after a fixed ten minutes; a request that is still working within it is never cut.

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
    return min(bounds) if bounds else 4096


def budget_for(timeout_s: float, tokens: int) -> float:
    """`PD_STAGES` transfer timeouts plus `tokens` generated at `TOKEN_BOUND_S` each."""
    return PD_STAGES * float(timeout_s) + int(tokens) * TOKEN_BOUND_S


def request_budget_s(deployment: Deployment) -> int:
    """The router's request timeout for `deployment`, in whole seconds (see the module docstring)."""
    decode = deployment.role("decode")
    timeout_s = decode.transfer.timeout_s
    return math.ceil(budget_for(timeout_s, max_request_tokens(decode)))
