"""validate never crashes and never hangs: non-regular files are refused with a finding,
path errors are findings, model config.json reading is capped, one bad file never loses the others'
report (also with --format json), an internal error is exit 3; plus a derandomized fuzz test mutating
presets, SGLang commands and model configs."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from validate_helpers import DATA, run_cli, run_json

GOOD = "version: 1\nmodel: {target: 'builtin:tiny-hybrid', dtype: float32}\n"
SGLANG_EXAMPLES = sorted((DATA / "sglang").rglob("*.sh"))
MODEL_CONFIGS = sorted((DATA / "models").glob("*/config.json"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _cli_subprocess(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "specctl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_fifo_as_input_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "deploy.yaml"
    os.mkfifo(fifo)
    (tmp_path / "good.yaml").write_text(GOOD)
    # a real process with a timeout: a hang fails the test instead of blocking the suite
    proc = _cli_subprocess("validate", "--format", "json", str(fifo), str(tmp_path / "good.yaml"))
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2
    bad, good = doc["files"]
    assert bad["findings"][0]["code"] == "SCH000" and "FIFO" in bad["findings"][0]["message"]
    assert good["ok"] is True


def test_devices_and_sockets_are_refused(tmp_path: Path) -> None:
    sock_path = tmp_path / "s.yaml"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(sock_path))
        code, doc = run_json("/dev/null", "/dev/zero", str(sock_path))
    finally:
        s.close()
    assert code == 2
    msgs = [f["findings"][0]["message"] for f in doc["files"]]
    assert "a device" in msgs[0] and "a device" in msgs[1] and "socket" in msgs[2]


def test_path_errors_are_findings(tmp_path: Path) -> None:
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    long_name = str(tmp_path / ("x" * 300 + ".yaml"))
    (tmp_path / "good.yaml").write_text(GOOD)
    code, doc = run_json(str(loop), long_name, str(tmp_path / "good.yaml"), str(tmp_path / "missing.yaml"))
    assert code == 2
    msgs = [f["findings"][0]["message"] if f["findings"] else "" for f in doc["files"]]
    assert "symbolic links" in msgs[0]
    assert "too long" in msgs[1]
    assert doc["files"][2]["ok"] is True
    assert "no such file" in msgs[3]


def test_long_model_target_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    p.write_text(f"version: 1\nmodel: {{target: /{'m' * 300}/x}}\n")
    (tmp_path / "good.yaml").write_text(GOOD)
    code, doc = run_json(str(p), str(tmp_path / "good.yaml"))
    assert code == 0, doc
    assert [f["code"] for f in doc["files"][0]["findings"]] == ["MOD701"]


@pytest.mark.parametrize("kind", ["fifo", "deep", "huge", "dir", "binary"])
def test_bad_model_config_json_is_a_finding(tmp_path: Path, kind: str) -> None:
    model = tmp_path / "m"
    model.mkdir()
    cfg = model / "config.json"
    if kind == "fifo":
        os.mkfifo(cfg)
    elif kind == "deep":
        cfg.write_text('{"a": ' * 5000 + "1" + "}" * 5000)
    elif kind == "huge":
        cfg.write_text('{"a": "' + "x" * (5 * 1024 * 1024) + '"}')
    elif kind == "dir":
        cfg.mkdir()
    else:
        cfg.write_bytes(b"\xff\xfe\x00")
    dep = tmp_path / "d.yaml"
    dep.write_text(f"version: 1\nmodel: {{target: {model}}}\n")
    cmd = tmp_path / "c.sh"
    cmd.write_text(f"python -m sglang.launch_server --model-path {model}\n")
    (tmp_path / "good.yaml").write_text(GOOD)
    proc = _cli_subprocess("validate", "--format", "json", str(dep), str(cmd), str(tmp_path / "good.yaml"))
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    for f in doc["files"][:2]:
        assert [x["code"] for x in f["findings"] if x["severity"] == "error"] == ["MOD704"], f
    assert doc["files"][2]["ok"] is True
    assert "Traceback" not in proc.stderr


def test_mixed_good_and_bad_files_keep_every_report(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "syntax.yaml").write_text("version: [1\n")
    (tmp_path / "bin.yaml").write_bytes(b"\x00\x01")
    (tmp_path / "cmd.sh").write_text("python -m sglang.launch_server --model-path /m --page-size x\n")
    code, doc = run_json(*(str(tmp_path / n) for n in ("good.yaml", "syntax.yaml", "bin.yaml", "cmd.sh", "none")))
    assert code == 2 and len(doc["files"]) == 5
    assert [f["ok"] for f in doc["files"]] == [True, False, False, False, False]
    assert "SGL003" in {f["code"] for f in doc["files"][3]["findings"]}


def test_internal_error_is_exit_3_and_keeps_the_other_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specctl.schemas import rules_capacity

    def boom(ctx: Any) -> list[Any]:
        if "bad" in ctx.name:
            raise RuntimeError("simulated bug")
        return []

    monkeypatch.setattr(rules_capacity, "check", boom)
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "bad.yaml").write_text(GOOD)
    code, doc = run_json(str(tmp_path / "bad.yaml"), str(tmp_path / "good.yaml"))
    assert code == 3
    assert "internal error" in doc["files"][0]["findings"][0]["message"]
    assert doc["files"][1]["ok"] is True


# -- derandomized fuzz -------------------------------------------------------------------------------


def _mutate_text(text: str, rng: random.Random) -> str:
    chars = list(text)
    pieces = ["\\", "'", '"', "#", "\n", " --", "=", "-", "$", ";", "&&", "\x00", "é", "--page-size", "999999999999"]
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(3)
        i = rng.randrange(len(chars) + 1)
        if op == 0 and chars:
            del chars[min(i, len(chars) - 1)]
        elif op == 1:
            chars.insert(i, rng.choice(pieces))
        else:
            words = "".join(chars).split(" ")
            rng.shuffle(words)
            chars = list(" ".join(words))
    return "".join(chars)


def _mutate_json(value: Any, rng: random.Random, depth: int = 0) -> Any:
    junk = [None, True, -1, 0, 2**70, 1.5, "x", [], {}, [1, 2], {"a": 1}, "full_attention", "sliding_attention"]
    if isinstance(value, dict) and value and rng.random() < 0.8:
        out = dict(value)
        k = rng.choice(list(out))
        if rng.random() < 0.3:
            del out[k]
        else:
            out[k] = _mutate_json(out[k], rng, depth + 1) if depth < 3 else rng.choice(junk)
        return out
    if isinstance(value, list) and value and rng.random() < 0.7:
        out_l = list(value)
        out_l[rng.randrange(len(out_l))] = rng.choice(junk)
        return out_l
    return rng.choice(junk)


def _assert_clean(result: Any) -> None:
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output[-2000:])
    assert "Traceback" not in result.output
    doc = json.loads(result.stdout)
    for f in doc["files"]:
        for x in f["findings"]:
            assert x["code"] and x["message"] and x["path"]


@settings(derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_fuzz_sglang_commands_and_model_configs(seed: int) -> None:
    import tempfile

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = rng.choice(SGLANG_EXAMPLES)
        cfg = json.loads(rng.choice(MODEL_CONFIGS).read_text())
        (root / "m").mkdir()
        (root / "m" / "config.json").write_text(json.dumps(_mutate_json(cfg, rng)))
        text = src.read_text().replace("models/", f"{root}/").replace("qwen3-next", "m").replace("llama", "m")
        for name in ("adaptive.json", "server.yaml"):
            if (src.parent / name).exists():
                (root / name).write_text(src.parent.joinpath(name).read_text())
        (root / "p.sh").write_text(_mutate_text(text, rng))
        (root / "d.sh").write_text(text.replace("prefill", "decode"))
        _assert_clean(run_cli("validate", "--format", "json", "--no-table", str(root / "p.sh"), str(root / "d.sh")))
        model = run_cli("model", str(root / "m"), "--format", "json")
        assert model.exit_code in (0, 2) and "Traceback" not in model.output


@settings(derandomize=True, max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_fuzz_presets_as_text(seed: int) -> None:
    import tempfile

    from specctl import presets

    rng = random.Random(seed)
    text = presets.read_text(rng.choice(presets.names()))
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "d.yaml"
        p.write_text(_mutate_text(text, rng), encoding="utf-8", errors="surrogateescape")
        _assert_clean(run_cli("validate", "--format", "json", "--no-table", str(p)))


def test_internal_error_in_a_pair_rule_keeps_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specctl.schemas import rules_pd

    def boom(p: Any, d: Any) -> list[Any]:
        raise KeyError("simulated")

    monkeypatch.setattr(rules_pd, "check_pair", boom)
    base = "python -m sglang.launch_server --model-path /models/x --page-size 16 "
    (tmp_path / "p.sh").write_text(base + "--disaggregation-mode prefill --port 31401\n")
    (tmp_path / "d.sh").write_text(base + "--disaggregation-mode decode --port 31402 --disable-radix-cache\n")
    (tmp_path / "good.yaml").write_text(GOOD)
    code, doc = run_json(str(tmp_path / "p.sh"), str(tmp_path / "d.sh"), str(tmp_path / "good.yaml"))
    assert code == 3
    p, d, good = doc["files"]
    assert p["ok"] and good["ok"] and not d["ok"]
    assert any("internal error while comparing it with" in f["message"] for f in d["findings"])
