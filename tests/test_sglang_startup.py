"""SGLang's start-up verdict predicted by `predict_startup`, and the SGLang path of validate speaking flags.

The example folders (tests/data/sglang/invalid, pairs, valid) drive test_sglang_rules.py; here: what the
folders cannot say through the CLI (the release and GPU parameters, resolved values, heterogeneous TP per
backend and release), valid commands of real shapes, and that no finding on SGLang input speaks the
deployment schema.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from validate_helpers import DATA, data_copy, run_json

from specctl.schemas.sglang.command import SGLangCommand, parse_command_text
from specctl.schemas.sglang.families import sglang_model
from specctl.schemas.sglang.rules import check_pair
from specctl.schemas.sglang.startup import Startup, predict_startup, read_config

SGL = DATA / "sglang"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data_copy(tmp_path_factory.mktemp("sglang-startup"))


@pytest.fixture(autouse=True)
def _in_data_dir(monkeypatch: pytest.MonkeyPatch, data_root: Path) -> None:
    monkeypatch.chdir(data_root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _cmd(text: str) -> SGLangCommand:
    cmd = parse_command_text(text, name="cmd.sh", base_dir=Path("."))
    assert [f for f in cmd.findings if f.severity == "error"] == []
    return cmd


def _predict(text: str, **kw: str) -> tuple[SGLangCommand, Startup]:
    cmd = _cmd(text)
    cfg = read_config(cmd.value("model_path"))
    return cmd, predict_startup(cmd, sglang_model(cfg) if cfg else None, **kw)


LAUNCH = "python -m sglang.launch_server --model-path models/"
SPEC_V2 = ("SGLANG_ENABLE_SPEC_V2=1 " + LAUNCH + "llama --speculative-algorithm EAGLE3 --speculative-draft-model-path "
           "models/llama-eagle3-draft --speculative-num-steps 3 --speculative-eagle-topk 4 "
           "--speculative-num-draft-tokens 8")


def test_spec_v2_with_a_tree_is_refused_by_0_5_10_and_ignored_by_0_5_23() -> None:
    _, old = _predict(SPEC_V2, release="0.5.10")
    assert [(f.code, f.path) for f in old.errors] == [("SGL304", "SGLANG_ENABLE_SPEC_V2")]
    assert "Spec v2 currently only supports topk = 1" in old.errors[0].message
    _, new = _predict(SPEC_V2, release="0.5.23")
    assert new.errors == () and any(f.code == "SGL304" and f.severity == "info" for f in new.warnings)
    _, chain = _predict(SPEC_V2.replace("--speculative-eagle-topk 4", "--speculative-eagle-topk 1"), release="0.5.10")
    assert chain.errors == ()


def test_the_environment_of_export_lines_and_prefixes_is_read() -> None:
    text = (LAUNCH + "kimi-k3 --tp-size 8 --dcp-size 8 --speculative-algorithm DSPARK "
            "--speculative-draft-model-path models/kimi-k3-dspark")
    for env in ("export SGLANG_RAGGED_VERIFY_MODE=compact\n", "SGLANG_RAGGED_VERIFY_MODE=cap-accept "):
        _, got = _predict(env + text)
        assert [(f.code, f.path) for f in got.errors] == [("SGL308", "SGLANG_RAGGED_VERIFY_MODE")]
    for env in ("", "export SGLANG_RAGGED_VERIFY_MODE=static\n"):  # static is SGLang's default
        _, got = _predict(env + text)
        assert got.errors == ()


@pytest.mark.parametrize("gpu,backend,page", [("H100", "fa3", 1), ("H200", "fa3", 1), ("B200", "trtllm_mla", 64)])
def test_deepseek_nextn_resolves_like_sglang(gpu: str, backend: str, page: int) -> None:
    _, got = _predict(LAUNCH + "deepseek-v3-mtp --tp-size 8 --speculative-algorithm NEXTN", gpu=gpu)
    assert got.errors == ()
    assert dict(got.resolved) | {} == {
        "attention_backend": backend, "page_size": page, "speculative_algorithm": "EAGLE",
        "speculative_draft_model_path": "models/deepseek-v3-mtp", "max_running_requests": 48,
        "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


@pytest.mark.parametrize("gpu,backend,page", [("H100", "fa3", 1), ("B200", "trtllm_mha", 64)])
def test_plain_attention_backend_and_page_size_per_gpu(gpu: str, backend: str, page: int) -> None:
    _, got = _predict(LAUNCH + "llama", gpu=gpu)
    assert (got.resolved["attention_backend"], got.resolved["page_size"]) == (backend, page)


def test_a_tree_on_hopper_leaves_fa3_for_flashinfer_and_llama_auto_chooses_a_tree() -> None:
    _, tree = _predict(LAUNCH + "llama --speculative-algorithm EAGLE3 --speculative-draft-model-path "
                       "models/llama-eagle3-draft --speculative-num-steps 5 --speculative-eagle-topk 4 "
                       "--speculative-num-draft-tokens 8")
    assert tree.resolved["attention_backend"] == "flashinfer" and tree.errors == ()
    _, auto = _predict(LAUNCH + "llama --speculative-algorithm EAGLE3 --speculative-draft-model-path "
                       "models/llama-eagle3-draft")
    assert [auto.resolved[k] for k in ("speculative_num_steps", "speculative_eagle_topk",
                                       "speculative_num_draft_tokens")] == [5, 4, 8]


def test_chain_drafting_overrides_the_draft_tokens_with_a_warning() -> None:
    _, got = _predict(LAUNCH + "llama --speculative-algorithm EAGLE3 --speculative-draft-model-path "
                      "models/llama-eagle3-draft --speculative-num-steps 3 --speculative-eagle-topk 1 "
                      "--speculative-num-draft-tokens 8")
    assert got.resolved["speculative_num_draft_tokens"] == 4
    assert [(f.code, f.severity, f.path) for f in got.warnings] == [
        ("SGL310", "warning", "--speculative-num-draft-tokens")]


@pytest.mark.parametrize("algo,flag", [("DFLASH", "--speculative-dflash-block-size 8"),
                                       ("DSPARK", "--speculative-dspark-block-size 7")])
def test_dflash_and_dspark_force_one_step(algo: str, flag: str) -> None:
    _, got = _predict(LAUNCH + f"llama --speculative-algorithm {algo} --speculative-draft-model-path "
                      f"models/llama-draft --speculative-num-steps 4 --speculative-eagle-topk 2 {flag}")
    assert got.errors == ()
    assert (got.resolved["speculative_num_steps"], got.resolved["speculative_eagle_topk"]) == (1, 1)
    assert got.resolved["speculative_num_draft_tokens"] == 8
    assert {f.path for f in got.warnings if f.severity == "warning"} == {"--speculative-num-steps",
                                                                        "--speculative-eagle-topk"}


def test_a_gemma4_assistant_draft_runs_as_frozen_kv_mtp() -> None:
    _, got = _predict(LAUNCH + "gemma4 --speculative-algorithm NEXTN --speculative-draft-model-path "
                      "models/gemma4-assistant-draft")
    assert got.errors == () and got.resolved["speculative_algorithm"] == "FROZEN_KV_MTP"


@pytest.mark.parametrize("extra,reason", [
    ("--speculative-eagle-topk 4 --speculative-num-steps 3 --speculative-num-draft-tokens 8",
     "--speculative-eagle-topk"),
    ("--tp-size 4 --enable-dp-attention --dp-size 4", "--enable-dp-attention"),
    ("--enable-multi-layer-eagle", "--enable-multi-layer-eagle"),
])
def test_every_reason_adaptive_turns_off_is_named(extra: str, reason: str) -> None:
    _, got = _predict(LAUNCH + "llama --speculative-algorithm EAGLE3 --speculative-draft-model-path "
                      f"models/llama-eagle3-draft --speculative-adaptive {extra}")
    assert got.resolved["speculative_adaptive"] is False
    assert [(f.code, f.path) for f in got.warnings if f.code == "SGL102"] == [("SGL102", reason)]


def _pair(model: str, backend: str, ptp: str, dtp: str, release: str) -> list[tuple[str, str]]:
    base = LAUNCH + f"{model} --disaggregation-transfer-backend {backend} "
    p = _cmd(base + f"--disaggregation-mode prefill {ptp}")
    d = _cmd(base + f"--disaggregation-mode decode --disable-radix-cache {dtp}")
    cfg = read_config(p.value("model_path"))
    m = sglang_model(cfg) if cfg else None
    found = check_pair(p, d, m, m, predict_startup(p, m), predict_startup(d, m), release=release)
    return [(f.code, f.severity) for f in found]


@pytest.mark.parametrize("model,backend,release,want", [
    ("nemotron-h", "mooncake", "0.5.23", [("SGL204", "info")]),   # Mamba state sliced per rank
    ("nemotron-h", "mooncake", "0.5.9", [("SGL204", "info")]),
    ("nemotron-h", "mooncake", "0.5.8", [("SGL204", "error")]),   # before mooncake sliced Mamba state
    ("nemotron-h", "nixl", "0.5.23", [("SGL204", "info")]),
    ("nemotron-h", "nixl", "0.5.10", [("SGL204", "error")]),     # nixl slices Mamba state from 0.5.11
    ("nemotron-h", "mori", "0.5.12", [("SGL204", "info")]),
    ("gpt-oss", "nixl", "0.5.23", [("SGL204", "error")]),         # SWA: 'does NOT support PD different TP sizes'
    ("gpt-oss", "mori", "0.5.23", [("SGL204", "error")]),
    ("gpt-oss", "mooncake", "0.5.10", [("SGL204", "error")]),
    ("gpt-oss", "mooncake", "0.5.21", [("SGL204", "error")]),
    ("gpt-oss", "mooncake", "0.5.22", [("SGL204", "info")]),      # head-sliced SWA KV from 0.5.22
    ("deepseek-v3-mtp", "nixl", "0.5.23", []),                    # MLA KV: any TP
    ("llama", "nixl", "0.5.23", []),
])
def test_heterogeneous_tp_per_backend_and_release(model: str, backend: str, release: str,
                                                  want: list[tuple[str, str]]) -> None:
    assert _pair(model, backend, "--tp-size 2", "--tp-size 4", release) == want


def test_swa_refusal_quotes_sglang() -> None:
    p = _cmd(LAUNCH + "gpt-oss --disaggregation-transfer-backend nixl --disaggregation-mode prefill --tp-size 2")
    d = _cmd(LAUNCH + "gpt-oss --disaggregation-transfer-backend nixl --disaggregation-mode decode --tp-size 4")
    m = sglang_model(read_config("models/gpt-oss") or {})
    (f,) = check_pair(p, d, m, m, predict_startup(p, m), predict_startup(d, m))
    assert "PD Disaggregation does NOT support PD different TP sizes for non-MLA SWA hybrid models yet." in f.message


def test_a_pd_pair_with_dp_attention_of_a_real_shape_has_no_error(tmp_path: Path) -> None:
    common = (f"{LAUNCH}deepseek-v3-mtp --trust-remote-code --tp-size 8 --enable-dp-attention --dp-size 8 "
              "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
              "--speculative-num-draft-tokens 4 --disaggregation-transfer-backend mooncake --disaggregation-ib-device "
              "mlx5_0")
    (tmp_path / "prefill.sh").write_text(f"{common} --disaggregation-mode prefill --port 30000\n")
    (tmp_path / "decode.sh").write_text(f"{common} --disaggregation-mode decode --port 30001 "
                                        "--cuda-graph-max-bs-decode 64 --max-running-requests 512\n")
    code, doc = run_json("--no-table", str(tmp_path / "prefill.sh"), str(tmp_path / "decode.sh"))
    errors = [f for x in doc["files"] for f in x["findings"] if f["severity"] == "error"]
    assert errors == [] and code == 0


_DEPLOYMENT_WORDS = re.compile(r"(?<![\w-])(?:speculative|cache|serve|model|transfer)\.[a-z_]+|builtin:")


def test_findings_on_sglang_input_speak_flags() -> None:
    files = sorted((SGL / "invalid").glob("*.sh")) + sorted((SGL / "valid").glob("*.sh"))
    pairs = [p for p in (SGL / "pairs").iterdir() if p.is_dir()]
    runs = [[str(f.relative_to(DATA))] for f in files] + [
        [str((p / "prefill.sh").relative_to(DATA)), str((p / "decode.sh").relative_to(DATA))] for p in pairs]
    seen = 0
    for args in runs:
        _, doc = run_json("--no-table", *args)
        for x in doc["files"]:
            for f in x["findings"]:
                seen += 1
                text = f"{f['message']} {f['fix']}"
                assert not _DEPLOYMENT_WORDS.search(text), (args, f["code"], text)
                assert f["path"].startswith(("--", "SGLANG_", "MC_", "$")), f
    assert seen > 60


@pytest.mark.parametrize("host,code", [("0.0.0.0", ("TOP606", "info")), ("${HOST_IP}", ("TOP606", "info")),
                                       ("127.0.0.1", ("TOP601", "error"))])
def test_a_port_collision_between_two_commands_needs_one_literal_host(tmp_path: Path, host: str,
                                                                      code: tuple[str, str]) -> None:
    for role in ("prefill", "decode"):
        (tmp_path / f"{role}.sh").write_text(f"{LAUNCH}llama --host {host} --port 30000 --disaggregation-mode "
                                             f"{role} --disable-radix-cache\n")
    _, doc = run_json("--no-table", str(tmp_path / "prefill.sh"), str(tmp_path / "decode.sh"))
    top = {(f["code"], f["severity"]) for x in doc["files"] for f in x["findings"] if f["code"].startswith("TOP")}
    assert code in top and ("TOP601", "error") not in top - {code}
    assert all(sev == "info" for c, sev in top if c == "TOP602")


@pytest.mark.parametrize("code,heading,names", [
    ("MOD703", "On SGLang commands:", "SGL114"), ("ADP101", "On SGLang commands:", "SGL309"),
    ("SGL309", "In deployment files:", "ADP101"), ("PD503", "On SGLang commands:", "--page-size"),
])
def test_explain_gives_both_spellings(code: str, heading: str, names: str) -> None:
    from validate_helpers import run_cli

    result = run_cli("explain", code)
    assert result.exit_code == 0
    tail = result.stdout.split(heading, 1)
    assert len(tail) == 2 and names in tail[1], result.stdout


@pytest.mark.parametrize("release,algo,backend,ok", [
    ("0.5.23", "EAGLE3", "mooncake", True), ("0.5.23", "NEXTN", "mooncake", True),
    ("0.5.22", "EAGLE3", "mooncake", False), ("0.5.22", "DSPARK", "mooncake", True),
    ("0.5.20", "DSPARK", "mooncake", False), ("0.5.13", None, "mori", False), ("0.5.13", None, "mooncake", True),
    ("0.5.11", None, "mooncake", False), ("0.5.11", None, "nixl", True), ("0.5.23", "NGRAM", "nixl", False),
])
def test_decode_radix_cache_per_release(release: str, algo: str | None, backend: str, ok: bool) -> None:
    spec = f" --speculative-algorithm {algo} --speculative-draft-model-path models/llama-eagle3-draft" if algo else ""
    text = (LAUNCH + f"deepseek-v3-mtp --disaggregation-mode decode --disaggregation-decode-enable-radix-cache "
            f"--disaggregation-transfer-backend {backend}{spec}")
    if algo == "DSPARK":
        text += " --speculative-dspark-block-size 7"
    _, got = _predict(text, release=release)
    assert (not any(f.code == "SGL303" for f in got.errors)) is ok, [f.message for f in got.errors]



@pytest.mark.parametrize("model,gpu,backend,page", [
    ("gpt-oss", "H100", "fa3", 1), ("gpt-oss", "B200", "trtllm_mha", 64),
    ("gemma4", "H200", "triton", 1), ("gemma4", "B200", "trtllm_mha", 64),
])
def test_model_overrides_choose_the_backend(model: str, gpu: str, backend: str, page: int) -> None:
    _, got = _predict(LAUNCH + model, gpu=gpu)
    assert got.errors == () and (got.resolved["attention_backend"], got.resolved["page_size"]) == (backend, page)
    _, bad = _predict(LAUNCH + model + " --attention-backend flashinfer", gpu=gpu)
    assert [(f.code, f.path) for f in bad.errors] == [("SGL300", "--attention-backend")]
