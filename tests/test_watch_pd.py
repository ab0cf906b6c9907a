"""`specctl watch` against a REAL specctl prefill/decode pair behind the real sglang-router: a clean pair is
exit 0; then, one fault after another on the same pair, each is named by the live watch within two
refreshes of the first tick that can see it: a stalled transfer (prefill runs the test-only fault plan that
holds every payload), a decode restarted with another page size, a stopped prefill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specctl.engine.checkpoint import write_random_model
from specctl.orchestrate.ports import free_ports

pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
START_TIMEOUT = 180.0
HOLD_S = 6.0


def get(url: str, timeout: float = 3.0) -> tuple[int | None, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    except (OSError, ValueError):
        return None, {}


def wait_for(pred: Any, what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Proc:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self.out = log.open("wb")
        self.p = subprocess.Popen([sys.executable, "-m", "specctl.cli", *argv], stdout=self.out,
                                  stderr=subprocess.STDOUT, env=ENV)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self.out.close()


def deployment(path: Path, target: Path, ports: dict[str, int], page_size: int = 4) -> Path:
    path.write_text(f"""version: 1
name: {path.stem}
model: {{target: {target}, dtype: float32, device: cpu}}
speculative: {{algorithm: none}}
cache: {{page_size: {page_size}, max_tokens: 2048}}
serve: {{max_batch_size: 8}}
transfer: {{backend: zmq, timeout_s: 40}}
roles:
  prefill: {{host: 127.0.0.1, port: {ports['prefill']}, bootstrap_port: {ports['bootstrap']}}}
  decode: {{host: 127.0.0.1, port: {ports['decode']}}}
  router: {{host: 127.0.0.1, port: {ports['router']}}}
