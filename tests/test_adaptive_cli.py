"""`specctl adaptive simulate` through Typer's runner: outputs, routing, deployment input, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specctl.cli.main import app

DATA = Path(__file__).parent / "data" / "adaptive"
DEFAULT_JSON = DATA / "sglang" / "valid" / "sglang_default.json"
PHASES = DATA / "traces" / "phases.jsonl"
DEPLOY = DATA / "deployment_small.yaml"


def run(*args: str | Path):
    return CliRunner().invoke(app, ["adaptive", "simulate", *map(str, args)], env={"COLUMNS": "200"})


def json_lines(result) -> list[dict]:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return [json.loads(line) for line in result.stdout.splitlines()]


def write_trace(tmp_path: Path, records: list[dict]) -> Path:
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return p


def test_json_output_one_line_per_record_with_hand_computed_values() -> None:
    out = json_lines(run(DEFAULT_JSON, "--trace", PHASES, "--format", "json"))
    assert len(out) == sum(1 for line in PHASES.read_text().splitlines() if line.strip())
    assert all(set(o) == {"index", "batch_size", "steps", "ema", "switched"} for o in out)
    assert [o["index"] for o in out] == list(range(len(out)))
    # Bucket 1 starts at 3 with EMA 2; five accepted per batch: ema_n = 5 - 3 * 0.8**n.
    assert out[0] == {"index": 0, "batch_size": 1, "steps": 3, "ema": pytest.approx(2.6), "switched": False}
    # Warm-up 10 batches, then a decision every 5: the first one is batch 15 (index 14), and an EMA of
    # 4.89 > 4.5 climbs 3 -> 5 -> 7 in that one decision.
    assert [o["switched"] for o in out[:14]] == [False] * 14
    assert out[14]["switched"] and out[14]["steps"] == 7
    assert out[14]["ema"] == pytest.approx(5 - 3 * 0.8**15)
    assert out[30] == {"index": 30, "batch_size": 2, "steps": 7, "ema": out[29]["ema"], "switched": False}  # empty


def test_text_output_has_table_and_summary() -> None:
    result = run(DEFAULT_JSON, "--trace", PHASES)
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert text.splitlines()[0].split() == ["index", "batch", "bucket", "ran", "accepted", "ema", "steps"]
    assert "switch 3 -> 7" in text
    assert "81 verify records (1 empty)" in text
    assert "switches: " in text and "batches run at each step:" in text and "steps 7:" in text
    shares = [float(line.split("(")[1].rstrip("%)")) for line in text.splitlines() if line.startswith("  steps ")]
    assert sum(shares) == pytest.approx(100.0, abs=0.5)


def test_graph_padding_changes_the_bucket(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, [{"batch_size": 5, "accepted": [1] * 5}])
    plain = json_lines(run(DEFAULT_JSON, "--trace", trace, "--initial-steps", "5", "--format", "json"))
    padded = json_lines(run(DEFAULT_JSON, "--trace", trace, "--initial-steps", "5", "--graph-batch-sizes", "1,2,4,16",
                            "--format", "json"))
    assert plain[0]["steps"] == 5  # bucket 1 starts at the initial 5
    assert padded[0]["steps"] == 1  # 5 pads to 16 -> bucket 8 [0, 1, 3] starts at its middle candidate


def test_deployment_file_uses_its_knobs_graphs_and_num_steps(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, [{"batch_size": 5, "accepted": [0] * 5}] * 8 + [{"batch_size": 1, "accepted": [9]}])
    out = json_lines(run(DEPLOY, "--trace", trace, "--format", "json"))
    # bs 5 pads to 8 -> bucket 8 [0, 1, 3] (down_hysteresis 0.0; warm-up 2, interval 2: decisions at
    # batches 4, 6, 8). The EMA 2 * 0.8**n is 0.82 and 0.52 at the first two (> 1 - 0.5: hold), 0.34 at
    # batch 8: <= 0.5 drops to 1, and <= 0.5 + 0.0 (the bar to 0) drops on to 0 in the same decision.
    assert [o["switched"] for o in out] == [False] * 7 + [True, False]
    assert out[7]["steps"] == 0 and out[7]["ema"] == pytest.approx(2 * 0.8**8)
    assert out[8]["steps"] == 3  # bucket 1 untouched by bucket 8's history
    over = json_lines(run(DEPLOY, "--trace", trace, "--format", "json", "--set", "speculative.num_steps=5"))
    assert over[8]["steps"] == 5


def test_deployment_without_adaptive_is_a_usage_error(tmp_path: Path) -> None:
    text = DEPLOY.read_text().split("  adaptive:")[0] + "serve:\n  max_batch_size: 16\n"
    p = tmp_path / "fixed.yaml"
    p.write_text(text)
    result = run(p, "--trace", PHASES)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "no adaptive steps" in result.stderr


def test_config_errors_exit_1_with_findings() -> None:
    result = run(DEFAULT_JSON, "--trace", PHASES, "--initial-steps", "2")
    assert result.exit_code == 1
    assert "ADP101" in result.stderr and "--speculative-num-steps=2 is not in the adaptive config" in result.stderr
    assert result.stdout == ""
    result = run(DATA / "sglang" / "invalid" / "update_interval_zero.json", "--trace", PHASES)
    assert result.exit_code == 1 and "ADP211 $.update_interval" in result.stderr


def test_warnings_go_to_stderr_and_the_run_continues() -> None:
    result = run(DATA / "sglang" / "invalid" / "oscillating.json", "--trace", PHASES, "--format", "json")
    assert result.exit_code == 0 and "ADP218" in result.stderr
    assert len(result.stdout.splitlines()) == 81


def test_a_strategy_key_is_ignored_as_sglang_ignores_it(tmp_path: Path) -> None:
    """SGLang's loader has no strategy key: the file replays under the EMA policy, with the warning."""
    p = tmp_path / "ta.json"
    p.write_text(json.dumps({"strategy": "throughput_aware", "1": {"candidate_steps": [1, 3]}}))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}}))
    result = run(p, "--trace", PHASES, "--format", "json")
    assert result.exit_code == 0 and "ADP222" in result.stderr
    assert result.stdout == run(plain, "--trace", PHASES, "--format", "json").stdout


