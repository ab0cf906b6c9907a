"""`Launcher` supervision with small real child processes standing in for `specctl serve`.

The launcher runs `[python, -m, specctl.cli, serve, --role R, -c FILE]` per engine and `[python, -m, smg,
launch, --pd-disaggregation, ...]` for the router; here `python` is a tiny script that
serves /health (engines) or /readiness (router) on the role's port (503 until "ready", then 200) and behaves
as the test asks through FAKE_<ROLE> (ok | die | hang | stubborn | impostor), so waiting, failure reporting
and shutdown are exercised with real processes, real signals and real HTTP, without loading a model. The
real router and engines run in tests/test_serve_pd.py.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from specctl.errors import RuntimeFailure
from specctl.orchestrate.launcher import Launcher
from specctl.orchestrate.ports import free_ports
from specctl.schemas.deployment import load_deployment

pytestmark = pytest.mark.slow

FAKE = textwrap.dedent(
    """\
    #!{python}
    import http.server, json, os, signal, sys, threading, time
    import yaml
    args = sys.argv[1:]
    if "--pd-disaggregation" in args:
        role, port = "router", int(args[args.index("--port") + 1])
        with open(os.path.join(os.environ["FAKE_MARKS"], "router.argv"), "w") as f:
            json.dump({{"argv": args, "offline": os.environ.get("HF_HUB_OFFLINE")}}, f)
    else:
        role = args[args.index("--role") + 1]
        doc = yaml.safe_load(open(args[args.index("-c") + 1]))
        port = doc["roles"][role]["port"]
    mode = os.environ.get("FAKE_" + role.upper(), "ok")
    marks = os.environ["FAKE_MARKS"]
    started = time.monotonic()

    def mark(what):
        with open(os.path.join(marks, role), "a") as f:
            f.write(what + "\\n")

    if mode == "stubborn":
        signal.signal(signal.SIGTERM, lambda *a: mark("ignored-term"))
    else:
        def term(*a):
            mark("term")
            os._exit(0)
        signal.signal(signal.SIGTERM, term)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ready = mode not in ("hang", "die") and time.monotonic() - started > 0.3
            # An "impostor" answers ready with another process's pid (a leftover deployment on the port).
            pid = os.getppid() if mode == "impostor" else os.getpid()
            body = json.dumps({{"status": "ready" if ready else "pairing", "detail": role, "pid": pid}}).encode()
            self.send_response(200 if ready else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(role, "serving on", port, flush=True)
    if mode == "die":
        time.sleep(0.5)
        print(role + ": handshake refused by prefill: page_size differs", file=sys.stderr, flush=True)
        sys.exit(3)
    while True:
        time.sleep(0.1)
    """
)


@pytest.fixture
def setup(tmp_path: Path, monkeypatch):
    src = Path(__file__).resolve().parents[1] / "presets" / "tiny-pd.yaml"
    doc = yaml.safe_load(src.read_text())
    p, d, r, b = free_ports(4)
    doc["roles"] = {
        "prefill": {"host": "127.0.0.1", "port": p, "bootstrap_port": b},
        "decode": {"host": "127.0.0.1", "port": d},
        "router": {"host": "127.0.0.1", "port": r},
    }
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(doc))
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("FAKE_MARKS", str(marks))
    deployment = load_deployment(path)

    def make(**modes: str) -> Launcher:
        env = {f"FAKE_{k.upper()}": v for k, v in modes.items()}
        # The stand-ins serve no /server_info: the preflight runs against real servers in test_up_preflight.py.
        return Launcher(deployment, log_dir=tmp_path / "logs", env=env, python=str(fake), preflight=False)

    make.path = path  # type: ignore[attr-defined]
    make.ports = {"prefill": p, "decode": d, "router": r, "bootstrap": b}  # type: ignore[attr-defined]
    return make, marks, r


def test_the_router_is_smg_over_every_instance(setup) -> None:
    make, marks, router_port = setup
    launcher = make()
    with launcher:
        launcher.wait_ready(60, poll_s=0.05)
        started = json.loads((marks / "router.argv").read_text())
    argv, p = started["argv"], make.ports
    assert argv[:4] == ["-m", "smg", "launch", "--pd-disaggregation"]
    i = argv.index("--prefill")
    assert argv[i + 1:i + 3] == [f"http://127.0.0.1:{p['prefill']}", str(p["bootstrap"])]
    assert argv[argv.index("--decode") + 1] == f"http://127.0.0.1:{p['decode']}"
    assert argv[argv.index("--port") + 1] == str(router_port)
    assert int(argv[argv.index("--shutdown-grace-period-secs") + 1]) <= 5
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert started["offline"] == "1"  # no hub, ever


def _marks(marks: Path, role: str) -> list[str]:
    f = marks / role
    return f.read_text().split() if f.exists() else []


def test_all_ready_then_clean_stop(setup) -> None:
    make, marks, router_port = setup
    seen: list[list[str]] = []
    launcher = make()
    with launcher:
        launcher.wait_ready(60, on_status=lambda st: seen.append([s.state for s in st]), poll_s=0.05)
        assert launcher.url == f"http://127.0.0.1:{router_port}"
        assert [s.role for s in launcher.status.values()] == ["prefill", "decode", "router"]
        assert all(s.ready for s in launcher.status.values())
        assert any(states != ["ready"] * 3 for states in seen)  # it really waited
        launcher.check()
    codes = launcher.stop()  # idempotent after __exit__
    assert codes == {"prefill": 0, "decode": 0, "router": 0}
    for role in ("prefill", "decode", "router"):
        assert _marks(marks, role) == ["term"]


def test_a_dying_process_is_named_with_its_reason_and_the_rest_stop(setup) -> None:
    make, marks, _ = setup
    launcher = make(decode="die")
    with launcher:
        with pytest.raises(RuntimeFailure) as err:
            launcher.wait_ready(60, poll_s=0.05)
        msg = str(err.value)
        assert "decode" in msg and "exit" in msg and "code 3" in msg
        assert "launch, handshake or runtime failure" in msg
        assert "page_size differs" in msg  # the tail of its log says why
        assert err.value.exit_code == 3
    assert launcher.procs["decode"].returncode == 3
    assert launcher.procs["prefill"].returncode == 0 and "router" not in launcher.procs  # never routed to it
    assert _marks(marks, "prefill") == ["term"] and _marks(marks, "router") == []


def test_not_ready_in_time_names_who_is_waiting(setup) -> None:
    make, _, _ = setup
    launcher = make(decode="hang")
    with launcher:
        t0 = time.monotonic()
        with pytest.raises(RuntimeFailure, match=r"not ready after 2s: decode \(pairing"):
            launcher.wait_ready(2, poll_s=0.05)
        assert time.monotonic() - t0 < 10


def test_death_after_ready_is_caught_by_check(setup) -> None:
    make, _, _ = setup
    launcher = make()
    with launcher:
        launcher.wait_ready(60, poll_s=0.05)
        os.kill(launcher.procs["prefill"].pid, 9)
        launcher.procs["prefill"].wait(10)
        with pytest.raises(RuntimeFailure, match=r"prefill \(pid \d+\) exited with code -9: killed \(SIGKILL\)"):
            launcher.check()


def test_a_process_ignoring_sigterm_is_killed_after_the_grace(setup) -> None:
    make, marks, _ = setup
    launcher = make(router="stubborn")
    launcher.start()
    try:
        launcher.wait_ready(60, poll_s=0.05)
    finally:
        t0 = time.monotonic()
        codes = launcher.stop(grace_s=1.0)
    assert 0.9 < time.monotonic() - t0 < 10
    assert codes["router"] == -9 and codes["prefill"] == 0 and codes["decode"] == 0
    assert _marks(marks, "router") == ["ignored-term"]


def _listen(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


@pytest.mark.parametrize(("role", "key"), [("router", "router.port"), ("prefill", "prefill.bootstrap_port")])
def test_a_taken_port_fails_before_anything_starts(setup, role: str, key: str) -> None:
    make, marks, _ = setup
    port = make.ports["bootstrap" if key.endswith("bootstrap_port") else role]
    with _listen(port):  # another deployment still holds the port
        launcher = make()
        with pytest.raises(RuntimeFailure) as err:
            launcher.start()
    assert err.value.exit_code == 3
    msg = f"{err.value} {err.value.hint}"
    assert f"port {port}" in msg and role in msg and f"--set roles.{key}=" in msg, msg
    assert launcher.procs == {}  # nothing was spawned
    assert not any(marks.iterdir())


def test_up_cli_names_the_taken_port_and_exits_3(setup) -> None:
    make, _, _ = setup
    port = make.ports["decode"]
    with _listen(port):
        res = subprocess.run([sys.executable, "-m", "specctl.cli", "up", "-c", str(make.path), "--timeout", "20"],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 3, res.stderr
    err = " ".join(res.stderr.split())  # the console may wrap long lines
    assert f"port {port}" in err and "decode HTTP port" in err and "--set roles.decode.port=" in err, err


def test_a_stranger_answering_on_the_port_is_never_ready(setup) -> None:
    make, _, _ = setup
    launcher = make(decode="impostor")
    with launcher:
        with pytest.raises(RuntimeFailure, match=r"not ready after 2s: decode \(foreign: port answered by pid"):
            launcher.wait_ready(2, poll_s=0.05)
        assert launcher.status["prefill"].ready and "router" not in launcher.procs


def test_an_answer_that_is_not_http_reads_as_not_up_yet() -> None:
    """Polling /health on an ephemeral-range port before the server binds it, the kernel may connect the
    socket to itself (a TCP self-connect): the reply is the request echoed, which urllib rejects with
    BadStatusLine. It once killed `specctl bench` with a traceback; it is "no server yet"."""
    import threading

    from specctl.bench.target import _get_info
    from specctl.preflight.reader import get_json

    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def echo() -> None:
        srv.settimeout(10)
        for _ in range(2):
            conn, _addr = srv.accept()
            with conn:
                conn.settimeout(5)
                conn.sendall(conn.recv(4096))  # what a self-connected socket reads: its own request

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    try:
        assert get_json(f"http://127.0.0.1:{port}/health", 5) == ({}, None)
        assert _get_info(f"http://127.0.0.1:{port}") is None
    finally:
        t.join(10)
        srv.close()
