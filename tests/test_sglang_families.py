"""Every family SGLang 0.5.23 serves, from config.json fixtures (tests/data/models/*): state_types, layer
kinds, MTP heads, draft checks and MOD703 in SGLang's flags, and the generated family table.

Two oracles: SGLang's own family predicates (`is_deepseek_dsa`, `is_hybrid_swa_model`,
`get_hybrid_layer_ids`, `parse_qsa_profile`, the MiniMax sparse layer split, `is_kda_layer` ...) executed
on each fixture in a child process (tests/sglang_family_oracle.py), and the state_types each pool
registers in `disaggregation/utils.py setup_state_kv_args`, written below per family and flag set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from validate_helpers import DATA, run_cli, run_json

from specctl.schemas.sglang.families import POOL_DSV4, POOL_SWA, sglang_model

ROOT = Path(__file__).resolve().parent.parent
MODELS = DATA / "models"
sys.path.insert(0, str(ROOT / "scripts"))

import gen_sglang_families as gen  # noqa: E402

# name -> (architecture, layer kind counts, {flags: state_types}); flags: "" default, "mx" --kv-cache-dtype
# mxfp8, "noswa" --disable-hybrid-swa-memory, "eagle" / "dspark" --speculative-algorithm (draft pools)
EXPECTED: dict[str, tuple[str, dict[str, int], dict[str, list[str]]]] = {
    "deepseek-v3.1": ("DeepseekV3ForCausalLM", {"full": 61}, {"": [], "mx": [], "eagle": []}),
    "deepseek-v3.2": ("DeepseekV32ForCausalLM", {"full": 61}, {"": ["dsa"], "mx": ["dsa"], "eagle": ["dsa"]}),
    "glm-5": ("GlmMoeDsaForCausalLM", {"full": 78}, {"": ["dsa"], "mx": ["dsa"]}),
    "glm5-next": ("Glm5NextForConditionalGeneration", {"linear": 34, "full": 11}, {
        "": ["mamba", "dsa"], "mx": ["mamba", "dsa"]}),  # KDA beside DSA: the hybrid linear pool with use_dsa
    "deepseek-v4": ("DeepseekV4ForCausalLM", {"full": 43}, {
        "": ["swa", "c128_state"], "mx": ["swa", "c128_state"], "noswa": ["swa", "c128_state"],
        "eagle": ["swa", "c128_state", "swa"], "dspark": ["swa", "c128_state", "swa", "request_row"]}),
    "kimi-k3": ("KimiK3ForConditionalGeneration", {"linear": 21, "full": 6}, {"": ["mamba"], "mx": ["mamba"]}),
    "minimax-m3-sparse": ("MiniMaxM3SparseForCausalLM", {"full": 15, "sparse": 45}, {
        "": ["minimax_index_k", "minimax_dense_kv"], "mx": ["minimax_index_k", "minimax_dense_kv"]}),
    "qwen4-exp": ("Qwen4ExpForConditionalGeneration", {"linear": 30, "full": 10}, {
        "": ["mamba", "qsa_pending", "qsa_compressed"]}),
    "qwen3.5": ("Qwen3_5MoeForConditionalGeneration", {"linear": 30, "full": 10}, {"": ["mamba"], "mx": ["mamba"]}),
    "qwen3-next": ("Qwen3NextForCausalLM", {"linear": 36, "full": 12}, {"": ["mamba"], "mx": ["mamba"]}),
    "gemma4": ("Gemma4ForConditionalGeneration", {"swa": 25, "full": 5}, {
        "": ["swa"], "mx": ["swa", "block_scale", "block_scale_swa"], "noswa": []}),
    "gemma4-assistant": ("Gemma4AssistantForCausalLM", {"full": 4}, {"": []}),
    "mimo-v2-flash": ("MiMoV2FlashForCausalLM", {"full": 9, "swa": 39}, {
        "": ["swa"], "mx": ["swa", "block_scale", "block_scale_swa"], "noswa": []}),
    "glm-4.5": ("Glm4MoeForCausalLM", {"full": 92}, {"": [], "mx": ["block_scale"]}),
    "gpt-oss": ("GptOssForCausalLM", {"swa": 12, "full": 12}, {"": ["swa"], "noswa": []}),
    "gemma3": ("Gemma3ForCausalLM", {"swa": 22, "full": 4}, {"": [], "mx": ["block_scale"]}),
    "nemotron-h": ("NemotronHForCausalLM", {"mamba": 24, "mlp": 24, "full": 4}, {"": ["mamba"]}),
    "falcon-h1": ("FalconH1ForCausalLM", {"hybrid": 44}, {"": ["mamba"]}),
    "llama-eagle3": ("LlamaForCausalLMEagle3", {"full": 1}, {"": []}),
    "llama": ("LlamaForCausalLM", {"full": 32}, {"": [], "mx": ["block_scale"]}),
}
FLAGS: dict[str, dict[str, Any]] = {
    "": {}, "mx": {"kv_cache_dtype": "mxfp8"}, "noswa": {"disable_hybrid_swa_memory": True},
    "eagle": {"speculative_algorithm": "EAGLE"}, "dspark": {"speculative_algorithm": "DSPARK"},
}
# name -> (config field, layers, SGLang fills the draft path with the model path)
MTP = {
    "deepseek-v3.1": ("num_nextn_predict_layers", 1, True), "deepseek-v3.2": ("num_nextn_predict_layers", 1, True),
    "deepseek-v4": ("num_nextn_predict_layers", 1, True), "glm-5": ("num_nextn_predict_layers", 1, True),
    "glm-4.5": ("num_nextn_predict_layers", 1, True), "qwen3-next": ("mtp_num_hidden_layers", 1, False),
    "glm5-next": ("num_nextn_predict_layers", 1, False),
    "qwen3.5": ("mtp_num_hidden_layers", 1, False), "qwen4-exp": ("mtp_num_hidden_layers", 1, True),
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _cfg(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    return data


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_family_state_types(name: str) -> None:
    arch, kinds, states = EXPECTED[name]
    m = sglang_model(_cfg(name))
    assert m.known and m.architecture == arch and dict(Counter(m.layer_kinds)) == kinds
    for flags, want in states.items():
        assert list(m.state_types(**FLAGS[flags])) == want, (name, flags)


def test_every_state_type_is_reached_by_a_family() -> None:
    """All 13 StateTypes of the release are produced by some fixture and flag set here (swa_ring: ROCm's
    unified-KV backend named in the environment)."""
    seen = {s for name, (_, _, states) in EXPECTED.items() for flags in states
            for s in sglang_model(_cfg(name)).state_types(**FLAGS[flags])}
    v4 = sglang_model(_cfg("deepseek-v4"))
    rocm = v4.state_types(speculative_algorithm="EAGLE", env={"SGLANG_HACK_FLASHMLA_BACKEND": "unified_kv_triton"})
    assert rocm == ("swa", "swa_ring", "c128_state", "swa_ring")
    tail = dict(_cfg("deepseek-v3.2"), index_kpool=4, index_kpool_compress=True)
    assert sglang_model(tail).state_types() == ("dsa", "dsa_tail")
    seen |= set(rocm) | {"dsa_tail"}
    assert seen == set(gen.STATE_TYPES_CLASSIFIED) == set(json.loads(
        (ROOT / "schemas" / "sglang" / "families.json").read_text())["state_types"].values())


def test_backends_send_what_their_code_handles() -> None:
    from specctl.schemas.sglang.families import backend_state_types

    every = set(gen.STATE_TYPES_CLASSIFIED)
    assert set(backend_state_types("mooncake") or ()) == every == set(backend_state_types("nixl") or ())
    assert every - set(backend_state_types("mori") or ()) == {"block_scale", "block_scale_swa", "dsa_tail",
                                                              "request_row"}
    assert backend_state_types("fake") is None


def test_minimax_value_sparse_layers_have_no_pd() -> None:
    cfg = _cfg("minimax-m3-sparse")
    sc = dict(cfg["sparse_attention_config"], sparse_disable_index_value=[0] * cfg["num_hidden_layers"])
    m = sglang_model(dict(cfg, sparse_attention_config=sc))
    assert m.state_types() == ("minimax_dense_kv",) and m.pd_unsupported and "index_kv_pool" in m.pd_unsupported


# Fixtures of the start-up corpus kept minimal on purpose (SGLang's own config class fills the sizes they omit):
# they exercise SGLang's argument checks, not the family tables.
STARTUP_ONLY = frozenset({"iquest-q1", "minimax-m3-nvfp4", "qwen4-exp-startup"})


@pytest.fixture(scope="module")
def oracle() -> dict[str, dict[str, Any]]:
    names = sorted(p.name for p in MODELS.iterdir() if (p / "config.json").is_file() and p.name not in STARTUP_ONLY)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "sglang_family_oracle.py"),
                          *(str(MODELS / n / "config.json") for n in names)],
                         capture_output=True, text=True, timeout=120, env=env, check=True)
    return dict(zip(names, (json.loads(line) for line in out.stdout.splitlines()), strict=True))


def test_sglang_predicates_agree_on_every_fixture(oracle: dict[str, dict[str, Any]]) -> None:
    """SGLang's own functions on each config.json decide the pool; specctl must decide the same."""
    assert len(oracle) >= 20
    for name, o in oracle.items():
        m = sglang_model(_cfg(name))
        assert (m.pool == POOL_DSV4) == o["deepseek_v4"], name
        assert (m.pool == POOL_SWA or m.pool == POOL_DSV4) == o["hybrid_swa"], name
        assert m.dsa == o["dsa"] and m.qsa == o["qsa"], name
        assert (m.pool == "minimax_sparse") == o["minimax_sparse"], name
        if "swa_layer_ids" in o:
            assert [i for i, k in enumerate(m.layer_kinds) if k == "swa"] == o["swa_layer_ids"], name
            assert [i for i, k in enumerate(m.layer_kinds) if k == "full"] == o["full_layer_ids"], name
        if "kda_layer_ids" in o:
            assert [i for i, k in enumerate(m.layer_kinds) if k == "linear"] == o["kda_layer_ids"], name
        if o["minimax_sparse"]:
            assert (m.minimax_dense, m.minimax_k_only, m.minimax_value_sparse) == (
                o["minimax_dense"], o["minimax_k_only"], o["minimax_value_sparse"]), name
        if o["dsa"]:
            assert m.dsa_tail == o["dsa_tail"], name


