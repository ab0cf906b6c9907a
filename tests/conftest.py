"""Shared test set-up.

The engine tests run many forwards of tiny models. On a machine with few cores shared with other
jobs torch's intra-op threads only add hand-off cost and contention, so torch runs single-threaded
here. Set before anything imports torch, so it also holds for the
engine processes that tests launch (they inherit the environment; the launcher keeps a value the
user set).

CI (CI=true, a clean checkout) replays a fixed set of generated hypothesis examples so that a
landing never hinges on the draw; local runs keep exploring new examples (and hypothesis' database
replays anything they find until it is fixed).
"""

from __future__ import annotations

import os

from hypothesis import settings

os.environ.setdefault("OMP_NUM_THREADS", "1")
# No hub, ever: transformers, sglang-router and SGLang's bench reach for the Hugging Face hub when a name is not a
# local directory. Every test process (and every child it starts, which inherits the environment) stays offline.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
    settings.load_profile("ci")
