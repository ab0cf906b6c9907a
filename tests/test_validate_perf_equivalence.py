"""The many-file fast paths change nothing: one run over N files reports exactly what N runs report.

Oracles: (1) `Validator().validate_paths(files)` equals, file by file, a fresh `Validator` per file
(findings with their JSON paths, lines and columns, reachable tables, exit codes), over every example
file, the presets and generated variants of them; (2) the fast YAML reader (`loader.fast_data`) either
declines or returns exactly the full parser's data (same keys, order, value types), over the same files
and random mutations of them; (3) lazy positions equal eager ones.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest

from specctl.errors import UsageError
from specctl.schemas import loader
from specctl.schemas.deployment import DEFAULTS
from specctl.schemas.validator import Validator

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _example_files() -> list[Path]:
    files = sorted(p for p in DATA.rglob("*") if p.suffix in (".yaml", ".yml", ".json") and p.is_file()
                   and "traces" not in p.parts and p.name != "expected.json"
                   and "models" not in p.parts and "sglang" not in p.parts)  # model configs, SGLang files
    return files + sorted((ROOT / "presets").glob("*.yaml"))


def _variants(folder: Path, n: int) -> list[Path]:
    """Distinct deployments in the style of benchmarks/validate_bench.py, some with findings."""
    text = (ROOT / "presets" / "tiny-pd.yaml").read_text()
    out = []
    for i in range(n):
        t = (text.replace("name: tiny-pd", f"name: tiny-pd-{i}")
             .replace("port: 30002", f"port: {31000 + i if i % 4 else 30001}")  # every 4th collides
             .replace("num_steps: 3", f"num_steps: {(1, 3, 5, 2)[i % 4]}")  # 2 is not a candidate
             .replace("max_tokens: 32768", f"max_tokens: {32768 + 16 * i}"))
        if i % 5 == 0:
            t = t.replace("  dtype: float32", "  dtype: float32\n  dtyp: float16")  # unknown key
        p = folder / f"v{i:03d}.yaml"
        p.write_text(t)
        out.append(p)
    return out


def _as_json(r) -> dict:  # type: ignore[no-untyped-def]
    return {**r.to_json(), "kind": r.kind, "roles": r.roles, "text": r.reachable_text,
            "lines": [(f.code, f.path, f.line, f.column, f.message, f.fix, f.severity) for f in r.findings]}


def _typed(x: object) -> object:
    if isinstance(x, dict):
        return ("d", [(k, _typed(v)) for k, v in x.items()])
    if isinstance(x, list):
        return ("l", [_typed(v) for v in x])
    return (type(x).__name__, x)


@pytest.mark.parametrize("overrides", [(), ("serve.max_batch_size=4", "roles.decode.port=30001")])
def test_many_files_in_one_run_equal_each_alone(
    tmp_path: Path, overrides: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # lone prefill/decode files are left out: in one run they pair up, which is the intended difference
    files = [p for p in _example_files() if "pairs" not in p.parts and "pd511" not in p.name]
    files += _variants(tmp_path, 24)
    defaults = copy.deepcopy(DEFAULTS)
    together = Validator(overrides=overrides).validate_paths(files)
    assert len(together.files) == len(files)
    assert DEFAULTS == defaults  # roles are merged without copies: nothing may write through them
    if not overrides:
        for path, got in zip(files, together.files, strict=True):
            if got.data is not None:
                assert _typed(got.data) == _typed(loader.load_document(path).data), path
    codes = set()
    for path, got in zip(files, together.files, strict=True):
        alone = Validator(overrides=overrides).validate_paths([path])
        assert _as_json(got) == _as_json(alone.files[0]), path
        codes.update(f.code for f in got.findings)
    assert {"SCH001", "TOP601", "ADP101", "SCH000"} <= codes  # the comparison covered findings with lines
    assert any(f.line is not None for r in together.files for f in r.findings)
    # exit codes: the run's code is the worst of the files' codes
    singles = [Validator(overrides=overrides).validate_paths([p]).exit_code for p in files[-24:]]
    assert Validator(overrides=overrides).validate_paths(files[-24:]).exit_code == max(singles)
    # and the fast reader with lazy positions reports what the full parser with eager positions reports
    monkeypatch.setattr(loader, "fast_data", lambda text: None)
    reference = Validator(overrides=overrides).validate_paths(files)
    assert [_as_json(r) for r in together.files] == [_as_json(r) for r in reference.files]
    assert together.exit_code == reference.exit_code


def test_pairs_in_one_run_match_pair_alone() -> None:
    pair = [DATA / "pairs" / "state-types-differ" / f"{side}.yaml" for side in ("prefill", "decode")]
    ok = [DATA / "pairs" / "ok" / f"{side}.yaml" for side in ("prefill", "decode")]
    alone = [_as_json(r) for r in Validator().validate_paths(pair).files]
    both = Validator().validate_paths(pair + ok).files
    assert [_as_json(r) for r in both[:2]] == alone
    assert any(f.code == "PD505" for f in both[1].findings)


def _check_fast(text: str) -> bool:
    """True when the fast reader answered; fails the test if its answer differs from the full parser's."""
    fast = loader.fast_data(text)
    if fast is None:
        return False
    doc = loader.parse_document(text)  # the fast reader never answers for text the full parser rejects
    assert _typed(fast) == _typed(doc.data), text
    assert doc.duplicates == ()
    return True


