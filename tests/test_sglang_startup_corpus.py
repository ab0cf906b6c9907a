"""The SGLang start-up corpus and the raise-site census stay SGLang's own.

- Every `raise` / `assert` site of the census files of the installed SGLang (scripts/sglang_raise_sites.py)
  is classified in tests/data/sglang/raise_sites.json: reached by named cases of the corpus, unreachable
  from flags, environment and config.json (with the reason), or reachable but not covered yet (with what
  it needs). A release that adds a site fails here until
  `python scripts/gen_sglang_startup_cases.py` is rerun and the new site is reached or explained.
- SGLang's own resolution (schemas/sglang/resolve_child.py: `prepare_server_args` + `resolve_once()` on a
  declared GPU, in child processes) still answers every case of tests/data/sglang/startup_cases.json as
  recorded: accepted or refused, at the same raise site with the same message, with the same resolved values.
- The corpus holds `specctl export sglang` of every preset, as the presets are now.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_sglang_startup_cases as gen  # noqa: E402
from sglang_raise_sites import census  # noqa: E402

CORPUS = json.loads(gen.CASES_FILE.read_text(encoding="utf-8"))
SITES = json.loads(gen.SITES_FILE.read_text(encoding="utf-8"))
HAS_SGLANG = importlib.util.find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(not HAS_SGLANG, reason="SGLang is not installed (scripts/setup.sh installs it)")


def _installed_release() -> str:
    from importlib.metadata import version

    return version("sglang")


@needs_sglang
def test_every_raise_site_of_the_installed_release_is_classified():
    if _installed_release() != CORPUS["sglang"]:
        pytest.skip(f"the corpus is SGLang {CORPUS['sglang']}'s; {_installed_release()} is installed")
    now = {s.id for s in census()}
    known = set(SITES["sites"])
    assert not now - known, ("raise sites nobody classified (rerun scripts/gen_sglang_startup_cases.py, then add a "
                             f"case that reaches each or its reason in raise_sites.json): {sorted(now - known)}")
    assert not known - now, f"classified sites the release no longer has: {sorted(known - now)}"
    for sid, entry in SITES["sites"].items():
        assert entry.get("reached_by") or entry.get("unreachable") or entry.get("not_covered"), \
            f"{sid}: neither reached nor explained"


def test_reached_sites_name_cases_that_reach_them():
    by_id = {c["id"]: c for c in CORPUS["cases"]}
    for sid, entry in SITES["sites"].items():
        for cid in entry.get("reached_by", ()):
            err = by_id[cid]["verdict"]["error"]
            assert err is not None and err["site_id"] == sid, (cid, sid)


def test_the_corpus_holds_every_preset_export():
    want = {c["id"]: c["argv"] for c in gen.preset_cases(write=False)}
    have = {c["id"]: c["argv"] for c in CORPUS["cases"] if c["id"].startswith("preset/")}
    assert want == have, "presets changed: rerun scripts/gen_sglang_startup_cases.py"
    assert {p.stem for p in (ROOT / "presets").glob("*.yaml")} == {i.split("/")[1] for i in want}


def test_the_corpus_covers_accepting_and_refusing_commands_on_every_gpu():
    cases = CORPUS["cases"]
    assert {c["gpu"] for c in cases} == {"H100", "H200", "B200"}
    assert sum(c["verdict"]["ok"] for c in cases) >= 30
    assert sum(not c["verdict"]["ok"] for c in cases) >= 60


@needs_sglang
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sglang_still_answers_every_case_as_recorded():
    if _installed_release() != CORPUS["sglang"]:
        pytest.skip(f"the corpus is SGLang {CORPUS['sglang']}'s; {_installed_release()} is installed")
    from specctl.schemas.sglang.resolver import ResolveCase, resolve

    cases = CORPUS["cases"]
    _, verdicts = resolve([ResolveCase(tuple(c["argv"]), c["env"], c["gpu"]) for c in cases], cwd=str(ROOT))
    fields = CORPUS["recorded_fields"]
    wrong = []
    for c, v in zip(cases, verdicts, strict=True):
        want = c["verdict"]
        got_err = None if v.error is None else [v.error.type, v.error.site, v.error.message]
        want_err = None if want["error"] is None else [want["error"][k] for k in ("type", "site", "message")]
        got_resolved = {k: v.resolved.get(k) for k in fields if k in v.resolved}
        if v.ok != want["ok"] or got_err != want_err or got_resolved != want["resolved"]:
            wrong.append((c["id"], v.ok, got_err, {k: (want["resolved"].get(k), x) for k, x in got_resolved.items()
                                                   if want["resolved"].get(k) != x}))
    assert not wrong, f"{len(wrong)} cases answered differently from the recording: {wrong[:5]}"