def _synthetic(arch: str) -> dict[str, Any]:
    """A small config.json of `arch` carrying the fields every family predicate reads."""
    return {
        "architectures": [arch], "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "vocab_size": 1000, "sliding_window": 128, "index_topk": 64, "kv_lora_rank": 64,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "hybrid_layer_pattern": [1, 0, 1, 0], "local_layer_ids": [0, 2], "compress_ratios": [4, 128, 4, 128, 0],
        "sparse_attention_config": {"sparse_attention_freq": [0, 1, 0, 1], "sparse_disable_index_value": [0, 1, 0, 1]},
        **({"linear_attn_config": {"kda_layers": [1, 3], "full_attn_layers": [2, 4]}} if "Kimi" in arch else {}),
    }


def test_every_listed_architecture_gets_sglangs_pool(tmp_path: Path) -> None:
    """Every architecture of the generated lists (hybrid SWA, DSA, MLA, DeepSeek-V4, MiniMax sparse), as a
    small config: SGLang's predicates and specctl agree on hybrid SWA, DSA and the special pools."""
    archs = json.loads((ROOT / "schemas" / "sglang" / "families.json").read_text())["archs"]
    names = sorted({a for k in ("hybrid_swa", "dsa", "mla", "deepseek_v4", "minimax_sparse", "kimi_k3")
                    for a in archs[k]})
    paths = []
    for a in names:
        (tmp_path / f"{a}.json").write_text(json.dumps(_synthetic(a)))
        paths.append(str(tmp_path / f"{a}.json"))
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "sglang_family_oracle.py"), *paths],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    checked = 0
    for a, line in zip(names, out.stdout.splitlines(), strict=True):
        o = json.loads(line)
        if "error" in o:
            continue
        m = sglang_model(_synthetic(a))
        assert (m.pool == POOL_DSV4) == o["deepseek_v4"], a
        assert (m.pool in (POOL_SWA, POOL_DSV4)) == o["hybrid_swa"], a
        assert m.dsa == o["dsa"] and (m.pool == "minimax_sparse") == o["minimax_sparse"], a
        if "swa_layer_ids" in o:
            assert [i for i, k in enumerate(m.layer_kinds) if k == "swa"] == o["swa_layer_ids"], a
        checked += 1
    assert checked >= len(names) - 3, out.stdout


