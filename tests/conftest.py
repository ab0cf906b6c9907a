"""Shared test set-up.

The engine tests run many forwards of tiny models. On the 2-core CI machine torch's intra-op
threads only add hand-off cost and contention (measured: an order of magnitude slower under load),
so torch runs single-threaded here. Set before anything imports torch, so it also holds for the
engine processes that tests launch (they inherit the environment; the launcher keeps a value the
user set).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
