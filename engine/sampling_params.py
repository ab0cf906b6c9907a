"""SamplingParams: one request's frozen sampling recipe, built once where the request enters (the HTTP
edge, the CLI, a benchmark) and carried as is to the engine.

Contract: invalid values raise `InvalidInput` naming the field (they come from users: CLI flags, HTTP
bodies). `to_json()` is the recipe as a JSON object (the fields the request set: penalties, logit_bias and
logprobs only when used), the form written to SGLang's metrics file. Torch-free, so the HTTP front builds it
without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specctl.errors import InvalidInput

# Below this temperature a row is treated as greedy (dividing by ~0 would overflow).
GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request. `temperature == 0` means greedy."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # 1.0 = no nucleus filter
    seed: int | None = None  # per-request generator seed; None = fresh randomness
    stop: tuple[str, ...] = ()  # output is cut where any of these strings first appears
    ignore_eos: bool = False
    logprobs: int | None = None  # report each token's log-prob and this many top alternatives; None = off
    # OpenAI's logit processors (engine/penalties.py), over the generated tokens.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)

    def __post_init__(self) -> None:
        # Users pass lists (JSON bodies); keep the dataclass hashable and immutable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidInput(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise InvalidInput(f"temperature must be >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidInput(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise InvalidInput(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidInput(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.logit_bias, tuple):
            object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in self.logit_bias))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -2.0 <= value <= 2.0:
                raise InvalidInput(f"{name} must be a number in [-2, 2], got {value!r}")
        if any(t < 0 or not -100.0 <= b <= 100.0 for t, b in self.logit_bias):
            raise InvalidInput("logit_bias maps token ids >= 0 to biases in [-100, 100]")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= 20):
            raise InvalidInput(f"logprobs must be an integer in [0, 20] (top alternatives), got {self.logprobs!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidInput(f"stop strings must be non-empty strings, got {list(self.stop)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "seed": self.seed, "stop": list(self.stop), "ignore_eos": self.ignore_eos,
        }  # fmt: skip
        if self.presence_penalty:
            out["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty:
            out["frequency_penalty"] = self.frequency_penalty
        if self.logit_bias:
            out["logit_bias"] = [[t, b] for t, b in self.logit_bias]
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        return out