@pytest.mark.parametrize("name", sorted(MTP))
def test_model_command_reports_mtp_heads(name: str) -> None:
    field, layers, default = MTP[name]
    result = run_cli("model", str(MODELS / name), "--format", "json")
    assert result.exit_code == 0, result.output
    draft = json.loads(result.stdout)["draft"]
    assert (draft["kind"], draft["field"], draft["layers"], draft["draft_defaults_to_target"]) == (
        "mtp", field, layers, default)
    text = run_cli("model", str(MODELS / name)).stdout
    assert f"draft         built-in MTP, {field}={layers}" in text


def test_model_command_new_families_and_flags() -> None:
    doc = json.loads(run_cli("model", str(MODELS / "deepseek-v3.2"), "--sglang-args", "--kv-cache-dtype mxfp8",
                             "--format", "json").stdout)
    assert doc["state_types"] == ["dsa"] and doc["pool"] == "dsa"
    doc = json.loads(run_cli("model", str(MODELS / "deepseek-v4"), "--sglang-args",
                             "--speculative-algorithm DSPARK", "--format", "json").stdout)
    assert doc["state_types"] == ["swa", "c128_state", "swa", "request_row"]
    doc = json.loads(run_cli("model", str(MODELS / "llama"), "--format", "json").stdout)
    assert doc["draft"] is None and doc["mtp_draft_architecture"] is None
    doc = json.loads(run_cli("model", str(MODELS / "mimo-v2-flash"), "--format", "json").stdout)
    assert doc["draft"] is None and doc["mtp_draft_architecture"] == "MiMoV2MTP"  # no count in its config.json
    doc = json.loads(run_cli("model", str(MODELS / "gemma4-assistant"), "--format", "json").stdout)
    assert doc["draft"]["kind"] == "gemma4_assistant"


