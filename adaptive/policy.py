"""The adaptive-steps policy: per batch-size bucket, an EMA of accepted drafts picks the speculative steps.

One implementation, shared by the engine's speculative decoder and `specctl adaptive simulate`, with
SGLang's EMA semantics exactly (docs/adaptive.md), so a user's SGLang adaptive config behaves
the same here:

- routing: pad the batch size up to the smallest graph batch size >= it (if any), then the bucket with
  the largest key <= that size (the smallest bucket if none is);
- a bucket starts at the initial steps if they are among its candidates, else at its middle candidate;
  its EMA starts at `steps - 1`;
- after each verify the routed bucket's EMA absorbs the batch mean of accepted drafts (not while
  steps == 0); an empty batch changes nothing and is not counted; no decision during the first
  `warmup_batches` batches, then one every `update_interval` batches.

Two opt-in specctl knobs depart from SGLang; at their defaults the policy is SGLang's exactly. The first,
`zero_backoff` (default 1): at steps 0 SGLang probes the next candidate at every decision, so a drafter
that is never right still runs half its batches at the probe step. With `zero_backoff: N > 1` a stay at 0
lasts `stay` decisions before the probe; a probe that falls back to 0 at the next decision doubles `stay`
(up to N), one that holds resets it to 1. The stays run 1, 2, 4, ..., N intervals, so a useless drafter
costs 1/(N + 1) of the batches.

The second, `zero_threshold` (default unset): the EMA at or below which a bucket steps down to 0. SGLang's
bar is 0.5 + down_hysteresis, the same shift as every other step's `s - 0.5 + down_hysteresis`: a wide
negative down_hysteresis, which keeps a deep step while only half its drafts are accepted (a verify that
costs little more than a plain step), would also leave 0 out of reach of a drafter that is never right.

The policy only decides; it never allocates. The engine prebuilds a runtime state for every step in
`specctl.schemas.adaptive.step_coverage(...).required_states`, so whatever this returns is built.
Torch-free.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specctl.errors import UsageError
from specctl.schemas.adaptive import AdaptiveConfig, Bucket


@dataclass(frozen=True)
class Switch:
    """One step change of one bucket: when, which bucket, from/to steps, and the EMA that caused it."""

    time: float
    bucket: int
    from_steps: int
    to_steps: int
    ema: float

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "bucket": self.bucket,
            "from_steps": self.from_steps,
            "to_steps": self.to_steps,
            "ema": self.ema,
        }


class BucketState:
    """The live state of one bucket (SGLang's AdaptiveStepSlot): current steps, EMA, batch count."""

    def __init__(self, bucket: Bucket, initial_steps: int) -> None:
        self.bucket = bucket
        self.candidates = bucket.candidate_steps  # sorted, unique
        self.knobs = bucket.knobs
        self.steps = bucket.start_steps(initial_steps)
        # A neutral start: "one draft fewer than we run is accepted".
        self.ema = float(self.steps - 1)
        self.batches = 0
        # zero_backoff (specctl only; inert at its default 1): decisions the current stay at 0 lasts, the
        # decisions spent at 0 so far, and whether the last decision was a probe up from 0.
        self.zero_stay = 1
        self.zero_held = 0
        self.probing = False

    def update(self, accepted: Sequence[int]) -> bool:
        """Absorb one verify result (accepted drafts per request); True when the steps changed."""
        if not accepted:
            return False
        k = self.knobs
        if self.steps > 0:
            # Steps 0 drafts nothing, so it observes nothing about acceptance: the EMA stays put.
            batch_avg = sum(accepted) / len(accepted)
            self.ema = (1 - k.ema_alpha) * self.ema + k.ema_alpha * batch_avg
        self.batches += 1
        if self.batches <= k.warmup_batches:
            return False
        if (self.batches - k.warmup_batches) % k.update_interval != 0:
            return False
        return self._decide()

    def _decide(self) -> bool:
        k = self.knobs
        cands = self.candidates
        old = self.steps
        idx = old_idx = cands.index(old)

        if old == 0:
            if k.zero_backoff > 1:
                # Back-off: hold at 0 until this stay's decisions are spent, then probe.
                self.zero_held += 1
                if self.zero_held < self.zero_stay:
                    return False
                self.zero_held = 0
            # Steps 0 learns nothing, so it always probes the next candidate up.
            idx = min(idx + 1, len(cands) - 1)
            target = cands[idx]
            if target > 0 and self.ema < 0:
                # A bucket that started at 0 has no history (EMA -1): probe from the target's neutral EMA.
                self.ema = float(target - 1)
            self.probing = k.zero_backoff > 1 and target > 0
            return self._apply(target)

        # Step down while the EMA does not justify the current step: at steps s about s - 0.5 drafts
        # must be accepted; the hysteresis shifts the threshold. Dropping to 0 needs EMA <= 0.5 + hyst
        # (SGLang), or <= zero_threshold when set.
        while idx > 0:
            prev = cands[idx - 1]
            threshold = k.zero_bar if prev == 0 else prev - 0.5 + k.down_hysteresis
            if self.ema <= threshold:
                idx -= 1
            else:
                break
        if idx == old_idx:
            # Only when it did not move down: climb while the EMA exceeds the current step's bar.
            while idx < len(cands) - 1:
                if self.ema > cands[idx] - 0.5 + k.up_hysteresis:
                    idx += 1
                else:
                    break
        target = cands[idx]
        if k.ceiling_coeff > 0:
            # The ceiling only caps holds and drops (target <= old), never a climb, so the policy can
            # still explore upward and let the EMA catch up.
            ceiling = max(1, math.ceil(self.ema * k.ceiling_coeff))
            if ceiling < target <= old:
                while idx > 0 and cands[idx] > ceiling:
                    idx -= 1
                target = cands[idx]
        if self.probing:
            # The decision after a probe from 0 judges it: back to 0 doubles the next stay, else reset.
            self.probing = False
            self.zero_stay = min(2 * self.zero_stay, k.zero_backoff) if target == 0 else 1
        return self._apply(target)

    def _apply(self, target: int) -> bool:
        if target == self.steps:
            return False
        self.steps = target
        return True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "steps": self.steps,
            "ema": self.ema,
            "batches": self.batches,
            "candidate_steps": list(self.candidates),
        }
        if self.knobs.zero_backoff > 1:
            out["zero_stay"] = self.zero_stay
        return out


