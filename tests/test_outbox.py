"""Prefill's outbox with real receiver processes: a decode that never acknowledges (SIGSTOP) holds up only its
own rooms, another session's rooms go through at once, and a session that stopped pinging fails every room it
holds at once instead of one transfer timeout each."""

from __future__ import annotations

import concurrent.futures
import signal
import time

import numpy as np
import pytest

from specctl.engine.pd.outbox import TransferOutbox
from specctl.engine.pd.transfer import TransferError

from test_transfer_faults import Child  # isort: skip

TIMEOUT_S = 30.0  # the per-room ack timeout: nothing in this test may come near it


def _room() -> dict[str, np.ndarray]:
    return {"kv.0": np.ones((256, 1024), dtype=np.uint8)}


def test_a_stopped_decode_costs_only_its_own_rooms_and_fails_them_at_once_when_its_session_goes_quiet(
        tmp_path) -> None:  # fmt: skip
    healthy, stopped = Child(f"ipc://{tmp_path}/a.sock"), Child(f"ipc://{tmp_path}/b.sock")
    quiet: dict[str, float] = {}  # session -> when its decode stopped pinging
    outbox = TransferOutbox(timeout_s=TIMEOUT_S, stale_after_s=1.0,
                            liveness=lambda s: time.monotonic() - quiet[s] if s in quiet else 0.0)
    try:
        warm = outbox.submit("b", stopped.endpoint, None, "warm", _room(), length=256)
        assert warm.result(TIMEOUT_S).error is None  # connected and acknowledged
        stopped.proc.send_signal(signal.SIGSTOP)  # alive and connected, never acknowledges again
        held = [outbox.submit("b", stopped.endpoint, None, f"b{i}", _room(), length=256) for i in range(4)]
        time.sleep(0.3)
        t0 = time.monotonic()
        other = [outbox.submit("a", healthy.endpoint, None, f"a{i}", _room(), length=256) for i in range(8)]
        done, _ = concurrent.futures.wait(other, timeout=TIMEOUT_S / 2)
        waited = time.monotonic() - t0
        assert len(done) == 8 and all(f.result().error is None for f in other)
        assert waited < TIMEOUT_S / 2, waited  # never queued behind the stopped decode's rooms
        assert not any(f.done() for f in held)  # those still wait for their ack ...
        assert outbox.in_flight()["b"] == 4
        quiet["b"] = time.monotonic()  # ... until their session stops pinging
        t1 = time.monotonic()
        for f in held:
            with pytest.raises(TransferError) as err:
                f.result(TIMEOUT_S / 2)
            assert err.value.field == "session" and "stopped pinging" in str(err.value)
        assert time.monotonic() - t1 < TIMEOUT_S / 3  # at once, not one timeout per room
        assert "b" not in outbox.in_flight()
        # the healthy session keeps serving; the expired one's next room starts a fresh lane
        assert outbox.submit("a", healthy.endpoint, None, "a-after", _room(), length=256).result(
            TIMEOUT_S).error is None
        outbox.fail_session("a", "decode re-registered")
        assert "a" not in outbox.in_flight()
        # the receiver prints after it acknowledges: every room of the healthy session arrived, once
        assert sum(line.startswith("got a") for line in healthy.wait_lines(9)) == 9
    finally:
        outbox.close()
        healthy.kill()
        stopped.kill()
