"""Transfer faults with real processes: a receiver killed with -9 mid-transfer makes the sender fail
fast (not hang), a silent receiver makes it time out, and a restarted receiver never sees a stale
payload meant for its predecessor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from specctl.engine.pd.transfer import TransferError, TransferSender, TransferTimeout, shm_dir

pytestmark = pytest.mark.slow

RECEIVER = textwrap.dedent(
    """
    import sys
    from specctl.engine.pd.transfer import TransferReceiver, TransferTimeout
    with TransferReceiver(None, bind=sys.argv[1], as_torch=False, backend=sys.argv[2]) as rx:
        print(rx.endpoint, flush=True)
        while True:
            try:
                p = rx.recv(timeout_s=60)
            except TransferTimeout:
                break
            print("got", p.request_id, p.nbytes, flush=True)
            p.release()
    """
)


class Child:
    """A receiver process: its stdout lines tell what it received."""

    def __init__(self, bind: str, backend: str = "zmq") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RECEIVER, bind, backend],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "error", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self.endpoint = self.proc.stdout.readline().strip()
        assert self.endpoint, "receiver did not start"
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line.strip())
                self._cv.notify_all()

    def wait_lines(self, n: int, timeout: float = 10.0) -> list[str]:
        with self._cv:
            self._cv.wait_for(lambda: len(self.lines) >= n, timeout)
            return list(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc.stdout.close()


def _data(mib: int) -> dict[str, np.ndarray]:
    return {"kv.0": np.ones((mib * 1024, 1024), dtype=np.uint8)}


@pytest.mark.parametrize("backend", ["zmq", "shm"])
def test_kill_9_receiver_mid_transfer_fails_fast_then_repairs(tmp_path, backend) -> None:
    bind = f"ipc://{tmp_path}/rx.sock"
    child = Child(bind, backend)
    tx = TransferSender(child.endpoint, backend=backend, timeout_s=20)
    try:
        tx.send("warm", _data(1), length=1024)  # connected and acknowledged
        assert child.wait_lines(1)[0].startswith("got warm")
        # Freeze the receiver, start a big transfer into it, then kill it with -9 mid-way.
        child.proc.send_signal(signal.SIGSTOP)
        outcome: dict = {}
        big = _data(64)

        def send_big() -> None:
            t0 = time.monotonic()
            try:
                tx.send("big", big, length=64 * 1024)
                outcome["ok"] = True
            except TransferError as exc:
                outcome["error"] = exc
            outcome["seconds"] = time.monotonic() - t0

        th = threading.Thread(target=send_big)
        th.start()
        deadline = time.monotonic() + 10
        while tx.pending == 0 and time.monotonic() < deadline:  # the transfer is under way
            time.sleep(0.01)
        time.sleep(0.2)
        assert th.is_alive() and tx.pending == 1, "the transfer finished although the receiver is frozen"
        child.kill()
        th.join(15)
        assert not th.is_alive()
        err = outcome.get("error")
        assert isinstance(err, TransferError) and err.request_id == "big", outcome
        assert not isinstance(err, TransferTimeout)  # the disconnect is noticed, not waited out
        assert outcome["seconds"] < 10, outcome

        # decode comes back on the same endpoint: the next request arrives, the stale one never does
        again = Child(bind, backend)
        try:
            tx.send("after", _data(1), length=1024)
            lines = again.wait_lines(1)
            assert lines[0].startswith("got after"), lines
            time.sleep(0.3)
            assert not any("big" in line for line in again.lines)
        finally:
            again.kill()
    finally:
        tx.close()
        child.kill()
    assert not [n for n in os.listdir(shm_dir()) if n.startswith(f"specctl-shm-{os.getpid()}-")]


def test_silent_receiver_times_out_within_the_timeout(tmp_path) -> None:
    child = Child(f"ipc://{tmp_path}/rx.sock")
    tx = TransferSender(child.endpoint, timeout_s=1.0)
    try:
        tx.send("warm", _data(1), length=1024)
        child.proc.send_signal(signal.SIGSTOP)  # alive, connected, but never answers
        t0 = time.monotonic()
        with pytest.raises(TransferTimeout) as err:
            tx.send("stuck", _data(1), length=1024)
        assert err.value.request_id == "stuck" and err.value.field == "ack"
        assert 0.9 < time.monotonic() - t0 < 5.0
    finally:
        tx.close()
        child.kill()
