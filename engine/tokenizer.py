"""Tokenizers: text <-> token ids, for the builtin byte-level models and Hugging Face `tokenizer.json`.

Contract: `encode(text)` returns the ids of the text alone (no BOS/EOS added); `decode(ids)` skips special
ids and never raises on a partial UTF-8 sequence (invalid bytes become U+FFFD), so streaming a byte at a
time is safe. `prompt_token_ids(tokenizer, prompt)` is THE tokenize-prompt rule every role uses (engine,
colocated, prefill, decode): a text prompt is BOS (when the tokenizer has one) + its ids, token ids are
taken as given, and an empty prompt starts from BOS alone. Disaggregated output equals colocated output
only because every process applies this one rule.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from specctl.errors import InvalidInput, UsageError

# Builtin byte-level vocabulary: ids 0-255 are bytes, then the special tokens.
BYTE_BOS, BYTE_EOS, BYTE_PAD = 256, 257, 258
BYTE_VOCAB = 260


class Tokenizer(Protocol):
    eos_token_id: int | None
    bos_token_id: int | None
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def prompt_token_ids(tokenizer: Tokenizer, prompt: str | Sequence[int]) -> list[int]:
    """A prompt's token ids: text -> BOS (when the tokenizer has one) + the text's ids (models are trained on
    documents that start with BOS, the builtin ones too); ids -> as given; an empty prompt -> [BOS] (it
    continues from beginning-of-sequence). Raises `InvalidInput` for an empty prompt without a BOS token."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if isinstance(prompt, str):
        ids = ([bos] if bos is not None else []) + list(tokenizer.encode(prompt))
    else:
        ids = [int(t) for t in prompt]
    if not ids:
        if bos is None:
            raise InvalidInput("the prompt is empty and the tokenizer has no BOS token to start from")
        ids = [int(bos)]
    return ids


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255; 256 bos, 257 eos, 258 pad (the builtin models' `"tokenizer": "bytes"`)."""

    def __init__(self, vocab_size: int = BYTE_VOCAB) -> None:
        self.vocab_size = vocab_size
        self.bos_token_id: int | None = BYTE_BOS
        self.eos_token_id: int | None = BYTE_EOS
        self.pad_token_id = BYTE_PAD

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizers.Tokenizer` read from a local `tokenizer.json` (never fetched from a hub)."""

    def __init__(self, path: Path, *, bos_token_id: int | None, eos_token_id: int | None, vocab_size: int) -> None:
        from tokenizers import Tokenizer as _Tok  # noqa: PLC0415 - tokenizers: the engine extra; prompt_token_ids is used where it is not installed

        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception on malformed files
            raise UsageError(f"cannot read tokenizer {path}: {exc}") from None
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """The tokenizer of a model directory: `"tokenizer": "bytes"` in config.json, else `tokenizer.json`."""
    model_dir = Path(model_dir)
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {model_dir / 'config.json'}: {exc}") from None
    vocab = int(cfg.get("vocab_size", BYTE_VOCAB))
    if cfg.get("tokenizer") == "bytes":
        return ByteTokenizer(vocab)
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise UsageError(
            f"{model_dir}: no tokenizer.json",
            hint="copy the model's tokenizer.json next to config.json (nothing is fetched from a hub)",
        )
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return HFTokenizer(path, bos_token_id=cfg.get("bos_token_id"), eos_token_id=eos, vocab_size=vocab)
