"""specctl bench and SGLang's own bench_serving against the same stub server with known timings.

    python benchmarks/bench_serving_agreement.py --sglang-python /path/to/venv/bin/python

The SGLang venv holds sglang 0.5.23 installed `--no-deps` with the light packages, torch,
triton, transformers, compressed_tensors, ...); this script adds what bench_serving needs offline: a
local character-level tokenizer directory (one token per character, so re-tokenizing a chunk counts
its characters, exactly as the stub counts tokens), a local ShareGPT-format file (its `random` dataset
samples from one), and stand-ins for `datasets` and `torchvision` (never imported for real here). The
stub streams `--tokens-per-chunk` tokens per chunk, like a speculative server, and reports an accept
length in SGLang's `/server_info` shape, so bench_serving takes its per-token ITL path
(`sglang-oai` backend). Both clients run closed-loop, one request at a time, on the same stub.

Prints a table (mean and median TTFT, TPOT, ITL, E2E of both, and their ratio) and a last-line JSON
summary; `ok` when every mean and median agrees within 5%. Measured here (2 cores shared with other
work; stub TTFT 60 ms, 30 ms between chunks of 3 tokens, 13 tokens, 8 requests): every figure within
1.5% (max_rel_diff 0.0151). On a busier run the largest gap was mean TTFT, 5.3% at 60 ms and 0.7% at
200 ms: bench_serving opens a new HTTP session per request, specctl reuses its connections.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

KEYS = ("mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "median_itl_ms",
        "mean_e2e_latency_ms", "median_e2e_latency_ms")

TORCHVISION_STANDIN = '''
# bench_serving imports SGLang modules that import torchvision; the registry wheel needs a CUDA torch.
import importlib.abc, importlib.machinery, sys, types

class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any()

class _Any(metaclass=_Meta):
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return self
    def __getattr__(self, name): return _Any()
    def __hash__(self): return id(self)

class _Mod(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        m = _Mod(spec.name); m.__path__ = []; m.__version__ = "0.0"; return m
    def exec_module(self, module): pass

sys.meta_path.insert(0, _Finder())
'''


def write_fixtures(root: Path) -> tuple[Path, Path, Path]:
    """(tokenizer dir, ShareGPT file, mocks dir)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok_dir = root / "tokenizer"
    tok_dir.mkdir()
    vocab = {"<unk>": 0, **{chr(c): i + 1 for i, c in enumerate(range(32, 127))}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "model_max_length": 4096}))
    (tok_dir / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(vocab)}))
    sharegpt = root / "sharegpt.json"
    sharegpt.write_text(json.dumps([{"conversations": [
        {"from": "human", "value": f"def f{i}(x): return x * {i} + 1  # a prompt long enough to sample " * 2},
        {"from": "gpt", "value": f"a reply number {i} with a few words in it " * 2}]} for i in range(64)]))
    mocks = root / "mocks"
    (mocks / "datasets").mkdir(parents=True)
    (mocks / "datasets" / "__init__.py").write_text(
        "def load_dataset(*a, **k):\n    raise RuntimeError('no datasets here: local files only')\n")
    (mocks / "sitecustomize.py").write_text(TORCHVISION_STANDIN)
    return tok_dir, sharegpt, mocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-python", default=os.environ.get("SPECCTL_SGLANG_PYTHON"),
                    help="python of a venv with SGLang 0.5.23 (RECIPE.md); or SPECCTL_SGLANG_PYTHON")
    ap.add_argument("--ttft", type=float, default=0.06)
    ap.add_argument("--itl", type=float, default=0.03, help="seconds between chunks")
    ap.add_argument("--tokens-per-chunk", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=13)
    ap.add_argument("--num-prompts", type=int, default=8)
    args = ap.parse_args()
    if not args.sglang_python:
        sys.exit("give --sglang-python (a venv with SGLang's bench_serving, see shared/sglang/RECIPE.md)")

    from specctl.bench.config import BenchConfig, LoadPoint, WorkloadConfig
    from specctl.bench.runner import run_bench
    from specctl.bench.stub_server import StubBehaviour, StubServer

    behaviour = StubBehaviour(ttft_s=args.ttft, itl_s=args.itl, tokens_per_chunk=args.tokens_per_chunk)
    with tempfile.TemporaryDirectory() as tmp, StubServer(behaviour) as stub:
        root = Path(tmp)
        tok_dir, sharegpt, mocks = write_fixtures(root)
        out = root / "bench_serving.jsonl"
        env = {**os.environ, "PYTHONPATH": str(mocks), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        cmd = [args.sglang_python, "-m", "sglang.bench_serving", "--backend", "sglang-oai", "--base-url", stub.url,
               "--dataset-name", "random", "--dataset-path", str(sharegpt), "--random-input-len", "32",
               "--random-output-len", str(args.output_len), "--random-range-ratio", "1",
               "--num-prompts", str(args.num_prompts), "--max-concurrency", "1", "--request-rate", "inf",
               "--tokenizer", str(tok_dir), "--model", str(tok_dir), "--served-model-name", behaviour.model,
               "--output-file", str(out), "--disable-tqdm"]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
        if res.returncode != 0 or not out.is_file():
            sys.exit(f"bench_serving failed ({res.returncode}):\n{res.stderr[-3000:]}")
        theirs = json.loads(out.read_text().splitlines()[-1])
        cfg = BenchConfig(url=stub.url, points=(LoadPoint(math.inf, 1),), warmup_requests=1,
                          workload=WorkloadConfig(num_prompts=args.num_prompts, random_input_len=32,
                                                  random_output_len=args.output_len))
        (run,) = run_bench(cfg)
        ours = run.record

    print(f"{'metric':<24} {'specctl':>10} {'bench_serving':>14} {'ratio':>7}")
    worst = 0.0
    for key in KEYS:
        ratio = ours[key] / theirs[key] if theirs.get(key) else math.nan
        worst = max(worst, abs(ratio - 1.0))
        print(f"{key:<24} {ours[key]:>10.2f} {theirs[key]:>14.2f} {ratio:>7.3f}")
    print(json.dumps({"max_rel_diff": round(worst, 4), "ok": worst <= 0.05, "ttft_s": args.ttft, "itl_s": args.itl,
                      "tokens_per_chunk": args.tokens_per_chunk, "num_prompts": args.num_prompts}))


if __name__ == "__main__":
    main()
