"""SGLang's streamed `/generate` over a real Engine and real HTTP on 127.0.0.1: a long output streams as growing
cumulative texts whose deltas add up to the unary answer's text, and the server's detokenizing work grows with
the output (O(window) per token), not with the square of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from test_serve_http import Server, model_dir, post, sse_events  # isort: skip  # noqa: F401 - model_dir: a fixture

LONG = 600


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[Server]:  # noqa: F811 - the fixture above is this one's input
    s = Server(model_dir)
    try:
        s.load()
        yield s
    finally:
        s.close()


def test_a_long_stream_adds_up_to_the_unary_text_with_linear_detokenizer_work(server: Server) -> None:
    backend = server.backend
    decoded = [0]  # token ids the server's detokenizer handed to the tokenizer
    plain = backend.decode

    def counting(ids: list[int]) -> str:
        decoded[0] += len(ids)
        return plain(ids)

    body = {"text": "def long(x):", "sampling_params": {"max_new_tokens": LONG, "temperature": 0, "ignore_eos": True}}
    code, unary = post(server.url + "/generate", body, timeout=300)
    assert code == 200, unary
    assert len(unary["output_ids"]) == LONG
    backend.decode = counting  # type: ignore[method-assign]
    try:
        code, text = post(server.url + "/generate", {**body, "stream": True}, timeout=300)
    finally:
        del backend.decode  # type: ignore[method-assign]
    events = sse_events(text)
    assert code == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) > 10  # it really streamed in many chunks
    deltas, sent = [], ""
    for c in chunks:
        assert c["text"].startswith(sent), "a chunk's cumulative text must extend the previous one"
        deltas.append(c["text"][len(sent):])
        sent = c["text"]
    assert "".join(deltas) == unary["text"]
    assert chunks[-1]["output_ids"] == unary["output_ids"]
    # A re-decode of the whole output per chunk hands the tokenizer sum(len(out)) ~ LONG * chunks / 2 ids; the
    # incremental detokenizer a small window per token.
    assert 0 < decoded[0] <= 16 * LONG, decoded[0]
