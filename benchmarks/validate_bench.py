"""Start-up and throughput of `specctl validate`, measured side by side in one run.

Targets: (1) `specctl validate presets/<one>.yaml` takes at most 1.5x the wall time of
`python -c "import yaml, jsonschema, typer, rich"`; (2) validating 1,000 distinct files in one
invocation takes at most 1.5x one cold single-file invocation; (3) validate never imports torch;
(4) `specctl validate prefill.sh decode.sh` on SGLang launch commands (an adaptive EAGLE PD
pair on a Qwen3-Next config.json) starts within 1.5x of the same baseline, importing neither torch nor
sglang; the same pair checked against an older release (`--sglang-version`, default 0.5.16) is
reported beside it. (5) `--resolve` on the same pair (SGLang's own start-up resolution in a child process
that imports SGLang: seconds, not milliseconds) is reported on its own line, outside the ratios. The commands
run interleaved, `--rounds` times each, and medians are compared, because these machines are shared and noisy.
Prints a table, then a last-line JSON summary.

    python benchmarks/validate_bench.py [--rounds 5] [--files 1000] [--sglang-version 0.5.16] [--resolve-rounds 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "presets" / "tiny-pd.yaml"
SGLANG_PAIR = ROOT / "tests" / "data" / "sglang" / "pairs" / "ok"
MODELS = ROOT / "tests" / "data" / "models"


def write_sglang_pair(folder: Path) -> list[str]:
    """The PD pair of tests/data/sglang/pairs/ok, its adaptive JSON, and the model dir it names."""
    shutil.copytree(MODELS / "qwen3-next", folder / "models" / "qwen3-next")
    out = []
    for name in ("prefill.sh", "decode.sh", "adaptive.json"):
        text = (SGLANG_PAIR / name).read_text().replace("models/", f"{folder}/models/")
        (folder / name).write_text(text)
        if name.endswith(".sh"):
            out.append(str(folder / name))
    return out


def specctl_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("specctl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "specctl.cli"]


def write_files(folder: Path, n: int) -> list[str]:
    """n distinct valid deployments (names, ports, initial steps and pool sizes differ)."""
    text = PRESET.read_text()
    paths = []
    for i in range(n):
        t = (text.replace("name: tiny-pd", f"name: tiny-pd-{i}")
             .replace("port: 30002", f"port: {31000 + i}")
             .replace("num_steps: 3", f"num_steps: {(1, 3, 5)[i % 3]}")
             .replace("max_tokens: 32768", f"max_tokens: {32768 + 16 * i}"))
        p = folder / f"deploy-{i:04d}.yaml"
        p.write_text(t)
        paths.append(str(p))
    return paths


# The warm-up round writes .pyc files, as an installed specctl has them (PYTHONDONTWRITEBYTECODE would
# make every round compile the modules from source).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], expect_rc: int | None = 0) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    dt = time.perf_counter() - t0
    if expect_rc is not None and expect_rc >= 0 and proc.returncode != expect_rc:
        raise SystemExit(f"{' '.join(cmd[:4])}... exited {proc.returncode}: {proc.stderr[-2000:]}")
    return dt


def imported_modules(cmd: list[str]) -> set[str]:
    env = dict(ENV, PYTHONPROFILEIMPORTTIME="1")
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    mods = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            mods.add(line.rsplit("|", 1)[1].strip())
    return mods


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--resolve-rounds", type=int, default=1, help="runs of validate --resolve (0: skip)")
    ap.add_argument("--sglang-version", default="0.5.16", help="the older release the pair is also checked against")
    args = ap.parse_args()
    base = [sys.executable, "-c", "import yaml, jsonschema, typer, rich"]
    single = [*specctl_cmd(), "validate", str(PRESET)]
    tmp = Path(tempfile.mkdtemp(prefix="validate-bench-"))
    try:
        many = [*specctl_cmd(), "validate", "--no-table", *write_files(tmp, args.files)]
        (tmp / "sg").mkdir()
        pair = write_sglang_pair(tmp / "sg")
        sglang = [*specctl_cmd(), "validate", *pair]
        # another release of the flag history (its table is rebuilt from the history on first use)
        older = [*specctl_cmd(), "validate", "--sglang-version", args.sglang_version, *pair]
        for cmd in (base, single, many, sglang, older):  # warm the page cache and .pyc files
            timed(cmd, expect_rc=-1)
        samples: dict[str, list[float]] = {"baseline": [], "single": [], "many": [], "sglang": [], "older": []}
        for _ in range(args.rounds):
            samples["baseline"].append(timed(base))
            samples["single"].append(timed(single))
            samples["many"].append(timed(many))
            samples["sglang"].append(timed(sglang))
            samples["older"].append(timed(older, expect_rc=-1))
        mods = imported_modules(single)
        sglang_mods = imported_modules(sglang)
        resolve_s = None
        if args.resolve_rounds > 0 and importlib.util.find_spec("sglang") is not None:
            resolve = [*specctl_cmd(), "validate", "--resolve", "--gpu", "H100", *sglang[len(specctl_cmd()) + 1:]]
            resolve_s = statistics.median(timed(resolve, expect_rc=None) for _ in range(args.resolve_rounds))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    startup_ratio = med["single"] / med["baseline"]
    many_ratio = med["many"] / med["single"]
    torch_free = not any(m == "torch" or m.startswith("torch.") for m in mods)
    sglang_ratio = med["sglang"] / med["baseline"]
    older_ratio = med["older"] / med["baseline"]
    sglang_light = not any(m.split(".")[0] in ("torch", "sglang", "transformers") for m in sglang_mods)
    rows = [
        ("python -c 'import yaml, jsonschema, typer, rich'", med["baseline"], ""),
        (f"specctl validate {PRESET.name}", med["single"], f"{startup_ratio:.2f}x baseline (target <= 1.5x)"),
        (f"specctl validate <{args.files} files>", med["many"], f"{many_ratio:.2f}x single (target <= 1.5x)"),
        ("specctl validate prefill.sh decode.sh (SGLang)", med["sglang"],
         f"{sglang_ratio:.2f}x baseline (target <= 1.5x)"),
        (f"  ... --sglang-version {args.sglang_version}", med["older"], f"{older_ratio:.2f}x baseline"),
    ]
    if resolve_s is not None:
        rows.append(("specctl validate --resolve prefill.sh decode.sh (SGLang's own, H100)", resolve_s,
                     f"{args.resolve_rounds} run(s); a child imports SGLang (not part of the ratios)"))
    width = max(len(r[0]) for r in rows)
    print(f"{'command'.ljust(width)}  median s  ratio   ({args.rounds} rounds, interleaved)")
    for name, sec, note in rows:
        print(f"{name.ljust(width)}  {sec:8.3f}  {note}")
    print(f"torch imported: {not torch_free}; pydantic imported: {'pydantic' in mods}; "
          f"SGLang commands import torch/sglang/transformers: {not sglang_light}")
    print(json.dumps({
        "baseline_s": round(med["baseline"], 4), "single_s": round(med["single"], 4), "many_s": round(med["many"], 4),
        "files": args.files, "startup_ratio": round(startup_ratio, 3), "many_ratio": round(many_ratio, 3),
        "startup_ok": startup_ratio <= 1.5, "many_ok": many_ratio <= 1.5, "torch_free": torch_free,
        "pydantic_imported": "pydantic" in mods, "rounds": args.rounds,
        "sglang_s": round(med["sglang"], 4), "sglang_startup_ratio": round(sglang_ratio, 3),
        "sglang_startup_ok": sglang_ratio <= 1.5, "sglang_torch_free": sglang_light,
        "resolve_s": None if resolve_s is None else round(resolve_s, 3),
        "sglang_older_release": args.sglang_version, "sglang_older_s": round(med["older"], 4),
        "sglang_older_ratio": round(older_ratio, 3),
    }))
    if not torch_free or not sglang_light:
        raise SystemExit("specctl validate imported torch (or sglang)")


if __name__ == "__main__":
    main()
