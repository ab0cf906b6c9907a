"""One benchmark request: send it to an OpenAI-compatible endpoint, read the SSE stream, time it.

`RequestResult` holds the raw timestamps (all `time.perf_counter()`) and what the server reported;
latencies are derived from them, always from the *scheduled* send time, so time a request spent
waiting in the client (a concurrency cap, a late pacer, a busy loop) counts as latency instead of
vanishing (no coordinated omission). `send_delay` shows that waiting separately.

A failure never raises: it becomes `error_kind` (`http_<status>`, `broken_stream`, `timeout`,
`connection`, `bad_response`, `server_error`, `empty_output`, `client_error`) plus a short message.

A chunk carries tokens when its text (completions) or `delta.content` (chat) is non-empty. ITL is
per token, as SGLang's bench_serving defines it: each gap between token-carrying chunks (after the
first) divided by that chunk's token count, once per token, so a speculative server that sends several
accepted tokens in one chunk is not credited with one token per gap. A chunk's token count is its
`token_ids` when the server sends them (specctl's `return_token_ids`), else its share of the usage's
`completion_tokens` by text length (bench_serving re-tokenizes the chunk's text instead; equal for
byte-level models). The raw gap between chunks is kept as `chunk_gaps` (its own record family).
SGLang's `sglext.spec_tokens_details` (asked for with `return_spec_tokens_details` when the run writes a
trace) is kept as `spec_details`. The server's `usage` (final chunk, `stream_options.include_usage`) is
kept whole: the metrics read token counts and speculative fields (`spec_accepted_tokens`,
`spec_verify_steps`, `accept_lengths`) from it; `timings` (top-level or inside `usage`) too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from typing import Any

import aiohttp

from specctl.bench.config import BenchConfig
from specctl.bench.workload import Prompt

_DATA = b"data:"


@dataclasses.dataclass
class RequestResult:
    """Timestamps and server-reported facts of one request (mutable while the request runs)."""

    index: int
    prompt_len: int
    output_len: int
    scheduled: float
    sent: float = 0.0
    first_token: float | None = None
    end: float | None = None
    chunk_times: list[float] = dataclasses.field(default_factory=list)
    chunk_chars: list[int] = dataclasses.field(default_factory=list)  # text length of each chunk
    chunk_ids: list[int | None] = dataclasses.field(default_factory=list)  # its token count, if the server said
    error_kind: str | None = None
    error: str = ""
    response_id: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    finish_reason: str | None = None
    text_len: int = 0
    # SGLang's `sglext.spec_tokens_details` (the server answered `return_spec_tokens_details`), when sent
    spec_details: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.scheduled

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.scheduled

    @property
    def send_delay(self) -> float:
        return self.sent - self.scheduled

    @property
    def chunk_gaps(self) -> list[float]:
        """Raw gaps between token-carrying chunks (seconds), whatever each chunk held."""
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def chunk_tokens(self) -> list[int]:
        """Tokens per chunk: the server's counts when it gave every one, else shares of the output tokens
        by text length (at least 1 per chunk)."""
        if self.chunk_ids and all(n is not None for n in self.chunk_ids):
            return [int(n) for n in self.chunk_ids if n is not None]
        chars = sum(self.chunk_chars)
        total = self.output_tokens
        if chars <= 0:
            return [1] * len(self.chunk_times)
        return [max(1, round(c * total / chars)) for c in self.chunk_chars]

    @property
    def itl(self) -> list[float]:
        """Per-token inter-token latencies (seconds), bench_serving's definition (module docstring)."""
        out: list[float] = []
        for gap, n in zip(self.chunk_gaps, self.chunk_tokens[1:], strict=False):
            out.extend([gap / n] * n)
        return out

    @property
    def prompt_tokens(self) -> int:
        value = (self.usage or {}).get("prompt_tokens")
        return value if isinstance(value, int) and _is_count(value) else self.prompt_len

    @property
    def output_tokens(self) -> int:
        value = (self.usage or {}).get("completion_tokens")
        return value if isinstance(value, int) and _is_count(value) else len(self.chunk_times)

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        if not self.ok or self.first_token is None or self.end is None or n < 2:
            return None
        return (self.end - self.first_token) / (n - 1)

    def fail(self, kind: str, message: str) -> None:
        if self.error_kind is None:
            self.error_kind = kind
            self.error = message[:300]
        if self.end is None:
            self.end = time.perf_counter()


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class RequestSender:
    """Builds request bodies for one config and sends them over a shared aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, config: BenchConfig, model: str) -> None:
        self._session = session
        self._config = config
        self._model = model
        self._url = config.url.rstrip("/") + config.api_path
        self._chat = config.endpoint == "chat"
        self._timeout = aiohttp.ClientTimeout(total=config.request_timeout_s)
        self._headers = {"Content-Type": "application/json"}
        api_key = os.environ.get("OPENAI_API_KEY")
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def body(self, prompt: Prompt, *, max_tokens: int | None = None) -> bytes:
        """The JSON request body for `prompt` (built ahead of the run to keep the send path short)."""
        cfg = self._config
        payload: dict[str, Any] = {"model": self._model, "max_tokens": max_tokens or prompt.output_len,
                                   "temperature": cfg.temperature, "stream": cfg.stream}
        if self._chat:
            payload["messages"] = [{"role": "user", "content": prompt.text}]
        else:
            payload["prompt"] = prompt.text
        if cfg.stream:
            payload["stream_options"] = {"include_usage": True}
        if cfg.ignore_eos:
            # SGLang/vLLM extension: generate exactly max_tokens so output lengths are controlled.
            payload["ignore_eos"] = True
        if cfg.spec_trace_out:
            # SGLang's extension: per-request acceptance (verify count, correct-drafts histogram) in `sglext`
            payload["return_spec_tokens_details"] = True
        payload.update(cfg.extra_request_body)
        return json.dumps(payload).encode()

    async def send(self, result: RequestResult, body: bytes) -> RequestResult:
        """Send one request, filling `result`; never raises (except cancellation)."""
        result.sent = time.perf_counter()
        status_seen = False
        try:
            async with self._session.post(self._url, data=body, headers=self._headers,
                                          timeout=self._timeout) as resp:
                if resp.status != 200:
                    text = await resp.text(errors="replace")
                    result.fail(f"http_{resp.status}", text.strip() or (resp.reason or ""))
                    return result
                status_seen = True
                if self._config.stream:
                    await self._read_stream(resp, result)
                else:
                    await self._read_whole(resp, result)
        except asyncio.TimeoutError:
            result.fail("timeout", f"no complete response within {self._config.request_timeout_s:g} s")
        except aiohttp.ClientPayloadError as exc:
            result.fail("broken_stream", str(exc) or type(exc).__name__)
        except (aiohttp.ClientError, OSError) as exc:
            result.fail("broken_stream" if status_seen else "connection", str(exc) or type(exc).__name__)
        except Exception as exc:  # anything else is still one failed request, never a crashed run
            result.fail("client_error", f"{type(exc).__name__}: {exc}")
        return result

    async def _read_stream(self, resp: aiohttp.ClientResponse, result: RequestResult) -> None:
        done = False
        async for raw in resp.content:
            now = time.perf_counter()
            line = raw.strip()
            if not line.startswith(_DATA):
                continue  # blank separators, comments (": keep-alive"), event: lines
            data = line[len(_DATA):].strip()
            if data == b"[DONE]":
                done = True
                result.end = now
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                result.fail("bad_response", f"not JSON: {data[:80]!r}")
                return
            if not isinstance(chunk, dict):
                result.fail("bad_response", f"not a JSON object: {data[:80]!r}")
                return
            if chunk.get("error"):
                result.fail("server_error", json.dumps(chunk["error"])[:300])
                return
            self._absorb(chunk, result, now)
            result.end = now
        if not done and result.finish_reason is None:
            result.fail("broken_stream", "stream ended without [DONE] or a finish_reason")
            return
        if not result.chunk_times:
            result.fail("empty_output", "the response carried no tokens")

    async def _read_whole(self, resp: aiohttp.ClientResponse, result: RequestResult) -> None:
        try:
            chunk = json.loads(await resp.read())
        except ValueError:
            result.fail("bad_response", "response body is not JSON")
            return
        now = time.perf_counter()
        if not isinstance(chunk, dict) or chunk.get("error"):
            result.fail("server_error", json.dumps(chunk)[:300])
            return
        self._absorb(chunk, result, now)
        result.end = now
        if not result.chunk_times:
            result.fail("empty_output", "the response carried no tokens")

    def _absorb(self, chunk: dict[str, Any], result: RequestResult, now: float) -> None:
        if result.response_id is None and isinstance(chunk.get("id"), str):
            result.response_id = chunk["id"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            result.usage = usage
            if isinstance(usage.get("timings"), dict):
                result.timings = usage["timings"]
        if isinstance(chunk.get("timings"), dict):
            result.timings = chunk["timings"]
        ext = chunk.get("sglext")
        if isinstance(ext, dict):
            details = ext.get("spec_tokens_details")
            if isinstance(details, list) and details:  # n > 1: bench sends n = 1, the first is ours
                details = details[0]
            if isinstance(details, dict):
                result.spec_details = details
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if self._chat:
            holder = choice.get("delta") if self._config.stream else choice.get("message")
            text = holder.get("content") if isinstance(holder, dict) else None
        else:
            text = choice.get("text")
        if isinstance(text, str) and text:
            if result.first_token is None:
                result.first_token = now
            result.chunk_times.append(now)
            result.chunk_chars.append(len(text))
            ids = choice.get("token_ids")
            result.chunk_ids.append(len(ids) if isinstance(ids, list) and ids else None)
            result.text_len += len(text)
        if choice.get("finish_reason"):
            result.finish_reason = str(choice["finish_reason"])
