"""Hypothesis strategies shared by the SGLang tests: random valid PD deployments (as documents)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

MODELS = ["builtin:tiny-hybrid", "/models/not-here-8b"]


@st.composite
def deployments(draw: Any) -> dict[str, Any]:
    algo = draw(st.sampled_from(["none", "draft", "ngram"]))
    page = draw(st.sampled_from([1, 8, 16, 64]))
    max_bs = draw(st.sampled_from([4, 8, 16, 32]))
    graphs = draw(st.sampled_from([[], [1, 2, 4, 8], [1, 2, 4, 8, 16, 32]]))
    graphs = [g for g in graphs if g <= max_bs]
    data: dict[str, Any] = {
        "version": 1,
        "name": "prop",
        "model": {"target": draw(st.sampled_from(MODELS)), "dtype": draw(st.sampled_from(["float32", "bfloat16"]))},
        "cache": {"page_size": page, "max_tokens": page * draw(st.integers(4096, 1 << 16))},
        "serve": {"max_batch_size": max_bs, "graph_batch_sizes": graphs},
        "roles": {
            "prefill": {"host": "127.0.0.1", "port": 31101, "bootstrap_port": 31998},
            "decode": {"host": "127.0.0.1", "port": 31102},
        },
    }
    if algo != "none":
        spec: dict[str, Any] = {"algorithm": algo}
        if algo == "draft":
            spec["draft"] = "builtin:tiny-draft" if data["model"]["target"].startswith("builtin:") else "/models/d-1b"
        if algo == "draft" and draw(st.booleans()):
            keys = sorted(draw(st.sets(st.sampled_from([1, 4, 8, 16]), min_size=1, max_size=3)) | {1})
            buckets = {str(k): {"candidate_steps": sorted(draw(st.sets(st.integers(0, 5), min_size=1, max_size=3)))}
                       for k in keys}
            union = sorted({s for b in buckets.values() for s in b["candidate_steps"]})
            spec["adaptive"] = {"buckets": buckets}
            spec["num_steps"] = draw(st.sampled_from(union))
            if draw(st.booleans()):
                spec["adaptive"]["ema_alpha"] = draw(st.sampled_from([0.1, 0.2, 0.5]))
        else:
            spec["num_steps"] = draw(st.integers(1, 5))
        data["speculative"] = spec
    return data
