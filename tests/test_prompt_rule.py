"""The one tokenize-prompt rule (engine/tokenizer.py `prompt_token_ids`) every role applies: the engine,
the HTTP backends (colocated, prefill) and decode's import of a transferred room."""

from __future__ import annotations

import pytest

from specctl.engine.serve.backend import TokenizingBackend
from specctl.engine.tokenizer import BYTE_BOS, ByteTokenizer, prompt_token_ids
from specctl.errors import InvalidInput


class _NoBos(ByteTokenizer):
    def __init__(self) -> None:
        super().__init__()
        self.bos_token_id = None


def test_text_gets_bos_ids_are_taken_as_given_empty_starts_from_bos() -> None:
    tok = ByteTokenizer()
    assert prompt_token_ids(tok, "ab") == [BYTE_BOS, 97, 98]
    assert prompt_token_ids(tok, [5, 6]) == [5, 6]
    assert prompt_token_ids(tok, []) == [BYTE_BOS]
    assert prompt_token_ids(tok, "") == [BYTE_BOS]  # BOS alone, never BOS twice


def test_without_bos_text_is_its_ids_and_an_empty_prompt_is_refused() -> None:
    tok = _NoBos()
    assert prompt_token_ids(tok, "ab") == [97, 98]
    with pytest.raises(InvalidInput, match="empty"):
        prompt_token_ids(tok, [])
    with pytest.raises(InvalidInput, match="empty"):
        prompt_token_ids(tok, "")


def test_the_http_backends_encode_by_the_same_rule() -> None:
    backend = TokenizingBackend.__new__(TokenizingBackend)  # no model to load: only its tokenizer matters
    backend.tokenizer = ByteTokenizer()
    assert backend.encode("hi") == prompt_token_ids(backend.tokenizer, "hi")
