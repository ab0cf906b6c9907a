"""`--plot FILE.png`: one figure of four panels for a bench (every sweep point overlaid).

1. latency CDFs (TTFT solid, ITL dotted, E2E dashed), ms on a log axis;
2. throughput over time: output tokens/s in ~30 bins over the run (each token-bearing chunk counted with the
   request's tokens-per-chunk, so multi-token speculative chunks weigh what they carry);
3. speculative steps over time from the server's adaptive switch timeline (without switches during
   the run: the share of verify batches at each step count, when the server reports it);
4. acceptance: accepted draft tokens per verify step (or per-request accept lengths).

A panel without data says so instead of being left out, so the layout is always the same.
matplotlib is imported here only (Agg backend, no display needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specctl.bench.acceptance import request_acceptance
from specctl.errors import UsageError

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from specctl.bench.runner import PointRun


def write_plot(path: str | Path, runs: Sequence[PointRun]) -> Path:
    """Write the PNG for `runs` and return its path."""
    import matplotlib  # noqa: PLC0415 - matplotlib: only when a plot is drawn (the bench report is written without it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib: only when a plot is drawn (the bench report is written without it)
    import numpy as np  # noqa: PLC0415 - numpy: only when a plot is drawn (the bench report is written without it)

    out = Path(path)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ax_cdf, ax_tput), (ax_steps, ax_acc) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    steps_xlabel = "seconds since start"
    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        label = run.load.point.label()
        ok = [r for r in run.load.results if r.ok]
        for values, style, name in (([r.ttft for r in ok if r.ttft is not None], "-", "TTFT"),
                                    ([x for r in ok for x in r.itl], ":", "ITL"),
                                    ([r.e2e for r in ok if r.e2e is not None], "--", "E2E")):
            if values:
                v = np.sort(np.asarray(values) * 1000.0)
                ax_cdf.plot(v, np.arange(1, len(v) + 1) / len(v), style, color=c, label=f"{name} {label}")
        times: list[float] = []
        weights: list[float] = []
        for r in ok:
            if r.chunk_times:
                w = r.output_tokens / len(r.chunk_times)
                times.extend(t - run.load.start for t in r.chunk_times)
                weights.extend([w] * len(r.chunk_times))
        if times:
            # About 30 bins over the run, at least 0.1 s each (1 s bins hide a short run's shape).
            bin_s = min(5.0, max(0.1, max(times) / 30))
            edges = np.arange(0.0, max(times) + bin_s, bin_s)
            hist, _ = np.histogram(times, bins=edges, weights=weights)
            ax_tput.step(edges[:-1], hist / bin_s, where="post", color=c, label=label)
        adaptive = run.record.get("adaptive") or {}
        switches = adaptive.get("switches") or []
        per_steps = adaptive.get("batches_per_steps")
        if not switches and per_steps:
            # No switch during the run: show which step counts the verify batches ran at instead.
            ks = [int(k) for k in per_steps]
            total = sum(per_steps.values()) or 1
            width = 0.8 / max(1, len(runs))
            ax_steps.bar([k + i * width for k in ks], [v / total for v in per_steps.values()], width=width,
                         color=c, label=f"{label} (no switches)")
            steps_xlabel = "steps (share of verify batches)"
        if switches:
            by_bucket: dict[object, list[tuple[float, float]]] = {}
            for j, s in enumerate(switches):
                t = s.get("t_rel_s")
                by_bucket.setdefault(s.get("bucket"), []).append((t if t is not None else float(j), s["to_steps"]))
            for bucket, pts in by_bucket.items():
                xs, ys = zip(*pts, strict=True)
                ax_steps.step(xs, ys, where="post", color=c, marker="o", label=f"bucket {bucket} {label}")
        hist_acc = run.record.get("accepted_per_step_histogram")
        if hist_acc:
            ks = [int(k) for k in hist_acc]
            total = sum(hist_acc.values()) or 1
            width = 0.8 / max(1, len(runs))
            ax_acc.bar([k + i * width for k in ks], [v / total for v in hist_acc.values()], width=width,
                       color=c, label=label)
        else:
            per_req = [1 + a / s for r in ok if (g := request_acceptance(r.usage)) for a, s, _ in [g]]
            if per_req:
                ax_acc.hist(per_req, bins=20, color=c, alpha=0.6, label=label)
    _finish(ax_cdf, "Latency CDF (from scheduled send)", "ms (log)", "fraction of requests")
    if ax_cdf.lines:
        from matplotlib.ticker import NullFormatter  # noqa: PLC0415 - matplotlib: only when a plot is drawn (the bench report is written without it)

        ax_cdf.set_xscale("log")
        ax_cdf.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short ranges
    _finish(ax_tput, "Output throughput over time", "seconds since start", "tokens/s")
    _finish(ax_steps, "Speculative steps over time (adaptive switches)", steps_xlabel,
            "steps" if steps_xlabel.startswith("seconds") else "fraction of batches")
    _finish(ax_acc, "Acceptance", "accepted draft tokens per verify step", "fraction of steps")
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=90)
    except OSError as exc:
        raise UsageError(f"cannot write plot {out}: {exc}") from None
    finally:
        plt.close(fig)
    return out


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    if not (ax.lines or ax.patches or ax.collections):
        ax.text(0.5, 0.5, "n/a: not reported by the server", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
