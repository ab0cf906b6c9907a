"""Workloads, arrival schedules and option parsers of the bench client (no HTTP)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from specctl.bench.arrivals import arrival_offsets, count_for_duration
from specctl.bench.config import WorkloadConfig, parse_concurrencies, parse_rates, parse_slo, sweep_points
from specctl.bench.workload import build_workload
from specctl.errors import UsageError


def test_random_prompts_are_seeded_and_exactly_sized() -> None:
    cfg = WorkloadConfig(num_prompts=20, random_input_len=50, random_output_len=7, seed=3)
    a, b = build_workload(cfg), build_workload(cfg)
    assert a == b
    assert build_workload(WorkloadConfig(num_prompts=20, random_input_len=50, seed=4)) != a
    for p in a:
        assert len(p.text.encode()) == p.prompt_len == 50
        assert p.output_len == 7
        assert p.text.isascii()


def test_random_range_ratio_bounds_lengths() -> None:
    ps = build_workload(WorkloadConfig(num_prompts=200, random_input_len=100, random_output_len=40,
                                       random_range_ratio=0.5))
    ins = [p.prompt_len for p in ps]
    outs = [p.output_len for p in ps]
    assert min(ins) >= 50 and max(ins) <= 100 and len(set(ins)) > 10
    assert min(outs) >= 20 and max(outs) <= 40
    assert all(len(p.text.encode()) == p.prompt_len for p in ps)


def test_shared_prefix_groups_share_their_system_prompt() -> None:
    cfg = WorkloadConfig(dataset_name="shared-prefix", gsp_num_groups=3, gsp_prompts_per_group=4,
                         gsp_system_prompt_len=64, gsp_question_len=10, gsp_output_len=5)
    ps = build_workload(cfg)
    assert len(ps) == 12
    prefixes: dict[int, set[str]] = {}
    for p in ps:
        assert p.group is not None
        prefixes.setdefault(p.group, set()).add(p.text[:64])
    assert all(len(v) == 1 for v in prefixes.values())
    assert len({next(iter(v)) for v in prefixes.values()}) == 3
    # Shuffled: the first four are not all from one group.
    assert len({p.group for p in ps[:4]}) > 1


def test_jsonl_dataset(tmp_path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "def f(x):\n", "output_len": 9}) + "\n\n"
                 + json.dumps({"text": "import os\n"}) + "\n" + json.dumps("plain string") + "\n")
    ps = build_workload(WorkloadConfig(dataset_name="jsonl", dataset_path=str(f), num_prompts=5,
                                       random_output_len=11))
    assert [p.text for p in ps] == ["def f(x):\n", "import os\n", "plain string", "def f(x):\n", "import os\n"]
    assert [p.output_len for p in ps[:3]] == [9, 11, 11]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2"):
        build_workload(WorkloadConfig(dataset_name="jsonl", dataset_path=str(bad)))
    with pytest.raises(UsageError, match="--dataset-path"):
        build_workload(WorkloadConfig(dataset_name="jsonl"))
    with pytest.raises(UsageError, match="no such file"):
        build_workload(WorkloadConfig(dataset_name="jsonl", dataset_path=str(tmp_path / "missing.jsonl")))


def test_sharegpt_dataset(tmp_path) -> None:
    convs = [
        {"conversations": [{"from": "human", "value": "Write a sort function"},
                           {"from": "gpt", "value": "def sort(xs): return sorted(xs)"}]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}]},  # too short
        {"conversations": [{"from": "human", "value": "Explain recursion please"}]},  # no reply
        {"conversations": [{"from": "human", "value": "What is a closure?"},
                           {"from": "gpt", "value": "A function with captured variables."}]},
    ]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(convs))
    ps = build_workload(WorkloadConfig(dataset_name="sharegpt", dataset_path=str(f), num_prompts=2))
    assert sorted(p.text for p in ps) == ["What is a closure?", "Write a sort function"]
    assert {p.output_len for p in ps} == {len("def sort(xs): return sorted(xs)"),
                                         len("A function with captured variables.")}
    ps = build_workload(WorkloadConfig(dataset_name="sharegpt", dataset_path=str(f), num_prompts=2,
                                       sharegpt_output_len=5))
    assert {p.output_len for p in ps} == {5}


def test_code_prompts_end_at_a_function_header() -> None:
    cfg = WorkloadConfig(dataset_name="code", num_prompts=30, random_input_len=200, random_output_len=24)
    ps = build_workload(cfg)
    assert len(ps) == 30 and ps == build_workload(cfg)
    assert len({p.text for p in ps}) > 10
    for p in ps:
        last = p.text.rstrip("\n").splitlines()[-1].strip()
        assert last.startswith(("def ", "async def ")) and last.endswith(":"), last
        assert p.prompt_len <= 200 and p.output_len == 24


def test_unknown_dataset_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown --dataset-name"):
        build_workload(WorkloadConfig(dataset_name="nope"))


@pytest.mark.parametrize("burstiness, cv", [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_arrivals_keep_the_rate_exact_and_the_shape(burstiness: float, cv: float) -> None:
    n, rate = 4001, 50.0
    offs = arrival_offsets(n, rate, burstiness=burstiness, seed=7)
    assert offs[0] == 0.0 and all(b >= a for a, b in zip(offs, offs[1:], strict=False))
    assert offs[-1] == pytest.approx((n - 1) / rate, rel=1e-9)
    gaps = [b - a for a, b in zip(offs, offs[1:], strict=False)]
    # Coefficient of variation of gamma(k) gaps is 1/sqrt(k).
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)
    assert offs == arrival_offsets(n, rate, burstiness=burstiness, seed=7)
    assert offs != arrival_offsets(n, rate, burstiness=burstiness, seed=8)


def test_arrivals_constant_and_infinite() -> None:
    offs = arrival_offsets(5, 4.0, burstiness=math.inf)
    assert offs == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    assert count_for_duration(2.0, 10.0) == 21
    with pytest.raises(UsageError):
        arrival_offsets(3, 1.0, burstiness=0.0)


def test_option_parsers() -> None:
    assert parse_rates("1, 2,4") == [1.0, 2.0, 4.0]
    assert parse_rates("inf") == [math.inf]
    assert parse_concurrencies("1,4,16") == [1, 4, 16]
    assert parse_concurrencies(None) == [None]
    assert [p.label() for p in sweep_points([1.0, math.inf], [None, 4])] == [
        "rate=1 conc=-", "rate=1 conc=4", "rate=inf conc=-", "rate=inf conc=4"]
    assert parse_slo("ttft=0.4,tpot=40ms,e2e=2s") == {"ttft": 0.4, "tpot": pytest.approx(0.04), "e2e": 2.0}
    for bad in ("0", "-1", "x"):
        with pytest.raises(UsageError, match="--request-rate"):
            parse_rates(bad)
    with pytest.raises(UsageError, match="--max-concurrency"):
        parse_concurrencies("0")
    with pytest.raises(UsageError, match="--slo"):
        parse_slo("latency=1")


def test_bench_client_is_torch_free() -> None:
    import subprocess
    import sys

    code = ("import sys, pkgutil, importlib, specctl.bench as b\n"
            "for m in pkgutil.iter_modules(b.__path__): importlib.import_module('specctl.bench.' + m.name)\n"
            "import specctl.cli.bench\n"
            "print(sorted(x for x in ('torch', 'matplotlib', 'specctl.engine.model') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