def _validate(tmp: Path, args: str) -> list[dict[str, Any]]:
    (tmp / "c.sh").write_text(f"python -m sglang.launch_server {args}\n")
    _code, doc = run_json("--no-table", str(tmp / "c.sh"))
    found: list[dict[str, Any]] = doc["files"][0]["findings"]
    return found


def test_no_missing_draft_for_an_mtp_target(tmp_path: Path) -> None:
    """DeepSeek-V3.1's config.json declares num_nextn_predict_layers: 1; SGLang loads that head itself."""
    for algo in ("EAGLE", "NEXTN", "EAGLE3"):  # all three run _handle_eagle_family, which fills the path
        found = _validate(tmp_path, f"--model-path {MODELS / 'deepseek-v3.1'} --speculative-algorithm {algo}")
        assert not [f for f in found if f["code"] in ("MOD703", "SGL114")], found
    bundled = tmp_path / "v4"
    bundled.mkdir()
    (bundled / "config.json").write_text(json.dumps(dict(_cfg("deepseek-v4"), dspark_block_size=16)))
    found = _validate(tmp_path, f"--model-path {bundled} --speculative-algorithm DSPARK")
    assert not [f for f in found if f["code"] in ("MOD703", "SGL114") or f["severity"] == "error"], found


@pytest.mark.parametrize("model,algo,code", [
    ("qwen3-next", "NEXTN", None),  # the draft worker loads --model-path and its MTP head
    ("llama", "EAGLE", "SGL114"),  # no MTP/NextN head: a draft path is needed
    ("deepseek-v4", "DSPARK", "SGL300"),  # no bundled DSpark head: SGLang's own refusal
])
def test_a_missing_draft_speaks_sglang(tmp_path: Path, model: str, algo: str, code: str | None) -> None:
    found = [f for f in _validate(tmp_path, f"--model-path {MODELS / model} --speculative-algorithm {algo}")
             if f["severity"] == "error"]
    assert [f["code"] for f in found] == ([code] if code else []), found
    for f in found:
        text = f["message"] + f["fix"]
        assert "--speculative-draft-model-path" in text
        assert "speculative.draft" not in text and "builtin:" not in text and "algorithm: " not in text


@pytest.mark.parametrize("target,algo,draft,code,severity", [
    ("llama", "EAGLE", "llama-eagle3", "SGL111", "error"),
    ("llama", "NEXTN", "llama-eagle3", "SGL111", "error"),
    ("llama", "EAGLE3", "llama-eagle", "MOD707", "error"),
    ("gemma4", "EAGLE3", "gemma4-assistant", "SGL305", "error"),
    ("llama", "EAGLE3", "qwen2", "MOD702", "error"),
])
def test_draft_config_against_the_algorithm(tmp_path: Path, target: str, algo: str, draft: str, code: str,
                                            severity: str) -> None:
    found = _validate(tmp_path, f"--model-path {MODELS / target} --speculative-algorithm {algo} "
                                f"--speculative-draft-model-path {MODELS / draft}")
    drafts = [(f["code"], f["severity"]) for f in found if f["severity"] == "error"]
    assert drafts == [(code, severity)], found


def test_a_gemma4_assistant_draft_runs_as_frozen_kv_mtp(tmp_path: Path) -> None:
    found = _validate(tmp_path, f"--model-path {MODELS / 'gemma4'} --speculative-algorithm NEXTN "
                                f"--speculative-draft-model-path {MODELS / 'gemma4-assistant'}")
    assert not [f for f in found if f["severity"] == "error"], found
    assert any("FROZEN_KV_MTP" in f["message"] for f in found if f["code"] == "SGL310"), found


