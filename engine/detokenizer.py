"""Incremental detokenization: token ids in, newly completed text out.

Byte-level and BPE tokenizers can split one character over several tokens; decoding each token on
its own would emit replacement characters. Like vLLM, we decode a short window twice (`prefix` ..
`read` and `prefix` .. end) and emit the difference only once it no longer ends in an incomplete
character. Cost per token is O(window), not O(text).

This is the one detokenizer: the engine's stop-string check (engine/sequence.py, `append`/`flush`) and
the HTTP streams (engine/serve/http.py, `push`) both use it. `push` adds the stream's rules on top:
while stop strings are set it holds back the last `holdback` characters (the engine cuts the text where
a stop string starts, which may lie in characters already decoded), and at the end the engine's final
text, when it gives one, is authoritative.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"
# A character never needs more than this many tokens (4 UTF-8 bytes in a byte-level vocabulary);
# waiting longer means the bytes are invalid and we emit the replacement character after all.
MAX_PENDING = 6


class Decodes(Protocol):
    """What the detokenizer needs of a tokenizer (a serving backend that decodes also does)."""

    def decode(self, ids: list[int]) -> str: ...


class Detokenizer:
    """Turns a growing list of token ids into a growing string."""

    def __init__(self, tokenizer: Decodes, *, holdback: int = 0) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.holdback = max(0, holdback)
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this index are already in self.text
        self._emitted = 0  # characters of self.text already returned by push()

    def append(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        prefix_text: str = self.tokenizer.decode(self.ids[self._prefix : self._read])
        full_text: str = self.tokenizer.decode(self.ids[self._prefix :])
        pending = len(self.ids) - self._read
        if full_text.endswith(REPLACEMENT) and pending < MAX_PENDING:
            return ""  # an incomplete multi-token character: wait for the rest
        new = full_text[len(prefix_text) :]
        self.text += new
        self._prefix = self._read
        self._read = len(self.ids)
        return new

    def flush(self) -> str:
        """Emit whatever is still pending (at the end of a request)."""
        if self._read == len(self.ids):
            return ""
        prefix_text: str = self.tokenizer.decode(self.ids[self._prefix : self._read])
        new: str = self.tokenizer.decode(self.ids[self._prefix :])[len(prefix_text) :]
        self.text += new
        self._prefix = self._read = len(self.ids)
        return new

    def push(self, ids: list[int], *, final: bool = False, final_text: str | None = None) -> str:
        """A stream's next text: add `ids`, return the text that may be sent now. Before the end the last
        `holdback` characters are kept back; at the end (`final`) everything is released, `final_text`
        (the engine's own, cut at a stop string) replacing what was decoded when given."""
        for token_id in ids:
            self.append(token_id)
        if final:
            if final_text is None:
                self.flush()
                final_text = self.text
            delta = final_text[self._emitted:]
            self._emitted = max(self._emitted, len(final_text))
            return delta
        end = len(self.text) - self.holdback
        if end <= self._emitted:
            return ""
        delta = self.text[self._emitted:end]
        self._emitted = end
        return delta
