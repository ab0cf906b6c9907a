"""The adaptive-steps EMA policy (specctl.adaptive.policy): SGLang's semantics, exact thresholds.

Most tests use ema_alpha = 1, so the EMA equals the last batch mean and a threshold can be hit exactly;
a differential test compares the policy with a reference written independently from the documented
semantics (docs/adaptive.md).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specctl.adaptive.policy import AdaptivePolicy, Switch
from specctl.errors import UsageError
from specctl.schemas.adaptive import (
    AdaptiveConfig,
    parse_deployment_adaptive,
    parse_sglang_config,
    sglang_default_config,
)


def config(obj: dict) -> AdaptiveConfig:
    cfg, findings = parse_sglang_config(obj)
    assert cfg is not None and not [f for f in findings if f.severity == "error"], findings
    return cfg


def policy(candidates: list[int], *, initial: int, graphs: tuple[int, ...] = (), **knobs: float) -> AdaptivePolicy:
    knobs = {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1, **knobs}
    return AdaptivePolicy(config({"1": {"candidate_steps": candidates}, **knobs}), initial_steps=initial,
                          graph_batch_sizes=graphs)


def feed(p: AdaptivePolicy, mean: float, bs: int = 1) -> int | None:
    """One verify of n requests whose accepted counts average to exactly `mean` (the float literal)."""
    n = next(n for n in (1, 2, 4, 5, 10, 20) if float(round(mean * n)) == mean * n)
    total = round(mean * n)
    accepted = [total // n + (1 if i < total % n else 0) for i in range(n)]
    assert sum(accepted) / len(accepted) == mean
    return p.on_verify_complete(accepted, bs)


# -- start ------------------------------------------------------------------------------------------


def test_slot_starts_at_initial_or_middle_with_neutral_ema() -> None:
    p = AdaptivePolicy(sglang_default_config(), initial_steps=3)
    snap = p.snapshot()["buckets"]
    assert {k: (v["steps"], v["ema"]) for k, v in snap.items()} == {
        "1": (3, 2.0), "8": (3, 2.0), "32": (1, 0.0), "64": (0, -1.0),
    }
    p = AdaptivePolicy(sglang_default_config(), initial_steps=5)
    assert [p.steps_for_batch(b) for b in (1, 8, 32, 64)] == [5, 1, 1, 0]  # [0,1,3] -> sorted[3//2] = 1


def test_routing_with_graph_padding() -> None:
    p = AdaptivePolicy(sglang_default_config(), initial_steps=5, graph_batch_sizes=(1, 2, 4, 16))
    assert p.steps_for_batch(4) == 5
    assert p.steps_for_batch(5) == 1  # padded to 16 -> bucket 8
    q = AdaptivePolicy(sglang_default_config(), initial_steps=5)
    assert q.steps_for_batch(5) == 5  # unpadded: bucket 1


# -- counting ---------------------------------------------------------------------------------------


def test_warmup_then_every_interval() -> None:
    p = policy([1, 2, 3, 4, 5, 6, 7], initial=1, warmup_batches=3, update_interval=2)
    switched_at = [i for i in range(1, 12) if feed(p, 7) is not None]
    # No decision in batches 1..3; then batches 5, 7, 9, 11 decide (each climbs as far as the EMA allows).
    assert switched_at == [5]
    assert p.steps_for_batch(1) == 7
    p = policy([1, 2, 3, 4, 5, 6, 7], initial=1, warmup_batches=3, update_interval=2)
    decisions = []
    for i in range(1, 12):
        before = p.steps_for_batch(1)
        feed(p, before + 0.5)  # just enough to climb one step per decision
        if p.steps_for_batch(1) != before:
            decisions.append(i)
    assert decisions == [5, 7, 9, 11]


def test_empty_batches_change_nothing_and_do_not_count() -> None:
    p = policy([1, 3], initial=1, warmup_batches=2, update_interval=1)
    for _ in range(5):
        assert p.on_verify_complete([], 1) is None
    assert p.snapshot()["buckets"]["1"] == {"steps": 1, "ema": 0.0, "batches": 0, "candidate_steps": [1, 3]}
    assert feed(p, 3) is None and feed(p, 3) is None  # still warming up: batches 1, 2
    assert feed(p, 3) == 3


# -- thresholds -------------------------------------------------------------------------------------


def test_rise_needs_strictly_greater() -> None:
    p = policy([1, 3, 5], initial=3)
    assert feed(p, 2.5) is None  # ema == 3 - 0.5 + 0: no rise
    assert feed(p, 2.75) == 5
    p = policy([1, 3, 5], initial=3, up_hysteresis=0.25)
    assert feed(p, 2.75) is None and feed(p, 3.0) == 5


def test_drop_at_less_or_equal() -> None:
    p = policy([1, 3, 5], initial=3)  # drop threshold to 1: 1 - 0.5 - 0.25 = 0.25
    assert feed(p, 0.5) is None
    assert feed(p, 0.25) == 1
    p = policy([1, 3, 5], initial=3, down_hysteresis=0.0)
    assert feed(p, 0.5) == 1


def test_multi_step_moves_in_one_decision() -> None:
    p = policy([1, 3, 5, 7], initial=7)
    assert feed(p, 0) == 1
    assert feed(p, 7) == 7


def test_no_rise_in_a_decision_that_moved_down() -> None:
    # ema 0 at steps 3: drops to 1 (0 <= 0.25); rising from 1 (0 > 0.5?) is not even considered.
    p = policy([1, 3], initial=3, down_hysteresis=1.0, up_hysteresis=-1.0)
    # drop threshold 0.5 + 1.0 = 1.5; rise from 1 threshold 1 - 0.5 - 1 = -0.5: ema 1.0 satisfies both.
    assert feed(p, 1.0) == 1
    assert feed(p, 1.0) == 3  # next decision at 1: nothing below, so it rises
    assert [s.to_steps for s in p.switches] == [1, 3]


def test_zero_steps_probe_and_frozen_ema() -> None:
    p = policy([0, 2, 4], initial=0)
    assert p.snapshot()["buckets"]["1"]["ema"] == -1.0
    # At steps 0 the EMA is not updated; the decision probes the next candidate and resets EMA to 2 - 1.
    assert feed(p, 4) == 2
    assert p.snapshot()["buckets"]["1"]["ema"] == 1.0
    # Drop to 0 when ema <= 0.5 + down_hysteresis (-0.25) = 0.25.
    assert feed(p, 0.5) is None
    assert feed(p, 0.0) == 0
    ema_at_zero = p.snapshot()["buckets"]["1"]["ema"]
    assert ema_at_zero == 0.0
    # Back at 0: the EMA stays put whatever is accepted, and the next decision probes 2 again
    # without resetting the (non-negative) EMA.
    assert feed(p, 3) == 2
    assert p.snapshot()["buckets"]["1"]["ema"] == ema_at_zero


def test_zero_only_bucket_stays_at_zero() -> None:
    p = policy([0], initial=3)
    for _ in range(5):
        assert feed(p, 1) is None
    assert p.steps_for_batch(1) == 0 and p.snapshot()["buckets"]["1"]["batches"] == 5


def test_ceiling_caps_hold_and_drop_but_not_rise() -> None:
    cands = [1, 2, 3, 4, 5, 6, 7]
    p = policy(cands, initial=5, ceiling_coeff=0.5)
    # ema 4.4: no drop (4 - 0.75 = 3.25), no rise (4.4 > 4.5 fails): holds 5, capped at ceil(2.2) = 3.
    assert feed(p, 4.4) == 3
    p = policy(cands, initial=3, ceiling_coeff=0.5)
    assert feed(p, 5) == 6  # a climb is never capped (the ceiling ceil(2.5) = 3 would have)
    p = policy([3, 5], initial=5, ceiling_coeff=0.1)
    assert feed(p, 4.5) == 3  # ceiling max(1, ceil(0.45)) = 1: no candidate <= 1, so the smallest
    p = policy(cands, initial=5, ceiling_coeff=0)
    assert feed(p, 4.4) is None


# -- buckets ----------------------------------------------------------------------------------------


def test_buckets_are_independent_and_inherit_knobs() -> None:
    cfg = config({
        "ema_alpha": 0.5, "warmup_batches": 0, "update_interval": 1,
        "1": {"candidate_steps": [1, 3]},
        "8": {"candidate_steps": [1, 3], "ema_alpha": 1.0},
    })
    p = AdaptivePolicy(cfg, initial_steps=1)
    assert p.on_verify_complete([3] * 8, 8) == 3  # bucket 8 (alpha 1): ema 3 > 0.5
    snap = p.snapshot()["buckets"]
    assert snap["1"] == {"steps": 1, "ema": 0.0, "batches": 0, "candidate_steps": [1, 3]}
    assert snap["8"] == {"steps": 3, "ema": 3.0, "batches": 1, "candidate_steps": [1, 3]}
    # Bucket 1 inherits alpha 0.5: ema = 0.5 * 0 + 0.5 * 1 = 0.5, not above the bar 1 - 0.5.
    assert p.on_verify_complete([1, 1], 2) is None
    assert p.on_verify_complete([1, 1], 2) == 3  # 0.5 * 0.5 + 0.5 * 1 = 0.75 > 0.5
    assert p.snapshot()["buckets"]["8"] == snap["8"]
    assert [(s.bucket, s.to_steps) for s in p.switches] == [(8, 3), (1, 3)]


def test_switch_timeline_and_snapshot() -> None:
    ticks = iter([10.0, 20.0])
    p = AdaptivePolicy(config({"warmup_batches": 0, "update_interval": 1, "ema_alpha": 1.0,
                               "1": {"candidate_steps": [1, 3]}}), initial_steps=1, clock=lambda: next(ticks))
    assert p.on_verify_complete([3, 3], 1) == 3
    assert p.on_verify_complete([0], 1) == 1
    assert p.switches == [Switch(10.0, 1, 1, 3, 3.0), Switch(20.0, 1, 3, 1, 0.0)]
    assert p.snapshot()["switches"][1] == {"time": 20.0, "bucket": 1, "from_steps": 3, "to_steps": 1, "ema": 0.0}


def test_throughput_aware_is_refused() -> None:
    cfg, _ = parse_deployment_adaptive({"strategy": "throughput_aware", "buckets": {1: {"candidate_steps": [1, 3]}}})
    assert cfg is not None
    with pytest.raises(UsageError, match="throughput_aware"):
        AdaptivePolicy(cfg, initial_steps=1)


def test_policy_module_is_torch_free() -> None:
    code = "import sys, specctl.adaptive.policy, specctl.schemas.adaptive; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# -- differential: a reference written from the documented semantics -----------------------------------


class Reference:
    """docs/adaptive.md "How the policy decides", restated: thresholds listed per candidate, searched outward."""

    def __init__(self, cands: list[int], initial: int, k: dict) -> None:
        self.c, self.k = sorted(set(cands)), k
        self.steps = initial if initial in self.c else self.c[len(self.c) // 2]
        self.ema, self.n = self.steps - 1.0, 0

    def update(self, acc: list[int]) -> None:
        if not acc:
            return
        if self.steps:
            self.ema = (1 - self.k["ema_alpha"]) * self.ema + self.k["ema_alpha"] * (sum(acc) / len(acc))
        self.n += 1
        w, u = self.k["warmup_batches"], self.k["update_interval"]
        if self.n > w and (self.n - w) % u == 0:
            self.decide()

    def decide(self) -> None:
        c, s, e = self.c, self.steps, self.ema
        if s == 0:
            t = c[min(c.index(0) + 1, len(c) - 1)]
            if t > 0 and e < 0:
                self.ema = t - 1.0
            self.steps = t
            return
        t = s
        for lower in sorted((x for x in c if x < s), reverse=True):
            if e <= (0.5 if lower == 0 else lower - 0.5) + self.k["down_hysteresis"]:
                t = lower
            else:
                break
        if t == s:
            for higher in (x for x in c if x > s):
                if e > t - 0.5 + self.k["up_hysteresis"]:
                    t = higher
                else:
                    break
        if self.k["ceiling_coeff"] > 0:
            ceiling = max(1, math.ceil(e * self.k["ceiling_coeff"]))
            if ceiling < t <= s:
                t = max((x for x in c if x <= ceiling), default=c[0])
        self.steps = t


@settings(max_examples=150, deadline=None)
@given(
    cands=st.lists(st.integers(0, 8), min_size=1, max_size=5),
    initial=st.integers(0, 8),
    knobs=st.fixed_dictionaries({
        "ema_alpha": st.sampled_from([0.1, 0.2, 0.5, 1.0]),
        "warmup_batches": st.integers(0, 4),
        "update_interval": st.integers(1, 4),
        "down_hysteresis": st.sampled_from([-0.5, -0.25, 0.0, 0.25]),
        "up_hysteresis": st.sampled_from([-0.25, 0.0, 0.25]),
        "ceiling_coeff": st.sampled_from([0, 0.5, 1.0, 1.5]),
    }),
    trace=st.lists(st.lists(st.integers(0, 8), max_size=4), max_size=60),
)
def test_policy_matches_reference(cands: list[int], initial: int, knobs: dict, trace: list[list[int]]) -> None:
    p = AdaptivePolicy(config({"1": {"candidate_steps": cands}, **knobs}), initial_steps=initial)
    ref = Reference(cands, initial, knobs)
    for acc in trace:
        before = p.steps_for_batch(1)
        got = p.on_verify_complete(acc, 1)
        ref.update(acc)
        assert p.steps_for_batch(1) == ref.steps
        assert p.snapshot()["buckets"]["1"]["ema"] == ref.ema
        assert got == (ref.steps if ref.steps != before else None)