@pytest.mark.parametrize("algo,draft", [("EAGLE3", "llama-eagle3"), ("EAGLE", "llama-eagle"),
                                        ("NGRAM", "llama-eagle3")])
def test_matching_drafts_are_clean(tmp_path: Path, algo: str, draft: str) -> None:
    found = _validate(tmp_path, f"--model-path {MODELS / 'llama'} --speculative-algorithm {algo} "
                                f"--speculative-draft-model-path {MODELS / draft}")
    assert not [f for f in found if f["severity"] == "error" or f["code"].startswith("MOD70")], found


def test_every_draft_code_has_a_failing_example_and_an_explanation() -> None:
    from validate_helpers import expectations

    from specctl.schemas.sglang.drafts import SGLANG_ONLY

    failing = {c for p in (DATA / "sglang" / "invalid").glob("*.sh") for c, _ in expectations(p)[1]}
    assert SGLANG_ONLY <= failing and "MOD702" in failing
    for c in sorted(SGLANG_ONLY):
        result = run_cli("explain", c)
        assert result.exit_code == 0 and c in result.stdout


def test_check_draft_never_raises() -> None:
    from specctl.schemas.sglang.command import SGLangCommand, Word, parse_args
    from specctl.schemas.sglang.drafts import check_draft

    cmd = SGLangCommand(name="t")
    parse_args(cmd, [Word(w, 1, 1) for w in ("--model-path", "x", "--speculative-algorithm", "EAGLE")])
    for garbled in ({}, {"architectures": 5}, {"num_hidden_layers": -1}, {"text_config": []}):
        assert check_draft(cmd, None, garbled) == []


def test_generated_table_matches_the_installed_release() -> None:
    """scripts/gen_sglang_families.py --check on SGLang 0.5.23's installed source: the shipped table is what
    the release's code says, and the release has nothing unclassified."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_sglang_families.py"), "--check"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    table = json.loads((ROOT / "schemas" / "sglang" / "families.json").read_text())
    assert table["sglang"] == "0.5.23" and len(table["state_types"]) == 13
    assert "DeepseekV3ForCausalLM" in table["speculative"]["draft_defaults_to_target"]
    assert table["speculative"]["algorithms"] == ["DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP",
                                                  "STANDALONE", "NGRAM", "NONE"]


def _patched_src(tmp: Path, rel: str, old: str, new: str) -> Path:
    """A copy of the installed sglang package's file tree with one file edited (symlinks elsewhere)."""
    src = gen.default_src()
    dst = tmp / "sglang"
    parts = Path(rel).parts
    here, there = src, dst
    for part in parts[:-1]:
        there.mkdir(parents=True, exist_ok=True)
        for child in here.iterdir():
            if child.name != part:
                (there / child.name).symlink_to(child)
        here, there = here / part, there / part
    there.mkdir(parents=True, exist_ok=True)
    for child in here.iterdir():
        if child.name != parts[-1]:
            (there / child.name).symlink_to(child)
    text = (here / parts[-1]).read_text()
    assert old in text
    (there / parts[-1]).write_text(text.replace(old, new))
    return dst


def test_a_new_state_type_or_algorithm_is_named(tmp_path: Path) -> None:
    src = _patched_src(tmp_path / "a", "srt/disaggregation/base/conn.py", 'MAMBA = "mamba"',
                       'MAMBA = "mamba"\n    HOLOGRAM = "hologram"')
    table = {"state_types": gen.state_types(src), "pool_classes": {},
             "speculative": {"algorithms": ["EAGLE", "WARP"]}}
    assert gen.unclassified(table) == ["StateType value 'hologram' (HOLOGRAM)", "speculative algorithm WARP"]
    src = _patched_src(tmp_path / "b", "srt/speculative/spec_info.py", "    NGRAM = auto()",
                       "    NGRAM = auto()\n    WARP = auto()")
    assert "WARP" in gen.speculative(src)["algorithms"]
    shutil.rmtree(tmp_path)


@pytest.mark.slow
def test_generator_exits_1_naming_a_new_pool_class(tmp_path: Path) -> None:
    src = _patched_src(tmp_path, "srt/mem_cache/swa_memory_pool.py", "class SWAKVPool(BaseSWAKVPool):",
                       "class HoloKVPool(BaseSWAKVPool):\n    pass\n\n\nclass SWAKVPool(BaseSWAKVPool):")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_sglang_families.py"), "--src", str(src),
                          "--out", str(tmp_path / "t.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "KV pool class HoloKVPool" in out.stderr
