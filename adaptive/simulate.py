"""`specctl adaptive simulate`'s replay: recorded verify results fed through the engine's own adaptive policy
(`simulate`), one `SimStep` per trace record, and the text report of it (`render_text`). Torch-free."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specctl.adaptive.policy import AdaptivePolicy
from specctl.adaptive.setup import SimulationSetup
from specctl.adaptive.trace import TraceRecord


@dataclass(frozen=True)
class SimStep:
    """The policy's state after one trace record."""

    index: int
    batch_size: int
    bucket: int
    ran_steps: int  # the steps this batch was verified with (before the update)
    steps: int  # the routed bucket's steps after the update
    ema: float
    switched: bool
    mean_accepted: float | None  # None for an empty batch

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "ema": self.ema,
            "switched": self.switched,
        }



def simulate(setup: SimulationSetup, records: Sequence[TraceRecord]) -> tuple[list[SimStep], AdaptivePolicy]:
    """Replay `records` through a fresh policy; the steps after each record and the final policy."""
    index = 0
    policy = AdaptivePolicy(
        setup.cfg, initial_steps=setup.initial_steps, graph_batch_sizes=setup.graph_batch_sizes,
        clock=lambda: float(index),  # switches are stamped with the trace index
    )
    out: list[SimStep] = []
    for index, rec in enumerate(records):
        state = policy.bucket_for_batch(rec.batch_size)
        ran = state.steps
        new = policy.on_verify_complete(rec.accepted, rec.batch_size)
        mean = sum(rec.accepted) / len(rec.accepted) if rec.accepted else None
        out.append(SimStep(
            index, rec.batch_size, state.bucket.min_batch_size, ran, state.steps, state.ema, new is not None, mean,
        ))
    return out, policy


def render_text(setup: SimulationSetup, steps: Sequence[SimStep], policy: AdaptivePolicy) -> str:
    """The per-record table and a summary: switches, batches run at each step, final bucket states."""
    head = ("index", "batch", "bucket", "ran", "accepted", "ema", "steps", "")
    rows = [
        (
            str(s.index), str(s.batch_size), str(s.bucket), str(s.ran_steps),
            "-" if s.mean_accepted is None else f"{s.mean_accepted:.2f}",
            f"{s.ema:.3f}", str(s.steps), f"switch {s.ran_steps} -> {s.steps}" if s.switched else "",
        )
        for s in steps
    ]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (head, *rows)]
    run = [s for s in steps if s.mean_accepted is not None]
    empty = len(steps) - len(run)
    lines.append("")
    graphs = ", ".join(map(str, setup.graph_batch_sizes)) or "none"
    lines.append(
        f"{setup.source}: {len(steps)} verify records ({empty} empty), initial steps {setup.initial_steps}, "
        f"graph batch sizes: {graphs}"
    )
    lines.append(f"switches: {len(policy.switches)}")
    for sw in policy.switches:
        lines.append(f"  at {int(sw.time)}: bucket {sw.bucket}: {sw.from_steps} -> {sw.to_steps} (ema {sw.ema:.3f})")
    lines.append("batches run at each step:")
    counts = Counter(s.ran_steps for s in run)
    for step in sorted(counts):
        lines.append(f"  steps {step}: {counts[step]} ({100.0 * counts[step] / len(run):.1f}%)")
    if not run:
        lines.append("  (no non-empty batches)")
    lines.append("final state per bucket:")
    for key, st in policy.buckets.items():
        lines.append(f"  bucket {key}: steps {st.steps}, ema {st.ema:.3f}, batches {st.batches}")
    return "\n".join(lines) + "\n"

