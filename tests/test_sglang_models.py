"""Model facts of the families SGLang serves, from config.json fixtures (tests/data/models/*), and
`specctl model`. The expected layer kinds and state_types are derived from SGLang 0.5.23's code:
`configs/model_config.py is_hybrid_swa_model`, `configs/hybrid_arch.py mambaish_config`, the Gemma 2/3
override forcing `disable_hybrid_swa_memory`, and `disaggregation/utils.py setup_state_kv_args`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from validate_helpers import DATA, run_cli, run_json

from specctl.schemas.model_facts import load_model_facts
from specctl.schemas.sglang.families import sglang_model

MODELS = DATA / "models"
# name -> (architecture, layer kind counts, state_types with default flags, with --kv-cache-dtype mxfp8,
#          with --disable-hybrid-swa-memory)
EXPECTED = {
    "qwen3-next": ("Qwen3NextForCausalLM", {"linear": 36, "full": 12}, ["mamba"], ["mamba"], ["mamba"]),
    "nemotron-h": ("NemotronHForCausalLM", {"mamba": 24, "mlp": 24, "full": 4}, ["mamba"], ["mamba"], ["mamba"]),
    "falcon-h1": ("FalconH1ForCausalLM", {"hybrid": 44}, ["mamba"], ["mamba"], ["mamba"]),
    "gpt-oss": ("GptOssForCausalLM", {"swa": 12, "full": 12}, ["swa"], ["swa", "block_scale", "block_scale_swa"], []),
    "gemma3": ("Gemma3ForCausalLM", {"swa": 22, "full": 4}, [], ["block_scale"], []),
    "mistral": ("MistralForCausalLM", {"full": 32}, [], ["block_scale"], []),
    "llama": ("LlamaForCausalLM", {"full": 32}, [], ["block_scale"], []),
    "qwen3": ("Qwen3ForCausalLM", {"full": 36}, [], ["block_scale"], []),
    "qwen2": ("Qwen2ForCausalLM", {"full": 28}, [], ["block_scale"], []),
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # no hub, ever: local directories only
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_family_facts(name: str) -> None:
    arch, kinds, default, mxfp8, no_swa = EXPECTED[name]
    cfg = json.loads((MODELS / name / "config.json").read_text())
    m = sglang_model(cfg)
    assert m.known and m.architecture == arch and dict(Counter(m.layer_kinds)) == kinds
    assert list(m.state_types()) == default
    assert list(m.state_types(kv_cache_dtype="mxfp8")) == mxfp8
    assert list(m.state_types(disable_hybrid_swa_memory=True)) == no_swa
    facts = load_model_facts(str(MODELS / name), engine=False)
    assert list(facts.state_types) == default and facts.architecture == arch


def test_layer_positions_follow_the_config() -> None:
    qn = sglang_model(json.loads((MODELS / "qwen3-next" / "config.json").read_text()))
    assert qn.layer_kinds[:4] == ("linear", "linear", "linear", "full")  # full_attention_interval 4
    gpt = sglang_model(json.loads((MODELS / "gpt-oss" / "config.json").read_text()))
    assert gpt.layer_kinds[:2] == ("swa", "full")
    g3 = sglang_model(json.loads((MODELS / "gemma3" / "config.json").read_text()))
    assert g3.layer_kinds[5] == "full" and g3.layer_kinds[4] == "swa"  # sliding_window_pattern 6


def test_engine_api_unchanged_for_engine_architectures() -> None:
    from specctl.errors import UsageError

    facts = load_model_facts("builtin:tiny-hybrid")
    assert facts.state_types == ("mamba", "swa")  # the builtin engine's own derivation
    with pytest.raises(UsageError, match="unsupported architecture"):
        load_model_facts(str(MODELS / "qwen3-next"))  # the builtin engine cannot run it


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_command_json(name: str) -> None:
    result = run_cli("model", str(MODELS / name), "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {"architecture", "layer_kinds", "state_types"} <= set(doc)
    assert doc["architecture"] == EXPECTED[name][0] and doc["state_types"] == EXPECTED[name][2]


def test_model_command_with_sglang_args_and_text() -> None:
    result = run_cli("model", str(MODELS / "gpt-oss" / "config.json"), "--sglang-args", "--kv-cache-dtype mxfp8",
                     "--format", "json")
    assert json.loads(result.stdout)["state_types"] == ["swa", "block_scale", "block_scale_swa"]
    text = run_cli("model", str(MODELS / "nemotron-h"))
    assert text.exit_code == 0 and "state_types   [mamba]" in text.stdout
    bad = run_cli("model", str(MODELS / "llama"), "--sglang-args", "--kv-cache-dtype fp9")
    assert bad.exit_code == 2 and "invalid choice" in bad.stderr
    quote = run_cli("model", str(MODELS / "llama"), "--sglang-args", "--kv-cache-dtype 'mxfp8")
    assert quote.exit_code == 2 and "--sglang-args: unbalanced single quote" in quote.stderr
    unknown = run_cli("model", str(MODELS / "unknown-arch"), "--format", "json")
    assert unknown.exit_code == 0 and json.loads(unknown.stdout)["known"] is False


def test_model_command_refuses_unreadable_configs(tmp_path: Path) -> None:
    import os

    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "config.json").write_text("[" * 5000 + "]" * 5000)
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "config.json")
    (tmp_path / "dir" / "config.json").mkdir(parents=True)
    for name, words in [("deep", "nested deeper"), ("fifo", "FIFO"), ("dir", "directory"), ("nope", "no config.json")]:
        result = run_cli("model", str(tmp_path / name))
        assert result.exit_code == 2 and words in result.stderr, (name, result.stderr)
        assert "Traceback" not in result.output


def _pair(tmp: Path, model: str, pextra: str = "", dextra: str = "") -> tuple[int, dict]:
    base = f"python -m sglang.launch_server --model-path {MODELS / model} --page-size 16 "
    (tmp / "p.sh").write_text(base + f"--disaggregation-mode prefill --port 31201 {pextra}\n")
    (tmp / "d.sh").write_text(base + f"--disaggregation-mode decode --port 31202 --disable-radix-cache {dextra}\n")
    return run_json("--no-table", str(tmp / "p.sh"), str(tmp / "d.sh"))


@pytest.mark.parametrize("model,pextra,dextra,expect", [
    ("qwen3-next", "", "", []),
    ("nemotron-h", "--tp-size 2", "--tp-size 1", []),  # mooncake slices Mamba state across TP sizes
    ("gpt-oss", "--tp-size 2 --disaggregation-transfer-backend nixl",
     "--tp-size 1 --disaggregation-transfer-backend nixl", ["SGL204"]),  # nixl cannot reslice SWA state
    ("gpt-oss", "", "--disable-hybrid-swa-memory", ["SGL206", "SGL207"]),
    ("gpt-oss", "--kv-cache-dtype mxfp8", "--kv-cache-dtype mxfp8", []),
    ("llama", "", "--kv-cache-dtype mxfp8", ["SGL202", "SGL207"]),
    ("llama", "--tp-size 2", "--tp-size 1", []),  # plain attention: heterogeneous TP is fine
    ("falcon-h1", "", "--mamba-ssm-dtype float32", ["SGL205"]),
])
def test_real_family_pairs(tmp_path: Path, model: str, pextra: str, dextra: str, expect: list[str]) -> None:
    code, doc = _pair(tmp_path, model, pextra, dextra)
    got = sorted(f["code"] for f in doc["files"][1]["findings"] if f["severity"] == "error")
    assert got == expect
    assert code == (1 if expect else 0)


def test_unknown_architecture_is_info_and_the_rest_is_checked(tmp_path: Path) -> None:
    code, doc = _pair(tmp_path, "unknown-arch", "--page-size 32")
    codes = {(f["code"], f["severity"]) for x in doc["files"] for f in x["findings"]}
    assert ("MOD705", "info") in codes and ("PD503", "error") in codes
    assert code == 1