def test_fast_reader_equals_full_parser_on_examples() -> None:
    answered = 0
    for p in _example_files():
        try:
            text = loader.read_text(p)
        except UsageError:
            continue
        answered += _check_fast(text)
    assert answered >= 20  # the fast path is really taken on ordinary files


@pytest.mark.parametrize("text", [
    "a: 1\nb:\n  c: [1, 2, {d: x}]\n  e: {}\nf: []\n",
    "a: yes\nb: off\nc: ~\nd: null\ne: 0x1F\nf: 0o17\ng: 017\nh: 1:30\ni: 1_000\nj: 1e3\nk: 1.5e+3\n",
    "a: 2001-12-14\nb: '2001-12-14'\nc: \"x # y\"\nd: 'it'\ne: -0.25\nf: +1\ng: .5\nh: 08\n",
    "8: {x: 1}\n'9': {x: 2}\n\"10\": 3\n0x10: 4\n",
    "a:\nb: 1\n",  # an empty value is null
    "a: x#y\nb: x # y\nc: [1, 2] # c\nd: {a: 1} #\n",
    "  a: 1\n  b: 2\n",  # an indented top level
    "a: b: c\n", "a: [1, 2\n", "a: [1,]\n", "a: {b}\n", "a: {b: }\n", "a: [a: 1]\n", "a: 1\n a2: 2\n",
    "a:\n  b: 1\n c: 2\n", "a: 1\na: 2\n", "a: {b: 1, b: 2}\n", "on: 1\n", "a: .inf\n", "a: nan\n",
    "a: 99999999999999999999999\n", "a: &x 1\nb: *x\n", "a: !!str 1\n", "a: |\n  x\n", "- 1\n", "a:\n- 1\n",
    "a: 'it''s'\n", "a: \"x\\ty\"\n", "a: \tb\n", "a: é\n", "---\na: 1\n", "a: 1\n...\n", "", "# only\n",
    "a: x\n  y\n", "a:\n  b: 1\n  - c\n", "a: [1]x\n", "a: [1]#x\n", "a: -\n", "a: - b\n", "a: :b\n", "a: b:\n",
    "a: {b: [1, {c: [2, [3]]}]}\n", "a: [[], {}, [[]]]\n", "a: {'q': \"v\", 'r': 's'}\n", "a: {b: 1,c: 2}\n",
    "a: {b:1}\n", "a: [b:1]\n", "<<: {a: 1}\n", "a: 'x' # c\n", "a: 'x' y\n", "a: \"\"\nb: ''\n",
])
def test_fast_reader_equals_full_parser_on_edge_cases(text: str) -> None:
    try:
        _check_fast(text)
    except UsageError:
        pytest.fail(f"fast reader answered for text the full parser rejects: {text!r}")


def test_fast_reader_equals_full_parser_on_mutations() -> None:
    rng = random.Random(7)
    texts = [loader.read_text(p) for p in _example_files() if p.suffix == ".yaml"]
    pieces = list(" \n:#-[]{},'\"!&*|>?%@`~.0123456789abxyzE+_") + [
        "  ", ": ", "- ", " #", "yes", "null", "0x1F", ".inf", "1e3", "1_000", "010", "1:30", "'it''s'", "&a ", "---\n"]
    answered = 0
    for _ in range(1500):
        t = rng.choice(texts)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(t) + 1)
            if rng.random() < 0.5:
                t = t[:i] + rng.choice(pieces) + t[i:]
            else:
                t = t[:i] + t[i + rng.randint(1, 3):]
        try:
            answered += _check_fast(t)
        except UsageError:
            pytest.fail(f"fast reader answered for text the full parser rejects: {t!r}")
    assert answered > 100