def test_empty_trace(tmp_path: Path) -> None:
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n")
    assert run(DEFAULT_JSON, "--trace", p, "--format", "json").stdout == ""
    result = run(DEFAULT_JSON, "--trace", p)
    assert result.exit_code == 0 and "0 verify records" in result.stdout


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"accepted": [1]}', "batch_size must be a positive integer, got null"),
        ('{"batch_size": 0, "accepted": [1]}', "got 0"),
        ('{"batch_size": true, "accepted": [1]}', "got true"),
        ('{"batch_size": 2, "accepted": "12"}', "accepted must be a list"),
        ('{"batch_size": 2, "accepted": [1.5]}', "accepted[0] must be a non-negative integer, got 1.5"),
        ('{"batch_size": 2, "accepted": [1, true]}', "accepted[1] must be a non-negative integer, got true"),
        ('{"batch_size": 2, "accepted": [NaN]}', "got nan"),
    ],
)
def test_bad_trace_lines_name_the_line(tmp_path: Path, line: str, needle: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"batch_size": 1, "accepted": [1]}\n\n' + line + "\n")
    result = run(DEFAULT_JSON, "--trace", p, "--format", "json")
    assert result.exit_code == 2
    assert f"{p}:3:" in result.stderr and needle in result.stderr
    assert result.stdout == ""  # the trace is checked before anything is printed
    assert "Traceback" not in result.stderr


def test_unreadable_inputs_exit_2(tmp_path: Path) -> None:
    assert run(tmp_path / "missing.json", "--trace", PHASES).exit_code == 2
    assert run(DEFAULT_JSON, "--trace", tmp_path / "missing.jsonl").exit_code == 2
    assert run(DEFAULT_JSON, "--trace", tmp_path).exit_code == 2
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\n")
    result = run(DEFAULT_JSON, "--trace", tmp_path / "bin.jsonl")
    assert result.exit_code == 2 and "not UTF-8" in result.stderr
    assert run(DEFAULT_JSON, "--trace", PHASES, "--graph-batch-sizes", "1,x").exit_code == 2


def test_simulation_never_imports_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from specctl.adaptive.setup import load_setup\n"
        "from specctl.adaptive.simulate import simulate\n"
        "from specctl.adaptive.trace import read_trace\n"
        f"setup = load_setup({str(DEPLOY)!r})\n"
        f"steps, _ = simulate(setup, read_trace({str(PHASES)!r}))\n"
        "assert steps and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:3]\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
