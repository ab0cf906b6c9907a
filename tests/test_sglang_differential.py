"""specctl's start-up prediction (`predict_startup`) agrees with SGLang's own resolution, case by case.

SGLang's verdicts are the recorded ones of tests/data/sglang/startup_cases.json (SGLang 0.5.23 resolving
each command for its declared GPU; tests/test_sglang_startup_corpus.py re-runs SGLang to keep them its own).
specctl must agree on error / no error and on every value it puts in `Startup.resolved`. The disagreements
that remain are listed, each with a reason, in tests/data/sglang/differential_known.json: a new
disagreement fails, and so does a listed one that now agrees (the list only shrinks, so the figure is honest).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import sglang_differential as diff  # noqa: E402


def test_specctl_agrees_with_sglang_on_every_case_but_the_listed(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    corpus = json.loads(diff.CASES_FILE.read_text(encoding="utf-8"))
    known = json.loads(diff.KNOWN_FILE.read_text(encoding="utf-8"))
    found = diff.disagreements(corpus)
    ok, total = diff.agreement(corpus, found)
    with capsys.disabled():
        print(f"\nspecctl agrees with SGLang {corpus['sglang']} on {ok} of {total} start-up cases")
    new = {k: v for k, v in found.items() if k not in known}
    fixed = sorted(k for k in known if k not in found)
    assert not new, f"{len(new)} new disagreements with SGLang: {list(new.items())[:8]}"
    assert not fixed, ("these listed disagreements now agree: remove them from differential_known.json "
                       f"(python scripts/sglang_differential.py --write): {fixed[:20]}")
    unexplained = sorted(k for k, v in known.items() if not v.get("reason"))
    assert not unexplained, f"listed disagreements without a reason: {unexplained[:20]}"


def test_the_differential_sees_a_wrong_prediction(monkeypatch):
    """A case whose recorded verdict is flipped must show up as a disagreement (the test can fail)."""
    monkeypatch.chdir(ROOT)
    corpus = json.loads(diff.CASES_FILE.read_text(encoding="utf-8"))
    case = next(c for c in corpus["cases"] if c["id"] == "fault/usage-unknown-flag")
    flipped = {**corpus, "cases": [{**case, "verdict": {"ok": True, "error": None, "resolved": {}}}]}
    assert "fault/usage-unknown-flag::verdict" in diff.disagreements(flipped)