class AdaptivePolicy:
    """Routes batch sizes to buckets and adapts each bucket's steps from verify results.

    `clock` stamps switches (`time.monotonic` in the engine; the simulator passes the trace index).
    """

    def __init__(
        self,
        cfg: AdaptiveConfig,
        *,
        initial_steps: int,
        graph_batch_sizes: Sequence[int] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cfg.strategy != "ema":
            raise UsageError(
                f"adaptive strategy {cfg.strategy!r} is not implemented by specctl (only 'ema'); "
                "throughput_aware needs SGLang's start-up cost profiling",
                hint='set strategy to "ema"',
            )
        self.cfg = cfg
        self.initial_steps = initial_steps
        self.graph_batch_sizes = tuple(sorted(set(graph_batch_sizes)))
        self.clock = clock
        self.buckets: dict[int, BucketState] = {b.min_batch_size: BucketState(b, initial_steps) for b in cfg.buckets}
        self._routed: dict[int, BucketState] = {}  # batch size -> its bucket (routing is fixed per config)
        self.switches: list[Switch] = []

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """Union of every bucket's candidates."""
        return self.cfg.union_steps

    def bucket_for_batch(self, batch_size: int) -> BucketState:
        state = self._routed.get(batch_size)
        if state is None:
            key = self.cfg.route(batch_size, self.graph_batch_sizes).min_batch_size
            state = self._routed[batch_size] = self.buckets[key]
        return state

    def steps_for_batch(self, batch_size: int) -> int:
        """The steps to run a batch of this size with (its routed bucket's current steps)."""
        return self.bucket_for_batch(batch_size).steps

    def on_verify_complete(self, accepted: Sequence[int], batch_size: int) -> int | None:
        """Feed one verify result (accepted drafts per request) to the routed bucket.

        Returns the bucket's new steps when this update switched them, else None.
        """
        state = self.bucket_for_batch(batch_size)
        before = state.steps
        if not state.update(accepted):
            return None
        self.switches.append(Switch(self.clock(), state.bucket.min_batch_size, before, state.steps, state.ema))
        return state.steps

    def snapshot(self) -> dict[str, Any]:
        """Per bucket: steps, EMA, batches, candidates; plus the switch timeline."""
        return {
            "buckets": {str(k): s.to_json() for k, s in self.buckets.items()},
            "switches": [s.to_json() for s in self.switches],
        }
