"""The request parser alone (engine/serve/openai_request.py): it never raises anything but RequestError on any
JSON a client can send (hypothesis, derandomized under CI), and what it accepts is bounded and typed.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specctl.engine.serve.openai_request import (
    MAX_INT,
    MIN_INT,
    RequestError,
    parse_chat,
    parse_completion,
    parse_json_body,
)

VOCAB = 260


class Info:
    """A served model as the parser sees it (byte tokenizer with BOS, like the builtin models)."""

    model_name = "m"
    max_context = 512
    supports_logprobs = True
    supports_logit_processors = True
    max_new_tokens = None

    def encode(self, text: str) -> list[int]:
        return [256, *text.encode()]


class PlainInfo(Info):
    """A role that cannot report log-probs or apply logit processors (PD decode, the router)."""

    supports_logprobs = False
    supports_logit_processors = False


FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "n", "seed", "stop", "ignore_eos", "stream", "stream_options", "return_token_ids", "echo", "logprobs",
          "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "best_of", "suffix", "tools",
          "tool_choice", "response_format", "role", "content", "type", "text", "include_usage", "user", "0", "5"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.sampled_from(FIELDS))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS), inner, max_size=5)), max_leaves=25)
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8)


def _check(req: Any) -> None:
    """What an accepted request guarantees downstream (the engine never sees an unbounded value)."""
    p = req.params
    assert req.prompt_ids and all(0 <= t < VOCAB for t in req.prompt_ids)
    assert 1 <= p.max_tokens and len(req.prompt_ids) + p.max_tokens <= Info.max_context
    assert 0.0 <= p.temperature <= 2.0 and 0.0 < p.top_p <= 1.0 and 0 <= p.top_k <= 1 << 31
    assert p.seed is None or MIN_INT <= p.seed <= MAX_INT
    assert all(math.isfinite(v) for v in (p.temperature, p.top_p))
    for t, b in p.logit_bias:
        assert 0 <= t < VOCAB and -100 <= b <= 100
    json.dumps(p.to_json())  # JSON-safe: written to SGLang's metrics file


@settings(max_examples=400, deadline=None)
@given(body=bodies, chat=st.booleans())
def test_any_json_body_is_parsed_or_refused_with_a_request_error(body: dict[str, Any], chat: bool) -> None:
    raw = json.dumps(body).encode()  # Python's json writes NaN/Infinity: the parser must refuse them
    try:
        parsed = parse_json_body(raw)
        req = parse_chat(parsed, Info(), vocab_size=VOCAB) if chat else parse_completion(parsed, Info(),
                                                                                         vocab_size=VOCAB)
    except RequestError as exc:
        assert 400 <= exc.status < 500 and isinstance(exc.code, str) and str(exc)
        return
    _check(req)


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_any_bytes_are_parsed_or_refused(raw: bytes) -> None:
    try:
        parse_json_body(raw)
    except RequestError as exc:
        assert exc.status == 400


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "logprobs": 1}, "logprobs"),
    ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": "x", "logit_bias": {"5": 1}}, "logit_bias"),
])
def test_roles_that_cannot_honour_a_parameter_refuse_it(body: dict[str, Any], param: str) -> None:
    parse_completion(body, Info(), vocab_size=VOCAB)  # accepted where the engine can honour it
    with pytest.raises(RequestError) as info:
        parse_completion(body, PlainInfo(), vocab_size=VOCAB)
    assert info.value.param == param and info.value.code == "unsupported_parameter"


def test_unknown_model_is_named_before_anything_else() -> None:
    with pytest.raises(RequestError) as info:
        parse_completion({"model": "other", "prompt": 5, "temperature": 9}, Info(), vocab_size=VOCAB)
    assert (info.value.status, info.value.code, info.value.param) == (404, "model_not_found", "model")


def test_sglangs_default_model_name_is_the_served_model() -> None:
    """SGLang's clients send model "default"; SGLang's completions and chat endpoints serve it."""
    assert parse_completion({"model": "default", "prompt": "x"}, Info(), vocab_size=VOCAB).model == "m"
    chat = {"model": "default", "messages": [{"role": "user", "content": "x"}]}
    assert parse_chat(chat, Info(), vocab_size=VOCAB).model == "m"


def test_vendor_extensions_pass_through_untouched() -> None:
    req = parse_completion({"prompt": "x", "bootstrap_host": "h", "bootstrap_room": 7}, Info(), vocab_size=VOCAB)
    assert req.extra == {"bootstrap_host": "h", "bootstrap_room": 7}
    assert req.params.temperature == 1.0 and req.params.top_k == 0


valid_bodies = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(0, VOCAB - 1), min_size=1,
                                                                    max_size=40))},
    optional={"max_tokens": st.integers(1, 400), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
              "top_k": st.integers(-1, 1000), "seed": st.integers(MIN_INT, MAX_INT),
              "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
              "logit_bias": st.dictionaries(st.integers(0, VOCAB - 1).map(str), st.floats(-100, 100), max_size=5),
              "stop": st.lists(st.text(min_size=1, max_size=4), max_size=4), "logprobs": st.integers(0, 5),
              "stream": st.booleans(), "ignore_eos": st.booleans(), "model": st.just("m")})


@settings(max_examples=300, deadline=None)
@given(body=valid_bodies)
def test_valid_bodies_are_accepted_and_bounded(body: dict[str, Any]) -> None:
    text = body["prompt"] if isinstance(body["prompt"], str) else None
    if text is not None and len(Info().encode(text)) + body.get("max_tokens", 1) > Info.max_context:
        return
    req = parse_completion(parse_json_body(json.dumps(body).encode()), Info(), vocab_size=VOCAB)
    _check(req)
    assert req.params.logprobs == body.get("logprobs")
