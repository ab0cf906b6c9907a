"""`specctl preflight` against SGLang 0.5.23's HTTP shapes, served by real aiohttp servers on 127.0.0.1.

The fixtures (tests/sglang_http/, written from SGLang's source) describe a matched Qwen3-Next PD
pair; each case changes one resolved argument on decode and checks that exactly the fields it
drives are refused. The bootstrap `/route` is a separate server, as in SGLang.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sglang_fixture_server import FixtureServer, fixture, json_answer, text_answer
from typer.testing import CliRunner

from specctl.cli.main import app
from specctl.errors import RuntimeFailure
from specctl.orchestrate.ports import free_port
from specctl.preflight.check import run_preflight
from specctl.schemas.model_facts import builtin_dir
from specctl.schemas.pd_agreement import agreement
from specctl.schemas.server_facts import normalise

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

runner = CliRunner()
ROUTE = "/route"


class Pair:
    """A prefill server, its bootstrap server and a decode server, each with editable documents."""

    def __init__(self, prefill_info: dict[str, Any], decode_info: dict[str, Any],
                 route: list[tuple[int, bytes, str]] | None = None) -> None:
        self.bootstrap = FixtureServer({ROUTE: route or [json_answer(fixture("route_prefill.json"))]})
        prefill_info = {**prefill_info, "disaggregation_bootstrap_port": self.bootstrap.port}
        self.prefill = FixtureServer({"/server_info": [json_answer(prefill_info)],
                                      "/model_info": [json_answer(fixture("model_info_prefill.json"))]})
        self.decode = FixtureServer({"/server_info": [json_answer(decode_info)],
                                     "/model_info": [json_answer(fixture("model_info_decode.json"))]})

    def close(self) -> None:
        for s in (self.prefill, self.decode, self.bootstrap):
            s.close()


@pytest.fixture
def pair_of() -> Iterator[Any]:
    made: list[Pair] = []

    def make(prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None, **kw: Any) -> Pair:
        p = {**fixture("server_info_prefill.json"), **(prefill or {})}
        d = {**fixture("server_info_decode.json"), **(decode or {})}
        made.append(Pair(p, d, **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


def _out(res: Any) -> str:
    """The command's output with Rich's line wrapping undone."""
    return " ".join(res.output.split())


def _fields(report: Any) -> set[str]:
    return {d.field for d in report.differences}


def test_matched_sglang_pair_passes_and_reads_the_bootstrap(pair_of: Any) -> None:
    pair = pair_of()
    report = run_preflight(pair.prefill.url, pair.decode.url, timeout_s=5)
    assert report.ok, [d.to_json() for d in report.differences]
    assert pair.bootstrap.hits[ROUTE] == 1  # found through prefill's disaggregation_bootstrap_port
    p, d = report.prefill, report.decode
    assert (p.engine, p.version, p.role, d.role) == ("sglang", "0.5.23", "prefill", "decode")
    assert p.architecture == "Qwen3NextForCausalLM"
    assert (p.page_size, p.kv_cache_dtype, p.tp_size, p.attn_tp_size) == (64, "bfloat16", 4, 4)
    assert (p.speculative_algorithm, p.num_steps, p.adaptive) == ("eagle", 3, True)
    assert d.accept_length == pytest.approx(2.8125)  # internal_states[].avg_spec_accept_length
    assert p.fingerprint() == d.fingerprint()
    # The model directory is not on this host: state_types cannot be predicted, and the report says so.
    assert p.state_types is None and any("state_types not predicted" in n for n in report.notes)


def test_bootstrap_route_overrides_what_prefill_server_info_says(pair_of: Any) -> None:
    # decode learns prefill's page size from /route at its first request: that is the value compared.
    route = {**fixture("route_prefill.json"), "page_size": 32}
    pair = pair_of(route=[json_answer(route)])
    report = run_preflight(pair.prefill.url, pair.decode.url, timeout_s=5)
    assert _fields(report) == {"page_size"}
    row = report.differences[0]
    assert (row.prefill, row.decode) == (32, 64) and "Page size mismatch" in row.detail


HYBRID = str(builtin_dir("tiny-hybrid"))  # layer kinds full, swa, mamba: state_types [mamba, swa]

CASES = [
    ("page_size", {"page_size": 32}, {"page_size"}),
    ("kv_cache_dtype", {"kv_cache_dtype": "fp8_e4m3"}, {"kv_cache_dtype"}),
    ("dtype", {"dtype": "float16"}, {"dtype", "kv_cache_dtype"}),  # kv auto follows the dtype
    ("tp_size", {"tp_size": 8}, {"tp_size", "attn_tp_size"}),
    ("attention_dp", {"attn_dp_size": 4, "enable_dp_attention": True}, {"attn_tp_size"}),
    ("pp_size", {"pp_size": 2}, {"pp_size"}),
    ("transfer_backend", {"disaggregation_transfer_backend": "nixl"}, {"transfer_backend"}),
    ("allocation_policy", {"disaggregation_decode_allocation_policy": "prefill_complete"},
     {"decode_allocation_policy"}),
    ("algorithm", {"speculative_algorithm": "NGRAM"}, {"speculative_algorithm"}),
    ("no_speculation", {"speculative_algorithm": None},
     {"speculative_algorithm", "draft_model", "num_steps", "eagle_topk", "num_draft_tokens", "adaptive",
      "adaptive_config"}),
    ("draft_model", {"speculative_draft_model_path": "/models/other-draft"}, {"draft_model"}),
    ("num_steps", {"speculative_num_steps": 5, "speculative_num_draft_tokens": 6}, {"num_steps", "num_draft_tokens"}),
    ("adaptive_off", {"speculative_adaptive": False}, {"adaptive", "adaptive_config"}),
    ("adaptive_config", {"speculative_adaptive_config": "/configs/other.json"}, {"adaptive_config"}),
    ("mamba_ssm_dtype", {"mamba_ssm_dtype": "bfloat16"}, {"mamba_ssm_dtype"}),
    ("mamba_ratio", {"mamba_full_memory_ratio": 0.5}, {"mamba_full_memory_ratio"}),
    ("model", {"model_path": "/models/Qwen3-Next-80B-A3B-Thinking"}, {"model_path"}),
    ("version", {"version": "0.5.22"}, {"version"}),
]


@pytest.mark.parametrize(("name", "decode", "expected"), CASES, ids=[c[0] for c in CASES])
def test_one_decode_difference_is_refused_with_that_field(pair_of: Any, name: str, decode: dict[str, Any],
                                                          expected: set[str]) -> None:
    pair = pair_of(decode=decode)
    report = run_preflight(pair.prefill.url, pair.decode.url, timeout_s=5)
    assert not report.ok
    assert _fields(report) == expected
    for row in report.differences:
        assert row.fix == agreement(row.field).fix_for(row.prefill)  # the agreement table's fix


def test_state_types_predicted_from_the_model_and_hybrid_memory_flags(pair_of: Any) -> None:
    both = {"model_path": HYBRID}
    pair = pair_of(prefill=both, decode={**both, "disable_hybrid_swa_memory": True})
    report = run_preflight(pair.prefill.url, pair.decode.url, timeout_s=5)
    assert report.prefill.state_types == ("mamba", "swa")
    assert report.prefill.state_types_source == "predicted"
    assert report.decode.state_types == ("mamba",)  # SWA layers backed by full KV: no swa component
    assert _fields(report) == {"state_types", "disable_hybrid_swa_memory"}
    row = next(d for d in report.differences if d.field == "state_types")
    assert "first KV transfer" in row.detail


def test_swapped_roles_are_refused(pair_of: Any) -> None:
    pair = pair_of()
    report = run_preflight(pair.decode.url, pair.prefill.url, bootstrap_port=pair.bootstrap.port, timeout_s=5)
    assert "role" in _fields(report)


def test_bootstrap_503_is_retried_until_registered(pair_of: Any) -> None:
    busy = text_answer("Prefill server not fully registered yet (0 workers registered).", status=503)
    pair = pair_of(route=[busy, busy, json_answer(fixture("route_prefill.json"))])
    res = runner.invoke(app, ["preflight", "--prefill", pair.prefill.url, "--decode", pair.decode.url,
                              "--bootstrap-port", str(pair.bootstrap.port), "--timeout", "10", "--format", "json"])
    assert res.exit_code == 0, _out(res)
    assert pair.bootstrap.hits[ROUTE] == 3
    doc = json.loads(res.stdout)
    assert doc["ok"] is True and doc["bootstrap_route"]["page_size"] == 64
    assert doc["fingerprints"]["prefill"] == doc["fingerprints"]["decode"]


def test_bootstrap_503_forever_is_a_clear_timeout(pair_of: Any) -> None:
    busy = text_answer("Prefill server not fully registered yet (1 workers registered).", status=503)
    pair = pair_of(route=[busy])
    with pytest.raises(RuntimeFailure) as err:
        run_preflight(pair.prefill.url, pair.decode.url, timeout_s=0.8)
    assert "did not answer within 0.8 s" in str(err.value) and "not fully registered" in str(err.value)
    assert pair.bootstrap.hits[ROUTE] >= 2
    res = runner.invoke(app, ["preflight", "--prefill", pair.prefill.url, "--decode", pair.decode.url,
                              "--timeout", "0.5"])
    assert res.exit_code == 3
    assert "did not answer within" in _out(res) and "Traceback" not in _out(res)


def test_differences_exit_3_with_an_itemized_table(pair_of: Any) -> None:
    pair = pair_of(decode={"page_size": 32, "disaggregation_transfer_backend": "nixl"})
    res = runner.invoke(app, ["preflight", "--prefill", pair.prefill.url, "--decode", pair.decode.url],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 3
    assert "page_size" in _out(res) and "transfer_backend" in _out(res) and "nixl" in _out(res)
    assert "preflight refused the pair: 2 difference(s)" in _out(res)
    res = runner.invoke(app, ["preflight", "--prefill", pair.prefill.url, "--decode", pair.decode.url,
                              "--format", "json"])
    assert res.exit_code == 3
    rows = json.loads(res.stdout)["differences"]
    assert {(r["field"], r["prefill"], r["decode"]) for r in rows} == {("page_size", 64, 32),
                                                                       ("transfer_backend", "mooncake", "nixl")}


def test_server_down_is_a_clear_error(pair_of: Any) -> None:
    pair = pair_of()
    down = f"http://127.0.0.1:{free_port()}"
    res = runner.invoke(app, ["preflight", "--prefill", pair.prefill.url, "--decode", down])
    assert res.exit_code == 3
    assert "decode server" in _out(res) and "not reachable" in _out(res) and "Traceback" not in _out(res)
    res = runner.invoke(app, ["preflight", "--prefill", down, "--decode", pair.decode.url, "--format", "json"])
    assert res.exit_code == 3
    assert json.loads(res.stdout)["ok"] is False


@pytest.mark.parametrize(("answer", "says"), [
    (text_answer("<html><body>Welcome to nginx</body></html>", content_type="text/html"), "answered HTML"),
    (text_answer("OK"), "answered non-JSON"),
    (json_answer(["not", "an", "object"]), "not an object"),
    (text_answer("Internal Server Error", status=500), "HTTP 500"),
    (json_answer({"hello": "world"}), "neither SGLang's nor specctl's"),
    (text_answer("[" * 200_000, content_type="application/json"), "nested too deep"),  # RecursionError
], ids=["html", "text", "json-list", "http-500", "unknown-shape", "too-deep"])
def test_unusable_answers_are_clear_errors(answer: Any, says: str) -> None:
    with FixtureServer({"/server_info": [answer]}) as bad, \
            FixtureServer({"/server_info": [json_answer(fixture("server_info_decode.json"))]}) as good:
        res = runner.invoke(app, ["preflight", "--prefill", bad.url, "--decode", good.url])
    assert res.exit_code == 3, _out(res)
    assert says in _out(res) and "Traceback" not in _out(res)


def test_bad_url_is_a_usage_error() -> None:
    res = runner.invoke(app, ["preflight", "--prefill", "ftp://x", "--decode", "http://127.0.0.1:1"])
    assert res.exit_code == 2 and "not an http://HOST:PORT URL" in _out(res)


def test_running_server_compared_with_the_deployment(pair_of: Any, tmp_path: Path) -> None:
    deploy = tmp_path / "d.yaml"
    deploy.write_text(
        "version: 1\nname: qwen3-next-pd\n"
        f"model: {{target: {HYBRID}, dtype: bfloat16}}\n"
        "cache: {page_size: 16}\n"
        "serve: {max_batch_size: 48}\n"
        "roles:\n  prefill: {host: 127.0.0.1, port: 35101, bootstrap_port: 35102}\n"
        "  decode: {host: 127.0.0.1, port: 35103}\n", encoding="utf-8")
    both = {"model_path": HYBRID, "speculative_algorithm": None}
    pair = pair_of(prefill=both, decode=both)
    res = runner.invoke(app, ["preflight", "--prefill", pair.prefill.url, "--decode", pair.decode.url,
                              "-c", str(deploy), "--format", "json"])
    assert res.exit_code == 3, _out(res)
    doc = json.loads(res.stdout)
    assert doc["differences"] == []
    drift = {(r["role"], r["field"], r["asked"], r["running"]) for r in doc["deployment_differences"]}
    # SGLang resolved page size 64 on both; the deployment asked for 16. Same model, dtype, batch size.
    assert drift == {("prefill", "page_size", 16, 64), ("decode", "page_size", 16, 64)}
    res = runner.invoke(app, ["preflight", "--prefill", pair.prefill.url, "--decode", pair.decode.url,
                              "-c", str(deploy), "--set", "cache.page_size=64"])
    assert res.exit_code == 0, _out(res)


def test_normalise_reads_specctl_extras_on_sglang_shape() -> None:
    # specctl's servers move to SGLang's shape and keep their registration: reported state_types win.
    info = {**fixture("server_info_decode.json"), "registration": {"state_types": ["mamba", "swa"]},
            "fingerprints": {"registration": "abc123"}}
    facts = normalise("http://x", info)
    assert facts.state_types == ("mamba", "swa") and facts.state_types_source == "reported"
    assert facts.reported_fingerprint == "abc123"


def test_adaptive_config_compared_by_content_and_a_fifo_path_is_not_read(tmp_path: Path) -> None:
    # The path comes from the server: a readable file is compared by its content (spelling aside), a
    # FIFO or device is never opened for reading (it would hang or never end): its spelling is compared.
    cfg = tmp_path / "adaptive.json"
    cfg.write_text('{"1": {"candidate_steps": [1, 3]}}')
    fifo = tmp_path / "adaptive.fifo"
    os.mkfifo(fifo)
    base = {**fixture("server_info_decode.json"), "speculative_adaptive": True}
    by_file = normalise("http://x", {**base, "speculative_adaptive_config": str(cfg)})
    assert by_file.adaptive_config == json.dumps({"1": {"candidate_steps": [1, 3]}}, sort_keys=True,
                                                 separators=(",", ":"))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)  # json.loads raises RecursionError, not ValueError
    for path in (str(fifo), "/dev/zero", str(deep)):
        assert normalise("http://x", {**base, "speculative_adaptive_config": path}).adaptive_config == path


def test_bootstrap_port_with_nothing_listening_names_the_flag(pair_of: Any) -> None:
    pair = pair_of()
    res = runner.invoke(app, ["preflight", "--prefill", pair.prefill.url, "--decode", pair.decode.url,
                              "--bootstrap-port", str(free_port()), "--timeout", "0.5"])
    assert res.exit_code == 3
    out = _out(res)
    assert "connection refused" in out and "--disaggregation-bootstrap-port" in out


def test_bootstrap_port_that_is_not_http_says_so(pair_of: Any) -> None:
    # A socket that accepts connections (the kernel's backlog) and never answers: like specctl's
    # ZeroMQ bootstrap, which is not an HTTP server.
    pair = pair_of()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        res = runner.invoke(app, ["preflight", "--prefill", pair.prefill.url, "--decode", pair.decode.url,
                                  "--bootstrap-port", str(silent.getsockname()[1]), "--timeout", "0.6"])
    assert res.exit_code == 3
    out = _out(res)
    assert "timed out" in out and "sent no HTTP answer" in out and "Traceback" not in out


def test_preflight_does_not_import_torch(pair_of: Any) -> None:
    pair = pair_of()
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom specctl.cli.main import app\n"
            f"r = CliRunner().invoke(app, ['preflight', '--prefill', {pair.prefill.url!r}, '--decode', "
            f"{pair.decode.url!r}, '--format', 'json'])\n"
            "assert r.exit_code == 0, r.output\nprint('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_engine_sglang_deployment_gives_urls_and_bootstrap_port(pair_of: Any, tmp_path: Path) -> None:
    # prefill's own report names a dead bootstrap port: passing proves the deployment's port was used.
    pair = pair_of(prefill={"model_path": HYBRID})
    pair.prefill.routes["/server_info"] = [json_answer({**fixture("server_info_prefill.json"),
                                                        "model_path": HYBRID,
                                                        "disaggregation_bootstrap_port": free_port()})]
    pair.decode.routes["/server_info"] = [json_answer({**fixture("server_info_decode.json"), "model_path": HYBRID})]
    deploy = tmp_path / "sg.yaml"
    deploy.write_text(
        f"version: 1\nname: sg\nengine: sglang\nmodel: {{target: {HYBRID}, dtype: bfloat16}}\n"
        "roles:\n"
        f"  prefill: {{host: 127.0.0.1, port: {pair.prefill.port}, bootstrap_port: {pair.bootstrap.port}}}\n"
        f"  decode: {{host: 127.0.0.1, port: {pair.decode.port}}}\n", encoding="utf-8")
    res = runner.invoke(app, ["preflight", "-c", str(deploy), "--format", "json"])
    doc = json.loads(res.stdout)
    assert doc["differences"] == [] and doc["bootstrap_route"]["page_size"] == 64
    assert pair.bootstrap.hits[ROUTE] == 1
    # What the deployment left to defaults differs from what SGLang resolved: reported, exit 3.
    assert res.exit_code == 3
    assert {r["field"] for r in doc["deployment_differences"]} >= {"page_size", "speculative_algorithm"}


def test_without_urls_or_a_deployment_is_a_usage_error() -> None:
    res = runner.invoke(app, ["preflight", "--prefill", "http://127.0.0.1:1"])
    assert res.exit_code == 2 and "give --prefill URL and --decode URL, or -c DEPLOY" in _out(res)
    res = runner.invoke(app, ["preflight", "-c", "tiny-colocated"])
    assert res.exit_code == 2 and "declares no prefill or decode role" in _out(res)