""")
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("watch-pd")
    target = write_random_model(root / "target", layer_kinds=("full", "swa"))
    ports = dict(zip(("prefill", "decode", "router", "bootstrap"), free_ports(4), strict=True))
    cfg = deployment(root / "pd.yaml", target, ports)
    url = {r: f"http://127.0.0.1:{ports[r]}" for r in ("prefill", "decode", "router")}
    t: dict[str, Any] = {"root": root, "cfg": cfg, "url": url, "target": target, "ports": ports, "procs": {}}
    procs = t["procs"]
    # prefill holds every payload HOLD_S seconds before sending it (the test-only fault plan): a transfer that
    # stalls whenever a request is in flight, and none while the pair is idle
    plan = root / "hold.json"
    plan.write_text(json.dumps({"prefill_hold_s": HOLD_S}))
    try:
        procs["prefill"] = Proc(["serve", "--role", "prefill", "-c", str(cfg), "--fault-plan", str(plan)],
                                root / "prefill.log")
        procs["decode"] = Proc(["serve", "--role", "decode", "-c", str(cfg)], root / "decode.log")
        wait_for(lambda: get(url["prefill"] + "/health")[0] == 200 and get(url["decode"] + "/health")[0] == 200,
                 "the pair to be healthy")
        procs["router"] = Proc(["serve", "--role", "router", "-c", str(cfg)], root / "router.log")
        wait_for(lambda: get(url["router"] + "/readiness")[0] == 200, "the router to be ready")
        yield t
    finally:
        for p in procs.values():
            p.stop()


def complete(url: str, prompt: str, out: list[Any]) -> None:
    model = get(url + "/v1/models", timeout=30)[1]["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=90) as r:  # noqa: S310 - loopback
            out.append(r.status)
    except (OSError, urllib.error.HTTPError) as exc:
        out.append(exc)


class LiveWatch:
    """`specctl watch --format json` running live; `until(name)` reads ticks until an alert of that name."""

    def __init__(self, t: dict[str, Any], *extra: str) -> None:
        u = t["url"]
        self.p = subprocess.Popen([sys.executable, "-m", "specctl.cli", "watch", "-c", str(t["cfg"]), "--format",
                                   "json", "--interval", "1", "--stall-after", "1", "--timeout", "3", *extra],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        self.ticks: list[dict[str, Any]] = []
        assert u["prefill"] and self.p.stdout is not None

    def until(self, name: str, seen: Any, timeout: float = 90.0) -> tuple[int, int]:
        """(index of the first tick where `seen(tick)` held, index of the first tick with alert `name`)."""
        assert self.p.stdout is not None
        first = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.p.stdout.readline()
            assert line, self.p.stderr.read() if self.p.stderr else "watch exited"
            tick = json.loads(line)
            self.ticks.append(tick)
            if first is None and seen(tick):
                first = tick["tick"]
            if any(a["name"] == name for a in tick["alerts"]):
                assert first is not None, f"{name} before its cause: {tick}"
                return first, tick["tick"]
        raise AssertionError(f"no {name} alert in {len(self.ticks)} ticks: {self.ticks[-1:]}")

    def stop(self) -> None:
        self.p.terminate()
        self.p.communicate(timeout=20)  # drains and closes both pipes


def test_watch_names_each_fault_of_a_real_pair_within_two_refreshes(pair: dict[str, Any]) -> None:
    t, u, procs = pair, pair["url"], pair["procs"]
    # clean: a request through the router, then the canary passes
    done: list[Any] = []
    complete(u["router"], "def f(x):", done)
    assert done == [200]
    once = subprocess.run([sys.executable, "-m", "specctl.cli", "watch", "-c", str(t["cfg"]), "--once", "--interval",
                           "1", "--format", "json"], capture_output=True, text=True, env=ENV, timeout=120)
    assert once.returncode == 0, once.stdout + once.stderr
    tick = json.loads(once.stdout)
    assert tick["preflight"]["ok"] and set(tick["roles"]) == {"prefill", "decode", "router"}
    assert all(r["up"] for r in tick["roles"].values())
    assert tick["roles"]["prefill"]["engine"] == tick["roles"]["decode"]["engine"] == "specctl"

    live = LiveWatch(t)
    try:
        # a stalled transfer: a request in flight, its payload held
        held: list[Any] = []
        threading.Thread(target=complete, args=(u["router"], "import os", held), daemon=True).start()
        first, named = live.until("transfer_stall", lambda k: (k["roles"]["prefill"]["in_transfer"] or 0) > 0)
        print(f"transfer_stall named {named - first} refresh(es) after the first tick that saw a request wait")
        assert named - first <= 2, live.ticks[-3:]
        stall = next(a for a in live.ticks[-1]["alerts"] if a["name"] == "transfer_stall")
        assert stall["role"] == "prefill"
        deadline = time.monotonic() + 60
        while not held and time.monotonic() < deadline:
            time.sleep(0.2)
        assert held == [200]  # the held transfer completes: a stall, not a failure

        # a decode restarted with another page size (its handshake refuses it: it answers until it exits)
        other = deployment(t["root"] / "pd-page8.yaml", t["target"], t["ports"], page_size=8)
        procs["decode"].stop()
        procs["decode"] = Proc(["serve", "--role", "decode", "-c", str(other)], t["root"] / "decode-page8.log")
        first, named = live.until("pair_mismatch", lambda k: k["roles"]["decode"]["up"] and k["preflight"]
                                  is not None and k["preflight"]["decode"]["page_size"] == 8)
        print(f"pair_mismatch named {named - first} refresh(es) after the first tick that read page size 8")
        assert named - first <= 2
        alerts = {a["name"] for a in live.ticks[-1]["alerts"]}
        assert {"pair_mismatch", "deployment_drift"} <= alerts, live.ticks[-1]["alerts"]

        # a stopped prefill
        procs["prefill"].stop()
        first, named = live.until("server_unreachable", lambda k: not k["roles"]["prefill"]["up"])
        print(f"server_unreachable named {named - first} refresh(es) after the first tick prefill did not answer")
        assert named == first
        assert any(a["name"] == "server_unreachable" and a["role"] == "prefill" for a in live.ticks[-1]["alerts"])
    finally:
        live.stop()
    once = subprocess.run([sys.executable, "-m", "specctl.cli", "watch", "-c", str(t["cfg"]), "--once", "--interval",
                           "0.5"], capture_output=True, text=True, env=ENV, timeout=120)
    assert once.returncode == 3 and "server_unreachable [prefill]" in once.stdout, once.stdout + once.stderr
