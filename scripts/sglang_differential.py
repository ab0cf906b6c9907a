"""specctl's start-up prediction against SGLang's recorded verdicts, case by case.

For every case of tests/data/sglang/startup_cases.json, specctl parses the command as `specctl validate`
does (`parse_command_text`, environment included), reads the model's config.json (`sglang_model`) and asks
`predict_startup(cmd, model, gpu=...)`. A disagreement is keyed `CASE::verdict` (specctl predicts an error
where SGLang accepted, or none where SGLang refused; a flag-parsing error of specctl counts as a predicted
error) or `CASE::FIELD` (a value in `Startup.resolved` that differs from SGLang's, or that the corpus does
not record). Resolved values are compared only where SGLang accepted the command.

tests/data/sglang/differential_known.json lists the disagreements that remain, each with a reason; the test
fails on a disagreement not listed and on a listed one that now agrees. `python
scripts/sglang_differential.py --write` rewrites the list (kept reasons; a new entry gets an empty reason,
which the test refuses until someone writes why); without `--write` it prints the agreement figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES_FILE = ROOT / "tests" / "data" / "sglang" / "startup_cases.json"
KNOWN_FILE = ROOT / "tests" / "data" / "sglang" / "differential_known.json"


def command_text(case: dict[str, Any]) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in case["env"].items())
    return (env + " " if env else "") + "python -m sglang.launch_server " + shlex.join(case["argv"])


def _model(argv: list[str]) -> Any:
    from specctl.schemas.sglang.families import FamilyError, sglang_model

    path = argv[argv.index("--model-path") + 1] if "--model-path" in argv else None
    if path is None:
        return None
    try:
        cfg = json.loads((ROOT / path / "config.json").read_text(encoding="utf-8"))
        return sglang_model(cfg)
    except (OSError, ValueError, FamilyError):
        return None


def _same(a: Any, b: Any) -> bool:
    return json.loads(json.dumps(a, default=str)) == b


def disagreements(corpus: dict[str, Any]) -> dict[str, str]:
    """`CASE::verdict` / `CASE::FIELD` -> what differs, for every case of the corpus (cwd must be ROOT)."""
    from specctl.schemas.sglang.command import parse_command_text
    from specctl.schemas.sglang.startup import predict_startup

    recorded = set(corpus["recorded_fields"])
    out: dict[str, str] = {}
    for case in corpus["cases"]:
        cid, want = case["id"], case["verdict"]
        cmd = parse_command_text(command_text(case), name=cid, base_dir=ROOT)
        pred = predict_startup(cmd, _model(case["argv"]), gpu=case["gpu"])
        errors = [f for f in (*cmd.findings, *pred.errors) if f.severity == "error"]
        if bool(errors) == want["ok"]:
            said = errors[0].message[:160] if errors else "no error"
            sglang = "accepted" if want["ok"] else f"{want['error']['type']}: {want['error']['message'][:160]}"
            out[f"{cid}::verdict"] = f"specctl: {said} | SGLang: {sglang}"
        if not want["ok"]:
            continue
        for key, value in pred.resolved.items():
            if key not in recorded:
                out[f"{cid}::{key}"] = f"specctl resolves {key}={value!r}; the corpus does not record it"
            elif not _same(value, want["resolved"].get(key)):
                out[f"{cid}::{key}"] = f"specctl: {value!r} | SGLang: {want['resolved'].get(key)!r}"
    return out


def agreement(corpus: dict[str, Any], found: dict[str, str]) -> tuple[int, int]:
    bad = {k.split("::", 1)[0] for k in found}
    return len(corpus["cases"]) - len(bad), len(corpus["cases"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="specctl's start-up prediction against SGLang's recorded verdicts.")
    ap.add_argument("--write", action="store_true", help="rewrite differential_known.json (reasons kept)")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    corpus = json.loads(CASES_FILE.read_text(encoding="utf-8"))
    found = disagreements(corpus)
    ok, total = agreement(corpus, found)
    print(f"specctl agrees with SGLang {corpus['sglang']} on {ok} of {total} cases ({len(found)} disagreements)")
    if args.write:
        old = json.loads(KNOWN_FILE.read_text(encoding="utf-8")) if KNOWN_FILE.exists() else {}
        new = {k: {"differs": found[k], "reason": old.get(k, {}).get("reason", "")} for k in sorted(found)}
        KNOWN_FILE.write_text(json.dumps(new, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {KNOWN_FILE.relative_to(ROOT)}: {sum(1 for v in new.values() if not v['reason'])} without reason")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
