"""Engine loop oracles on a tiny random hybrid model (mamba + swa + full layers, byte tokenizer).

Oracles, not snapshots: a request's greedy tokens alone are the reference for the same request
inside a changing batch; the unconstrained greedy output is the reference for every stop condition.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specctl.engine.checkpoint import write_random_model
from specctl.engine.config import EngineConfig
from specctl.engine.engine import Engine, GenerationResult
from specctl.engine.sampling_params import SamplingParams
from specctl.engine.sequence import SequenceStatus
from specctl.errors import InvalidInput

PROMPTS = ["def f(x):", "import os\nimport sys\n", "a", "class Tree:\n    def __init__(self, left, right):"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    # sliding_window 6 and page_size 4 below: generations cross pages and run past the swa window.
    return write_random_model(tmp_path_factory.mktemp("tiny") / "hybrid", sliding_window=6)


def make_engine(model_dir: Path, **kw: object) -> Engine:
    cfg = dict(model_ref=str(model_dir), device="cpu", page_size=4, max_tokens=2048, max_batch_size=8)
    cfg.update(kw)
    return Engine(EngineConfig(**cfg))  # type: ignore[arg-type]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def alone(engine: Engine, prompt: str, params: SamplingParams) -> GenerationResult:
    return engine.generate([prompt], params)[0]


def run_until_finished(engine: Engine, rids: set[int]) -> dict[int, list[int]]:
    done: dict[int, list[int]] = {}
    while rids - done.keys():
        for seq in engine.step():
            if seq.is_finished:
                done[seq.rid] = list(seq.output_ids)
    return done


def test_greedy_batch_invariance_with_requests_joining_and_leaving(model_dir: Path) -> None:
    ref_engine = make_engine(model_dir)
    lengths = [12, 30, 7, 20]
    reference = [alone(ref_engine, p, greedy(n)).token_ids for p, n in zip(PROMPTS, lengths, strict=True)]
    assert all(len(r) == n for r, n in zip(reference, lengths, strict=True))

    # Small prefill budget: the long prompt is prefilled in chunks while others decode.
    engine = make_engine(model_dir, max_prefill_tokens=8)
    r0 = engine.add_request(PROMPTS[0], greedy(lengths[0]))
    r1 = engine.add_request(PROMPTS[1], greedy(lengths[1]))
    outputs: dict[int, list[int]] = {}
    for _ in range(5):
        for seq in engine.step():
            if seq.is_finished:
                outputs[seq.rid] = list(seq.output_ids)
    r2 = engine.add_request(PROMPTS[2], greedy(lengths[2]))  # joins mid-way
    for _ in range(4):
        for seq in engine.step():
            if seq.is_finished:
                outputs[seq.rid] = list(seq.output_ids)
    r3 = engine.add_request(PROMPTS[3], greedy(lengths[3]))  # joins later, chunked prefill
    outputs.update(run_until_finished(engine, {r0, r1, r2, r3} - outputs.keys()))
    assert [outputs[r] for r in (r0, r1, r2, r3)] == reference
    assert engine.runner.num_free_pages == engine.runner.num_total_pages


def test_temperature_zero_is_deterministic(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    a = [r.token_ids for r in engine.generate(PROMPTS, greedy(16))]
    b = [r.token_ids for r in engine.generate(PROMPTS[::-1], greedy(16))][::-1]
    assert a == b


def test_seed_reproducibility_across_batches(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    p = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True)
    first = alone(engine, PROMPTS[0], p)
    # Same seed inside a batch of other (differently seeded) requests: same tokens.
    others = [SamplingParams(max_tokens=10, temperature=0.8, seed=s, ignore_eos=True) for s in (1, 2)]
    batch = engine.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [others[0], p, others[1]])
    assert batch[1].token_ids == first.token_ids
    assert batch[1].text == first.text
    # A different seed gives a different continuation (24 draws at temperature 1: a collision would
    # need every draw to coincide).
    other = alone(engine, PROMPTS[0], SamplingParams(max_tokens=24, temperature=1.0, seed=99, ignore_eos=True))
    assert other.token_ids != first.token_ids


def test_max_tokens_finishes_with_length(model_dir: Path) -> None:
    res = alone(make_engine(model_dir), PROMPTS[0], greedy(5))
    assert res.finish_reason == "length" and len(res.token_ids) == 5
    assert res.timing["ttft_s"] is not None and res.timing["total_s"] >= res.timing["ttft_s"]


def test_eos_stops_unless_ignored(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    full = alone(engine, PROMPTS[1], greedy(30)).token_ids
    # Declare a token the model emits mid-way to be EOS: generation must stop right before it.
    eos = full[10]
    cut = full.index(eos)
    engine.tokenizer.eos_token_id = eos
    res = alone(engine, PROMPTS[1], SamplingParams(max_tokens=30))
    assert res.finish_reason == "stop"
    assert res.token_ids == full[:cut]
    ignored = alone(engine, PROMPTS[1], greedy(30))
    assert ignored.finish_reason == "length" and ignored.token_ids == full


def test_stop_string_cuts_output(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    full = alone(engine, PROMPTS[0], greedy(40))
    text = full.text
    # A two-character stop string taken from the middle of the unconstrained output.
    start = next(i for i in range(8, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[start : start + 2]
    res = alone(engine, PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True, stop=(stop,)))
    assert res.finish_reason == "stop"
    assert res.text == text[: text.index(stop)]
    assert full.token_ids[: len(res.token_ids)] == res.token_ids


def test_request_that_can_never_fit_fails_alone(model_dir: Path) -> None:
    # 32 pages of 4 tokens = 128 tokens.
    engine = make_engine(model_dir, max_tokens=128)
    ok = engine.generate([PROMPTS[0]], greedy(20))[0]
    results = engine.generate([PROMPTS[0], "x" * 100, PROMPTS[2]], [greedy(20), greedy(40), greedy(10)])
    assert results[1].finish_reason == "error"
    assert "max_tokens" in (results[1].error or "") and "128" in (results[1].error or "")
    assert results[0].finish_reason == "length" and results[0].token_ids == ok.token_ids
    assert results[2].finish_reason == "length" and len(results[2].token_ids) == 10
    assert engine.runner.num_free_pages == engine.runner.num_total_pages


def test_pool_exhaustion_preempts_newest_and_everyone_finishes(model_dir: Path) -> None:
    prompts = [p[:8] for p in PROMPTS]
    params = greedy(40)
    reference = [alone(make_engine(model_dir), p, params).token_ids for p in prompts]
    # 24 pages x 4 tokens: each request (8 + 40 tokens = 12 pages) fits alone, four together do not.
    engine = make_engine(model_dir, max_tokens=96)
    results = engine.generate(prompts, params)
    assert all(r.finish_reason == "length" for r in results), [r.error for r in results]
    assert [r.token_ids for r in results] == reference
    assert engine.stats()["preemptions"] > 0
    assert results[0].num_preemptions == 0  # the oldest request is never the victim
    assert engine.runner.num_free_pages == engine.runner.num_total_pages


def test_abort_frees_pages_and_others_continue(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    ref = alone(engine, PROMPTS[2], greedy(12)).token_ids
    r0 = engine.add_request(PROMPTS[0], greedy(50))
    r1 = engine.add_request(PROMPTS[2], greedy(12))
    for _ in range(3):
        engine.step()
    assert engine.abort(r0)
    assert not engine.abort(r0)  # already gone
    done = run_until_finished(engine, {r0, r1})
    assert done[r1] == ref
    assert engine.runner.num_free_pages == engine.runner.num_total_pages


def test_batch_size_bounds_running_set(model_dir: Path) -> None:
    engine = make_engine(model_dir, max_batch_size=2)
    rids = [engine.add_request(p, greedy(6)) for p in PROMPTS]
    seen_running = 0
    done: set[int] = set()
    while len(done) < len(rids):
        for seq in engine.step():
            if seq.is_finished:
                done.add(seq.rid)
        running = [s for s in engine.scheduler.running if s.status is SequenceStatus.RUNNING]
        seen_running = max(seen_running, len(engine.scheduler.running))
        assert len(running) <= 2
    assert seen_running == 2


def test_token_id_prompts_and_empty_prompt(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    by_text = alone(engine, "abc", greedy(6)).token_ids
    # Text prompts start a document: BOS, then the bytes.
    assert engine.encode_prompt("abc") == [256, 97, 98, 99]
    by_ids = engine.generate([[256, 97, 98, 99]], greedy(6))[0].token_ids
    assert by_text == by_ids
    without_bos = engine.generate([[97, 98, 99]], greedy(6))[0]
    assert without_bos.finish_reason == "length"
    empty = engine.generate([""], greedy(3))[0]  # BOS alone
    assert empty.finish_reason == "length" and empty.token_ids == engine.generate([[256]], greedy(3))[0].token_ids
    with pytest.raises(InvalidInput):
        engine.add_request([300], greedy(3))  # outside the vocabulary


def test_stats_counts(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    engine.generate(PROMPTS[:2], greedy(5))
    stats = engine.stats()
    assert stats["generated_tokens"] == 10 and stats["finished"] == 2
    assert stats["num_running"] == 0 and stats["free_pages"] == stats["total_pages"]


@pytest.mark.parametrize(
    "params",
    [greedy(20), SamplingParams(max_tokens=20, temperature=1.0, seed=11, ignore_eos=True)],
    ids=["greedy", "seeded"],
)
def test_prefill_export_and_decode_import_continue_exactly(model_dir: Path, params: SamplingParams) -> None:
    # PD in one process: prefill engine exports after the first token; decode engine imports and
    # finishes. The result must be the colocated output (mamba + swa state and the random stream cross over).
    reference = [r.token_ids for r in make_engine(model_dir).generate(PROMPTS[:3], params)]
    prefill, decode = make_engine(model_dir), make_engine(model_dir)
    exported = {}
    rids = [prefill.add_request(p, params, export_after_prefill=True) for p in PROMPTS[:3]]
    while len(exported) < len(rids):
        for seq in prefill.step():
            if seq.finish_reason == "prefilled":
                exported[seq.rid] = seq
    assert prefill.runner.num_free_pages == prefill.runner.num_total_pages
    drids = []
    for rid in rids:
        seq = exported[rid]
        export = seq.exported
        assert export is not None and len(seq.output_ids) == 1 and export.first_token == seq.output_ids[0]
        assert export.length == len(seq.prompt_ids) and export.queue_s >= 0 and export.compute_s > 0
        assert (export.rng_state is None) == (params.temperature == 0)
        imported = decode.add_imported(seq.prompt_ids, export.first_token, export.tensors, params,
                                       generator_state=export.rng_state)
        drids.append(imported.rid)
    done = run_until_finished(decode, set(drids))
    assert [done[r] for r in drids] == reference
    assert decode.runner.num_free_pages == decode.runner.num_total_pages


def test_the_first_engine_freezes_the_startup_heap_once(model_dir: Path) -> None:
    """A fresh process that builds two engines has moved what was alive after the first out of the cyclic
    collector's reach (gc.freeze), once: the second engine's objects are still collected."""
    import os
    import subprocess
    import sys

    code = (
        "import gc, sys\n"
        "from specctl.engine.config import EngineConfig\n"
        "from specctl.engine.engine import Engine\n"
        "assert gc.get_freeze_count() == 0\n"
        "Engine(EngineConfig(model_ref=sys.argv[1], device='cpu', max_tokens=256))\n"
        "first = gc.get_freeze_count()\n"
        "Engine(EngineConfig(model_ref=sys.argv[1], device='cpu', max_tokens=256))\n"
        "print(first, gc.get_freeze_count())\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(model_dir)], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    first, after = map(int, out.stdout.split())
    assert first > 10_000 and after == first
