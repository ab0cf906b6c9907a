"""Incremental detokenization: token ids in, newly completed text out.

Byte-level and BPE tokenizers can split one character over several tokens; decoding each token on
its own would emit replacement characters. Like vLLM, we decode a short window twice (`prefix` ..
`read` and `prefix` .. end) and emit the difference only once it no longer ends in an incomplete
character. Cost per token is O(window), not O(text).
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"
# A character never needs more than this many tokens (4 UTF-8 bytes in a byte-level vocabulary);
# waiting longer means the bytes are invalid and we emit the replacement character after all.
MAX_PENDING = 6


class Detokenizer:
    """Turns a growing list of token ids into a growing string."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this index are already in self.text

    def append(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        full_text = self.tokenizer.decode(self.ids[self._prefix :])
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
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        new = self.tokenizer.decode(self.ids[self._prefix :])[len(prefix_text) :]
        self.text += new
        self._prefix = self._read = len(self.ids)
        return new
