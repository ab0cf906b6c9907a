"""Sequence: one request's state as it flows Scheduler -> ModelRunner / Decoder -> Engine.

Contract:
- `prompt_ids` never change; `output_ids` grow through `append()`, which applies the stop
  conditions in order: EOS (unless `ignore_eos`; the EOS token is not added to the output),
  stop strings (the text is cut where the stop string starts; the token that completed it stays
  in `output_ids`), then `max_tokens`.
- Cache invariant while decoding (the Decoder seam relies on it): the runner caches
  `len(prompt_ids) + len(output_ids) - 1` tokens of this request; the newest token is not cached yet.
  Prefill (possibly in chunks, possibly a recompute after preemption) fills the cache up to
  `prefill_target`; `num_cached` tracks its progress.
- Timings are `time.monotonic()` seconds: arrival, first token, finish.
- Speculative decoders append the accepted draft count of each verify step to `accepted_per_step`.
- Requests with `params.logprobs` set keep one `TokenLogprob` per output token in `output_logprobs`
  (the decoder leaves them in `pending_logprobs`; `append` keeps the one of each token it adds).

Torch-free: the generator is an opaque per-request random stream created by the engine.
"""

from __future__ import annotations

import enum
import time
from typing import Any

from specctl.engine.detokenizer import Detokenizer
from specctl.engine.prefill_export import PrefillExport
from specctl.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds no cache
    PREFILLING = "prefilling"  # holds cache pages, prompt partly cached
    RUNNING = "running"  # decoding
    FINISHED = "finished"


class Sequence:
    """A request: its tokens, its sampling recipe, where it is, and how long it took."""

    def __init__(
        self,
        rid: int,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        tokenizer: Any = None,
        prompt_text: str | None = None,
    ) -> None:
        self.rid = rid
        self.prompt_ids = list(prompt_ids)
        self.prompt_text = prompt_text
        self.params = params
        self.output_ids: list[int] = []
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None  # "stop" | "length" | "error" | "abort" | "prefilled"
        self.error: str | None = None
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.num_cached = 0  # tokens of this request in the runner's cache (prefill progress)
        self.num_preemptions = 0
        self.accepted_per_step: list[int] = []  # speculative verify results (empty for plain decoding)
        self.output_logprobs: list[Any] = []  # TokenLogprob per output token, when params.logprobs is set
        self.pending_logprobs: list[Any] | None = None  # the decoder's, for the tokens it just returned
        self.generator: Any = None  # torch.Generator for sampled requests, None for greedy
        # PD prefill role: export the caches once the first token is sampled (see Engine.add_request).
        self.export_after_prefill = False
        self.exported: PrefillExport | None = None
        self.tokenizer = tokenizer
        # Incremental detokenization costs Python work per token; only stop strings need the text while
        # generating. Without them the text is decoded once, on demand (`text`).
        self.detokenizer = Detokenizer(tokenizer) if (tokenizer is not None and params.stop) else None
        self._text = ""  # decoded output so far (stop strings), cut at the stop string
        self._decoded: tuple[int, str] = (0, "")  # (len(output_ids), text) cache for the lazy path

    # -- sizes ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def prefill_target(self) -> int:
        """Tokens the cache must hold before decoding (all but the newest once there is output)."""
        return len(self) - 1 if self.output_ids else len(self.prompt_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without building the whole list."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    # -- progress ------------------------------------------------------------------------------
    def append(self, token_id: int, eos_token_id: int | None, logprob: Any = None) -> str | None:
        """Add one generated token (and its TokenLogprob, if any); return the finish reason if it ends the request."""
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        if token_id == eos_token_id and not self.params.ignore_eos:
            return "stop"
        self.output_ids.append(token_id)
        if self.params.logprobs is not None:
            self.output_logprobs.append(logprob)
        if self.detokenizer is not None:
            new = self.detokenizer.append(token_id)
            if new:
                before = len(self._text)
                self._text += new
                if self._cut_at_stop(before):
                    return "stop"
        if len(self.output_ids) >= self.params.max_tokens:
            return "length"
        return None

    @property
    def text(self) -> str:
        """The decoded output (cut at a stop string when one matched)."""
        if self.detokenizer is not None:
            return self._text
        if self.tokenizer is None:
            return ""
        n = len(self.output_ids)
        if self._decoded[0] != n:
            self._decoded = (n, self.tokenizer.decode(self.output_ids))
        return self._decoded[1]

    def _cut_at_stop(self, before: int) -> bool:
        # Only text that could overlap the new characters needs searching.
        longest = max(len(s) for s in self.params.stop)
        start = max(0, before - longest + 1)
        hits = [i for i in (self._text.find(s, start) for s in self.params.stop) if i >= 0]
        if not hits:
            return False
        self._text = self._text[: min(hits)]
        return True

    def finish(self, reason: str, error: str | None = None) -> None:
        if self.detokenizer is not None and reason == "length":
            self._text += self.detokenizer.flush()
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.error = error
        self.finish_time = time.monotonic()

    # -- reporting -----------------------------------------------------------------------------
    @property
    def timings(self) -> dict[str, float | None]:
        """Raw monotonic timestamps (arrival, first_token, finish) plus the derived `timing()` figures."""
        return {
            "arrival": self.arrival_time,
            "first_token": self.first_token_time,
            "finish": self.finish_time,
            **self.timing(),
        }

    def timing(self) -> dict[str, float | None]:
        """ttft_s, total_s, tokens_per_s (output tokens over total time), decode_tokens_per_s."""
        end = self.finish_time if self.finish_time is not None else time.monotonic()
        total = end - self.arrival_time
        ttft = None if self.first_token_time is None else self.first_token_time - self.arrival_time
        n = len(self.output_ids)
        decode_time = None if self.first_token_time is None else end - self.first_token_time
        return {
            "ttft_s": ttft,
            "total_s": total,
            "tokens_per_s": n / total if total > 0 else None,
            "decode_tokens_per_s": (n - 1) / decode_time if decode_time and n > 1 else None,
        }

    def spec_stats(self) -> dict[str, Any]:
        """Acceptance statistics of this request (empty for plain decoding)."""
        acc = self.accepted_per_step
        if not acc:
            return {}
        return {
            "verify_steps": len(acc),
            "accepted_per_step": list(acc),
            "mean_accepted": sum(acc) / len(acc),
            # each verify step yields the accepted drafts plus the target's own token
            "tokens_per_step": (sum(acc) + len(acc)) / len(acc),
        }

    def __repr__(self) -> str:
        return (
            f"Sequence(rid={self.rid}, status={self.status.value}, prompt={len(self.prompt_ids)}, "
            f"output={len(self.output_ids)}, finish_reason={self.finish_reason})"
        )
