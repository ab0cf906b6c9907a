"""The official `openai` client against real colocated servers (plain and speculative, random tiny models,
real HTTP on 127.0.0.1): logprobs, echo, usage, the refusals, unknown models.

Oracles: a token's log-prob is the target's log_softmax at the context that chose it, recomputed here by
independent single-token requests (prompt + output so far -> the prefill path's first token); greedy
output is the argmax of its own top log-probs; the speculative server's tokens and log-probs equal the
plain server's (greedy), so log-probs under speculation are the target's, not the drafter's.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from specctl.engine.serve.http import OpenAIServer, start_http
from specctl.engine.serve.roles import EngineBackend, RoleContext
from specctl.schemas.role_config import RoleConfig

from spec_support import write_models  # isort: skip

openai = pytest.importorskip("openai")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROMPT = "def parse(path):\n    "
N = 10


class Server:
    def __init__(self, target: str, speculative: dict[str, Any]) -> None:
        role = {"name": "colocated", "model": {"target": target, "dtype": "float32", "device": "cpu"},
                "speculative": speculative, "cache": {"page_size": 4, "max_tokens": 2048},
                "serve": {"max_batch_size": 8}, "host": "127.0.0.1", "port": 0}
        self.ctx = RoleContext(deployment=None, role_name="colocated", role=RoleConfig.from_json(role))
        self.backend = EngineBackend(self.ctx)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        server = OpenAIServer(self.backend, metrics=self.ctx.metrics)
        self.runner, port = self.run(start_http(server.app, "127.0.0.1", 0))
        self.run(self.backend.load())
        self.ctx.state.set("ready", ready=True)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60,
                                    max_retries=0)
        self.model = self.client.models.list().data[0].id

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def close(self) -> None:
        self.client.close()
        self.run(self.backend.close())
        self.run(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_models(tmp_path_factory.mktemp("openai"))


@pytest.fixture(scope="module")
def plain(models: dict[str, str]) -> Iterator[Server]:
    s = Server(models["target"], {"algorithm": "none"})
    yield s
    s.close()


@pytest.fixture(scope="module")
def spec(models: dict[str, str]) -> Iterator[Server]:
    s = Server(models["target"], {"algorithm": "draft", "draft": models["draft_noisy"], "num_steps": 3})
    yield s
    s.close()


def greedy_completion(s: Server, **extra: Any) -> Any:
    return s.client.completions.create(model=s.model, prompt=PROMPT, max_tokens=N, temperature=0, logprobs=3,
                                       extra_body={"ignore_eos": True, "return_token_ids": True}, **extra)


def test_completion_logprobs_are_the_targets_and_greedy_is_their_argmax(plain: Server) -> None:
    res = greedy_completion(plain)
    choice = res.choices[0]
    ids = choice.model_extra["token_ids"]
    lp = choice.logprobs
    assert len(ids) == N and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == N
    # a token that is not text on its own (one byte of a multi-byte character) is labelled token_id:N
    assert all(t == plain.backend.decode([i]) or t == f"token_id:{i}" for t, i in zip(lp.tokens, ids, strict=True))
    texts = [plain.backend.decode([i]) for i in ids]
    assert lp.text_offset == [sum(len(t) for t in texts[:i]) for i in range(N)]
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen <= 0.0 and len(top) >= 1
        assert math.isclose(chosen, max(top.values()), abs_tol=1e-5)  # greedy picks the most likely token
        assert sum(math.exp(v) for v in top.values()) <= 1.0 + 1e-5
    # Independent oracle: each token's log-prob again, as the first token of a prompt ending before it.
    prompt_ids = plain.backend.encode(PROMPT)
    for j in (0, 3, N - 1):
        one = plain.client.completions.create(model=plain.model, prompt=prompt_ids + ids[:j], max_tokens=1,
                                              temperature=0, logprobs=0,
                                              extra_body={"ignore_eos": True, "return_token_ids": True})
        assert one.choices[0].model_extra["token_ids"] == [ids[j]]
        assert math.isclose(one.choices[0].logprobs.token_logprobs[0], lp.token_logprobs[j], abs_tol=1e-4)


def test_speculative_tokens_and_logprobs_equal_plain_greedy(plain: Server, spec: Server) -> None:
    want = greedy_completion(plain).choices[0]
    got = greedy_completion(spec)
    assert got.usage.model_extra["spec_verify_steps"] >= 1  # it really speculated
    choice = got.choices[0]
    assert choice.model_extra["token_ids"] == want.model_extra["token_ids"]
    assert choice.text == want.text
    for a, b in zip(choice.logprobs.token_logprobs, want.logprobs.token_logprobs, strict=True):
        assert math.isclose(a, b, abs_tol=1e-4)
    # streamed: the same log-probs, chunk by chunk, usage once at the end only when asked
    chunks = list(spec.client.completions.create(
        model=spec.model, prompt=PROMPT, max_tokens=N, temperature=0, logprobs=3, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    streamed = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert len(streamed) == N
    for a, b in zip(streamed, want.logprobs.token_logprobs, strict=True):
        assert math.isclose(a, b, abs_tol=1e-4)
    assert [c.usage is not None for c in chunks].count(True) == 1 and chunks[-1].usage.completion_tokens == N


def test_chat_logprobs_stream_and_not(plain: Server) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    res = plain.client.chat.completions.create(model=plain.model, messages=msgs, max_tokens=5, temperature=0,
                                               logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = res.choices[0].logprobs.content
    assert len(content) == 5
    for item in content:
        assert len(item.top_logprobs) == 2 and item.logprob <= 0
        assert math.isclose(item.logprob, item.top_logprobs[0].logprob, abs_tol=1e-5)
        assert item.bytes is None or item.bytes == list(item.token.encode())
    chunks = list(plain.client.chat.completions.create(
        model=plain.model, messages=msgs, max_tokens=5, temperature=0, logprobs=True, stream=True,
        extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    streamed = [x.logprob for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.content]
    assert streamed == pytest.approx([x.logprob for x in content], abs=1e-4)
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage at all


def test_echo_and_seeded_sampling(plain: Server) -> None:
    res = plain.client.completions.create(model=plain.model, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    bare = plain.client.completions.create(model=plain.model, prompt=PROMPT, max_tokens=4, temperature=0)
    assert res.choices[0].text == PROMPT + bare.choices[0].text
    a, b = (plain.client.completions.create(model=plain.model, prompt=PROMPT, max_tokens=8, temperature=1.0,
                                            seed=1234, extra_body={"ignore_eos": True}) for _ in range(2))
    assert a.choices[0].text == b.choices[0].text


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"best_of": 2}, "best_of"), ({"suffix": "x"}, "suffix"), ({"presence_penalty": -2.5}, "presence_penalty"),
     ({"frequency_penalty": 3.0}, "frequency_penalty"), ({"logit_bias": {"5": 101}}, "logit_bias"),
     ({"temperature": 3}, "temperature"), ({"echo": True, "logprobs": 1}, "echo"), ({"logprobs": 9}, "logprobs")],
)
def test_unsupported_and_out_of_range_are_400_naming_the_param(plain: Server, kwargs: dict[str, Any],
                                                               param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        plain.client.completions.create(model=plain.model, prompt="x", max_tokens=2, **kwargs)
    assert info.value.body["param"] == param and isinstance(info.value.body["code"], str)


def test_unknown_model_is_404_model_not_found(plain: Server) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        plain.client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        plain.client.models.retrieve("gpt-4")
    assert plain.client.models.retrieve(plain.model).id == plain.model
    with pytest.raises(openai.BadRequestError) as bad:
        plain.client.chat.completions.create(model=plain.model, messages=[{"role": "user", "content": "x"}],
                                             tools=[{"type": "function", "function": {"name": "f"}}])
    assert bad.value.body["param"] == "tools"


def test_logit_bias_moves_greedy_choices(plain: Server, spec: Server) -> None:
    for s in (plain, spec):
        forced = s.client.completions.create(model=s.model, prompt=PROMPT, max_tokens=6, temperature=0,
                                             logit_bias={"65": 100}, extra_body={"ignore_eos": True})
        assert forced.choices[0].text == "A" * 6
    first = greedy_completion(plain).choices[0]
    banned = first.model_extra["token_ids"][0]
    res = greedy_completion(plain, logit_bias={str(banned): -100}).choices[0]
    ids = res.model_extra["token_ids"]
    assert ids[0] != banned
    # the new first token is the best one left: the runner-up of the unbiased top log-probs
    ranked = sorted(first.logprobs.top_logprobs[0].items(), key=lambda kv: -kv[1])
    assert math.isclose(res.logprobs.token_logprobs[0], ranked[1][1], abs_tol=1e-5)


def top20(engine: Any, ids: list[int]) -> dict[int, float]:
    """The raw top-20 next-token log-probs after `ids`, by token id, from an offline Engine (the oracle)."""
    from specctl.engine.sampling_params import SamplingParams

    rid = engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0, logprobs=20, ignore_eos=True))
    while True:
        for seq in engine.step():
            if seq.rid == rid and seq.is_finished:
                return dict(seq.output_logprobs[0].top)


def test_penalties_follow_openais_definition_plain_and_speculative(plain: Server, spec: Server,
                                                                   models: dict[str, str]) -> None:
    """Greedy with penalties picks argmax(raw log-prob - presence*(count>0) - frequency*count) at every step.
    From the top-20 raw log-probs that is decidable: a token outside them scores at most the 20th value."""
    from specctl.engine.config import EngineConfig
    from specctl.engine.engine import Engine

    pp, fp = 0.7, 0.4
    out = plain.client.completions.create(model=plain.model, prompt=PROMPT, max_tokens=16, temperature=0,
                                          presence_penalty=pp, frequency_penalty=fp,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
    ids = out.choices[0].model_extra["token_ids"]
    oracle = Engine(EngineConfig.from_role(plain.ctx.role))
    prompt_ids = plain.backend.encode(PROMPT)
    checked = 0
    for j, tok in enumerate(ids):
        raw = top20(oracle, prompt_ids + ids[:j])
        counts = {t: ids[:j].count(t) for t in set(ids[:j])}
        scored = {t: lp - (pp if counts.get(t) else 0.0) - fp * counts.get(t, 0) for t, lp in raw.items()}
        best = max(scored, key=lambda t: scored[t])
        if scored[best] > min(raw.values()):  # decided within the top 20
            assert tok == best, (j, tok, best)
            checked += 1
    assert checked >= len(ids) // 2
    unpenalized = plain.client.completions.create(model=plain.model, prompt=PROMPT, max_tokens=16, temperature=0,
                                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert ids != unpenalized.choices[0].model_extra["token_ids"]  # the penalties changed the output
    # the speculative server applies them per verify position: the same tokens
    sres = spec.client.completions.create(model=spec.model, prompt=PROMPT, max_tokens=16, temperature=0,
                                          presence_penalty=pp, frequency_penalty=fp,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
    assert sres.choices[0].model_extra["token_ids"] == ids
    assert sres.usage.model_extra["spec_verify_steps"] >= 1
