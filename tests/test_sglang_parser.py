"""specctl's SGLang dialect checked by SGLang's own parser (SGLang 0.5.23 installed --no-deps by
scripts/setup.sh; run in a child process, tests/sglang_oracle.py, so no test process imports sglang):

- the shipped flag history's view of the installed release equals what its `ServerArgs.add_cli_args` declares;
- every exported command parses with `allow_abbrev=False` + `ServerArgs.from_cli_args`, to the values
  the deployment says;
- on a derandomized corpus of mutated commands, `specctl validate` reports a flag error exactly when
  SGLang's parser (as launch_server builds it, abbreviations allowed) refuses the command, and reads the
  same values when it accepts;
- SGL102's silent adaptive downgrades are exactly SGLang's `adaptive_unsupported_reason`;
- each adaptive-trap example (tests/data/sglang/invalid: SGL101, SGL102, SGL103, ADP101) really is what
  SGLang resolves on CPU (`_init_adaptive_speculative_params`), and the valid example resolves cleanly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specctl.schemas.deployment import load_deployment
from specctl.schemas.sglang.command import SGLangCommand, Word, parse_args
from specctl.schemas.sglang.export import export_commands
from specctl.schemas.sglang.rules import adaptive_off_reason

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                       reason="sglang is not installed (scripts/setup.sh installs it --no-deps)"),
]
ROOT = Path(__file__).resolve().parent.parent
BASE = ["--model-path", "/models/m", "--page-size", "16", "--dtype", "bfloat16", "--port", "31010",
        "--cuda-graph-bs-decode", "1", "2", "4", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--disaggregation-mode", "decode", "--kv-cache-dtype", "auto", "--disable-radix-cache",
        "--max-running-requests", "8", "--tp-size", "1"]
EXPORTED = [("tiny-pd", ()), ("tiny-colocated", ()), ("sglang-default-adaptive", ()), ("llama-3.1-8b-pd", ()),
            ("llama-3.1-8b-pd", ("speculative.adaptive=null",)), ("llama-3.1-8b-pd", ("speculative.algorithm=ngram",
                                                                                    "speculative.adaptive=null")),
            ("tiny-pd", ("speculative.algorithm=none", "speculative.adaptive=null"))]
ADAPTIVE_CASES = [
    [], ["--speculative-eagle-topk", "4"], ["--speculative-eagle-topk", "1"], ["--enable-two-batch-overlap"],
    ["--enable-pdmux"], ["--enable-multi-layer-eagle"], ["--attn-dp-size", "2"], ["--attn-dp-size", "1"],
    # (--enable-dp-attention --dp-size 2 becomes attn_dp_size 2 only in resolve_once, which needs the GPU stack)
    ["--speculative-algorithm", "NGRAM"], ["--speculative-algorithm", "STANDALONE"],
    ["--speculative-algorithm", "EAGLE3"],
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # no hub, ever: local directories only
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _mutations(seed: int, n: int) -> list[list[str]]:
    """Commands derived from BASE by one or two random edits (derandomized: fixed seed)."""
    from specctl.schemas.sglang.flags import table

    rng = random.Random(seed)
    names = [f.name for f in table().flags]
    out: list[list[str]] = []
    for _ in range(n):
        argv = list(BASE)
        for _ in range(rng.choice((1, 1, 2))):
            flags = [i for i, a in enumerate(argv) if a.startswith("--")]
            i = rng.choice(flags)
            kind = rng.randrange(11)
            if kind == 0:  # drop a value
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    del argv[i + 1]
            elif kind == 1:  # misspell
                a = argv[i]
                j = rng.randrange(3, len(a))
                argv[i] = a[:j] + a[j + 1:]
            elif kind == 2:  # abbreviate
                a = argv[i]
                argv[i] = a[: rng.randrange(4, len(a) + 1)]
            elif kind == 3:  # a bad int
                argv[i + 1: i + 2] = ["sixteen"] if i + 1 < len(argv) else []
            elif kind == 4:  # a random real flag, with or without a value
                argv += [rng.choice(names)] + (["7"] if rng.random() < 0.5 else [])
            elif kind == 5:  # a stray positional
                argv.insert(i, "stray")
            elif kind == 6:  # --flag=value
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    argv[i: i + 2] = [f"{argv[i]}={argv[i + 1]}"]
            elif kind == 7:  # no --model-path
                if "--model-path" in argv:
                    k = argv.index("--model-path")
                    del argv[k: k + 2]
            elif kind == 8:  # a bad choice
                argv += ["--dtype", rng.choice(["bf16", "fp32", "auto", "half"])]
            elif kind == 9:  # a switch with a value
                argv += [rng.choice(["--disable-radix-cache=1", "--speculative-adaptive", "--enable-pdmux=yes"])]
            else:  # negative / float numbers
                argv += ["--max-running-requests", rng.choice(["-1", "2.5", "0x10", "8"])]
        out.append(argv)
    return out


def _config_cases(folder: Path, seed: int, n: int) -> list[list[str]]:
    """Commands with a --config YAML of random keys (flag spellings, underscores, prefixes, unknown, nested
    config, switches) and random values (bools, ints, strings, lists, maps, null); derandomized."""
    import yaml

    from specctl.schemas.sglang.flags import table

    rng = random.Random(seed)
    flags = [f for f in table().flags if f.name != "--config"]
    out = []
    for k in range(n):
        cfg: dict[str, Any] = {}
        for _ in range(rng.randint(1, 4)):
            f = rng.choice(flags)
            key = rng.choice([f.name[2:], f.name[2:], f.dest, f.name[2:-2], "frobnicate", "config"])
            cfg[key] = rng.choice([True, False, 0, 16, -1, "x", "auto", [1, 2], [], {"a": 1}, None, 2.5])
        p = folder / f"c{k}.yaml"
        p.write_text(yaml.safe_dump(cfg))
        out.append(["--model-path", "/models/m", "--port", "31010", "--config", str(p)])
    return out


GRAPH_CASES = [[], ["--speculative-algorithm", "EAGLE"], ["--disable-cuda-graph-padding"]]
SGL_DATA = ROOT / "tests" / "data" / "sglang"
TRAP_EXAMPLES = [SGL_DATA / "invalid" / n for n in (
    "sgl101-config-without-adaptive.sh", "sgl102-adaptive-topk.sh", "sgl102-adaptive-ngram.sh",
    "sgl102-adaptive-tbo.sh", "sgl103-num-draft-tokens.sh", "sgl309-initial-not-candidate.sh")] + [
    SGL_DATA / "valid" / "sgl-adaptive.sh"]


def _example_argv(path: Path) -> list[str]:
    """The flags of an example command file as SGLang would receive them (config path made absolute)."""
    from specctl.schemas.sglang.command import _launcher, shell_words

    (words,) = shell_words(path.read_text())
    found = _launcher(words)
    assert found is not None
    argv = [w.text for w in words[found[1]:]]
    i = argv.index("--speculative-adaptive-config")
    argv[i + 1] = str(path.parent / argv[i + 1])
    return argv


def _mine(argv: list[str]) -> SGLangCommand:
    cmd = SGLangCommand(name="t.sh")
    parse_args(cmd, [Word(a, 1, 1) for a in argv])
    return cmd


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """All requests of this module answered by one SGLang child process (importing sglang takes seconds)."""
    requests: list[dict[str, Any]] = [{"op": "table"}]
    exported = []
    for preset, sets in EXPORTED:
        cmds = export_commands(load_deployment(preset, overrides=sets))
        for argv in (cmds.prefill, cmds.decode, cmds.colocated):
            if argv:
                exported.append((preset, sets, argv))
                requests.append({"op": "parse", "argv": argv[3:], "abbrev": False})
    mutated = _mutations(9, 160)
    requests += [{"op": "parse", "argv": a, "abbrev": True} for a in mutated]
    adaptive = [["--model-path", "/models/m", "--speculative-algorithm", "EAGLE", "--speculative-adaptive", *c]
                for c in ADAPTIVE_CASES]
    requests += [{"op": "adaptive_reason", "argv": a} for a in adaptive]
    traps = [(p, _example_argv(p)) for p in TRAP_EXAMPLES]
    requests += [{"op": "adaptive_init", "argv": a} for _, a in traps]
    configs = _config_cases(tmp_path_factory.mktemp("sglang-configs"), 11, 80)
    requests += [{"op": "parse", "argv": a, "abbrev": True} for a in configs]
    graphs = [(extra, max_bs) for extra in GRAPH_CASES for max_bs in (1, 7, 48, 160, 600)]
    requests += [{"op": "graph_sizes", "argv": ["--model-path", "/m", *e], "max_bs": m} for e, m in graphs]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "sglang_oracle.py")], input=json.dumps(requests),
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout)
    n = len(exported)
    return {"table": answers[0]["table"], "exported": list(zip(exported, answers[1:1 + n], strict=True)),
            "mutated": list(zip(mutated, answers[1 + n:1 + n + len(mutated)], strict=True)),
            "adaptive": list(zip(adaptive, answers[1 + n + len(mutated):1 + n + len(mutated) + len(adaptive)],
                                 strict=True)),
            "traps": list(zip(traps, answers[1 + n + len(mutated) + len(adaptive):-len(graphs) - len(configs)],
                              strict=True)),
            "configs": list(zip(configs, answers[-len(graphs) - len(configs):-len(graphs)], strict=True)),
            "graphs": list(zip(graphs, answers[-len(graphs):], strict=True))}


def test_shipped_flag_history_view_equals_sglangs_parser(oracle: dict[str, Any]) -> None:
    """The flag history's view of the installed release is exactly that release's parser."""
    from specctl.schemas.sglang.flags import release_json, table

    version = oracle["table"]["sglang_version"]
    assert release_json(version) == oracle["table"], f"regenerate: python scripts/gen_sglang_flags.py --add {version}"
    assert table(version).sglang_version == version and len(table(version).flags) == len(oracle["table"]["flags"])


def test_every_exported_command_parses_with_sglangs_parser(oracle: dict[str, Any]) -> None:
    assert len(oracle["exported"]) >= 10
    for (preset, sets, _argv), answer in oracle["exported"]:
        assert answer["ok"], (preset, sets, answer["error"])
        d = load_deployment(preset, overrides=sets)
        role = answer["values"]["disaggregation_mode"]
        cfg = d.role(role if role in ("prefill", "decode") else "colocated")
        v = answer["values"]
        assert v["page_size"] == cfg.cache.page_size
        assert v["max_running_requests"] == cfg.serve.max_batch_size
        assert v["port"] == cfg.port
        adaptive = cfg.speculative.adaptive is not None
        assert v["speculative_adaptive"] is adaptive
        if cfg.speculative.algorithm != "none":
            assert v["speculative_num_steps"] == cfg.speculative.num_steps


def test_flag_errors_agree_with_sglangs_parser(oracle: dict[str, Any]) -> None:
    disagree = []
    for argv, answer in oracle["mutated"]:
        cmd = _mine(argv)
        mine_refuses = any(f.severity == "error" and f.code in ("SGL001", "SGL003") for f in cmd.findings)
        if mine_refuses != (not answer["ok"]):
            disagree.append((argv, answer.get("error"), [f.message for f in cmd.findings]))
            continue
        if answer["ok"]:
            for dest, opt in cmd.options.items():
                if answer["values"].get(dest) != opt.value:
                    disagree.append((argv, dest, answer["values"].get(dest), opt.value))
    assert disagree == []
    assert sum(not a["ok"] for _, a in oracle["mutated"]) > 40  # the corpus does exercise the errors


def test_silent_adaptive_downgrades_are_sglangs(oracle: dict[str, Any]) -> None:
    for argv, answer in oracle["adaptive"]:
        assert answer["ok"], answer
        mine = adaptive_off_reason(_mine(argv))
        theirs = answer["reason"]
        assert (mine is None) == (theirs is None), (argv, mine, theirs)
        if mine is not None and "=" in theirs.split(" ")[0]:
            assert mine[1].split(" ")[0] == theirs.split(" ")[0], (mine, theirs)


def test_adaptive_trap_examples_are_what_sglang_resolves(oracle: dict[str, Any]) -> None:
    from validate_helpers import expectations

    for (path, argv), answer in oracle["traps"]:
        codes = {c for c, _ in expectations(path)[1]} if path.parent.name == "invalid" else set()
        assert answer["ok"], (path.name, answer)
        if "SGL101" in codes:  # the config is given, adaptive is off: SGLang never reads the file
            assert answer["adaptive"] is False and "--speculative-adaptive-config" in argv
        elif "SGL102" in codes:
            assert answer["reason"] is not None, path.name
        elif "SGL103" in codes:
            given = int(argv[argv.index("--speculative-num-draft-tokens") + 1])
            assert answer["reason"] is None and answer["num_draft_tokens"] == answer["num_steps"] + 1 != given
        elif "SGL309" in codes:
            assert "is not in the adaptive config candidate_steps" in (answer["error"] or "")
        else:  # the valid example: adaptive stays on and resolves
            assert answer["reason"] is None and answer["error"] is None and answer["adaptive"] is True


def test_graph_batch_sizes_from_max_bs_are_sglangs(oracle: dict[str, Any]) -> None:
    from specctl.schemas.sglang.mapping import generate_decode_graph_sizes

    for (extra, max_bs), answer in oracle["graphs"]:
        mine = generate_decode_graph_sizes(max_bs, speculative=bool(extra and extra[0].startswith("--spec")),
                                           no_padding="--disable-cuda-graph-padding" in extra)
        assert mine == answer["sizes"], (extra, max_bs)


def test_config_files_are_merged_like_sglang(oracle: dict[str, Any]) -> None:
    disagree = []
    for argv, answer in oracle["configs"]:
        cmd = _mine(argv)
        mine_refuses = any(f.severity == "error" for f in cmd.findings)
        if mine_refuses != (not answer["ok"]):
            disagree.append((Path(argv[-1]).read_text(), answer.get("error"), [f.message for f in cmd.findings]))
        elif answer["ok"]:
            for dest, opt in cmd.options.items():
                if answer["values"].get(dest) != opt.value:
                    disagree.append((Path(argv[-1]).read_text(), dest, answer["values"].get(dest), opt.value))
    assert disagree == []
    assert 10 < sum(not a["ok"] for _, a in oracle["configs"]) < len(oracle["configs"]) - 10