def test_lazy_positions_equal_eager(tmp_path: Path) -> None:
    for p in _example_files()[:40] + _variants(tmp_path, 2):
        try:
            eager = loader.load_document(p)
        except UsageError:
            continue
        lazy = loader.load_document(p, lazy_positions=True)
        assert _typed(lazy.data) == _typed(eager.data)
        assert lazy.positions == eager.positions
        assert lazy.duplicates == eager.duplicates


def test_generated_schema_check_equals_closure_check() -> None:
    """`generate_check` (used after the first files of a run) answers exactly like `compile_check`, and
    "valid" only where jsonschema finds no error."""
    from specctl.schemas.fastschema import compile_check, generate_check
    from specctl.schemas.validator import _compiled, schema

    closures, generated = compile_check(schema()), generate_check(schema())
    docs = []
    for p in _example_files():
        try:
            docs.append(loader.load_document(p).data)
        except UsageError:
            continue
    values = [0, 1, -1, 2.5, 16.0, True, None, "x", "float32", "", [], [1, 2], [1, 1], {}, {"a": 1}, "cuda:0",
              10**6, [0, 1, 3], {"1": {"candidate_steps": [1]}}, {"candidate_steps": [2, 2]}]
    rng = random.Random(3)
    agree_valid = 0
    for _ in range(3000):
        d = copy.deepcopy(rng.choice(docs))
        for _ in range(rng.randint(0, 2)):
            node, key = d, None
            for _ in range(rng.randint(1, 5)):  # walk down a random path, then replace, add or drop there
                if not isinstance(node, (dict, list)) or not node:
                    break
                key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
                if not isinstance(node[key], (dict, list)) or rng.random() < 0.3:
                    break
                node = node[key]
            if key is None or not isinstance(node, (dict, list)):
                continue
            r = rng.random()
            if isinstance(node, dict) and r < 0.15:
                node[rng.choice(["extra", "8", "x1", "dtyp"])] = rng.choice(values)
            elif isinstance(node, dict) and r < 0.25:
                node.pop(key, None)
            elif isinstance(node, dict) or isinstance(key, int):
                node[key] = copy.deepcopy(rng.choice(values))
        ok = closures(d)
        assert generated(d) == ok, d
        if ok:
            agree_valid += 1
            assert list(_compiled().iter_errors(d)) == [], d
    assert agree_valid > 100


def test_plain_scalar_shortcut_matches_pyyaml() -> None:
    """The fast reader resolves common plain scalars without PyYAML; each answer equals PyYAML's."""
    import yaml

    table = yaml.CSafeLoader.yaml_implicit_resolvers if hasattr(yaml, "CSafeLoader") else \
        yaml.SafeLoader.yaml_implicit_resolvers
    assert not set(table) & loader._STR_FIRST  # no resolver can claim a scalar starting with these
    for ch in loader._WORD_FIRST:
        assert {tag for tag, _ in table[ch]} <= {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"}
    samples = ["a", "n", "y", "No", "nO", "NULL", "nULL", "on", "oN", "inf", "Infinity", "nan", "float32", "off",
               "builtin:tiny-hybrid", "/models/x", "_x", "0", "-0", "7", "-7", "08", "0.0", "-0.0", "-0.25", "00.5",
               "1.5", "10.", "1e3", "127.0.0.1", "1.2.3", "9" * 18, "9" * 19, "-" + "9" * 18, "1.0.0-rc1", "1_0",
               "TRUE", "True", "tRUE", "yes", "Yes", "YES", "f", "F", "o", "O"]
    answered = 0
    for text in samples:
        fast = loader._plain_shortcut(text)
        if fast is loader._MISSING:
            continue
        answered += 1
        full = loader.parse_document(f"k: {text}\n").data["k"]
        assert (type(fast), fast) == (type(full), full), text
        assert str(fast) == str(full)  # -0.0 stays -0.0
    assert answered >= 30
