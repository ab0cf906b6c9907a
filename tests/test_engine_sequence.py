"""Sequence stop conditions and incremental detokenization, with the real byte tokenizer."""

from __future__ import annotations

from specctl.engine.detokenizer import Detokenizer
from specctl.engine.sampling_params import SamplingParams
from specctl.engine.sequence import Sequence
from specctl.engine.tokenizer import BYTE_EOS, ByteTokenizer

TOK = ByteTokenizer()


def _feed(seq: Sequence, text: str) -> str | None:
    for b in text.encode():
        reason = seq.append(b, BYTE_EOS)
        if reason:
            return reason
    return None


def test_detokenizer_waits_for_complete_characters() -> None:
    det = Detokenizer(TOK)
    pieces = [det.append(b) for b in "aé€😀b".encode()]
    assert "".join(pieces) == "aé€😀b"
    assert "\ufffd" not in "".join(pieces)
    assert det.text == "aé€😀b"


def test_detokenizer_emits_invalid_bytes_eventually() -> None:
    det = Detokenizer(TOK)
    out = "".join(det.append(b) for b in [0xFF] * 8) + det.flush()
    assert out == det.text and set(out) == {"\ufffd"}


def test_max_tokens() -> None:
    seq = Sequence(0, [1], SamplingParams(max_tokens=3), tokenizer=TOK)
    assert _feed(seq, "abcdef") == "length"
    assert seq.output_ids == list(b"abc") and seq.text == "abc"


def test_eos_stops_and_is_not_output() -> None:
    seq = Sequence(0, [1], SamplingParams(max_tokens=10), tokenizer=TOK)
    assert seq.append(ord("a"), BYTE_EOS) is None
    assert seq.append(BYTE_EOS, BYTE_EOS) == "stop"
    assert seq.output_ids == [ord("a")] and seq.text == "a"


def test_ignore_eos_keeps_going() -> None:
    seq = Sequence(0, [1], SamplingParams(max_tokens=3, ignore_eos=True), tokenizer=TOK)
    assert seq.append(BYTE_EOS, BYTE_EOS) is None
    assert seq.output_ids == [BYTE_EOS]


def test_stop_string_cuts_text() -> None:
    seq = Sequence(0, [1], SamplingParams(max_tokens=100, stop=("\n\n", "END")), tokenizer=TOK)
    assert _feed(seq, "def f():\n    return 1\n\nmore") == "stop"
    assert seq.text == "def f():\n    return 1"
    # tokens stop at the one that completed the stop string
    assert bytes(seq.output_ids) == b"def f():\n    return 1\n\n"


def test_stop_string_spanning_multibyte_characters() -> None:
    seq = Sequence(0, [1], SamplingParams(max_tokens=100, stop=("é!",)), tokenizer=TOK)
    assert _feed(seq, "caféé!x") == "stop"
    assert seq.text == "café"


def test_prefill_target_and_token_slices() -> None:
    seq = Sequence(0, [10, 11, 12], SamplingParams(max_tokens=10), tokenizer=TOK)
    assert seq.prefill_target == 3
    seq.append(20, BYTE_EOS)
    seq.append(21, BYTE_EOS)
    # after preemption the cache is rebuilt up to, but not including, the newest token
    assert seq.prefill_target == 4
    assert seq.token_ids(0, 5) == [10, 11, 12, 20, 21]
    assert seq.token_ids(2, 4) == [12, 20]
    assert seq.token_ids(3, 5) == [20, 21]
    assert seq.last_token == 21
