"""The one detokenizer's stream mode (`Detokenizer.push`, what engine/serve/http.py streams with): the
concatenated deltas equal the full decode, nothing of the last `holdback` characters leaves before the
end, the engine's final text wins, and the work per token is O(window), not O(text)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from specctl.engine.detokenizer import Detokenizer
from specctl.engine.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
TEXT = "def f(x):\n    return x * 2  # é€😀 ünïcödé\n" * 8


class _Counting(ByteTokenizer):
    def __init__(self) -> None:
        super().__init__()
        self.decoded = 0

    def decode(self, ids: Sequence[int]) -> str:
        self.decoded += len(ids)
        return super().decode(ids)


def _chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 5)
        out.append(ids[i:i + n])
        i += n
    return out


def test_deltas_add_up_to_the_full_decode_and_respect_the_holdback() -> None:
    ids = TOK.encode(TEXT)
    for seed, holdback in [(0, 0), (1, 3), (2, 11)]:
        det = Detokenizer(TOK, holdback=holdback)
        chunks = _chunks(ids, random.Random(seed))
        sent = ""
        for i, chunk in enumerate(chunks):
            final = i == len(chunks) - 1
            sent += det.push(chunk, final=final)
            if not final:
                decoded = TOK.decode([t for c in chunks[:i + 1] for t in c])
                assert "\ufffd" not in sent and decoded.startswith(sent)
                assert len(sent) <= max(0, len(decoded) - holdback)  # the tail a stop string may cut stays back
        assert sent == TEXT


def test_the_engines_final_text_is_authoritative() -> None:
    det = Detokenizer(TOK, holdback=4)  # stop string "STOP"
    sent = det.push(TOK.encode("hello world"))
    sent += det.push(TOK.encode(" STOP and more"), final=True, final_text="hello world ")
    assert sent == "hello world "


def test_work_per_token_is_bounded_by_the_window() -> None:
    tok = _Counting()
    det = Detokenizer(tok, holdback=2)
    ids = tok.encode(TEXT * 4)
    for t in ids:
        det.push([t])
    det.push([], final=True)
    assert det.text == TEXT * 4
    assert tok.decoded <= 16 * len(ids)  # a whole-text decode per token would be ~len(ids)**2 / 2
