"""The OpenAI-compatible HTTP front of a serving process (aiohttp).

Contract (routes):
- `POST /v1/completions`, `POST /v1/chat/completions`: OpenAI request/response shapes, streaming (SSE,
  `data: {...}` chunks then `data: [DONE]`) and non-streaming. `usage` carries `prompt_tokens`,
  `completion_tokens`, `total_tokens` and the request's speculative statistics: `spec_accepted_tokens`
  (accepted draft tokens), `spec_verify_steps` (verify forwards) and `accept_lengths` (accepted draft
  tokens per verify step). Streams put `usage` on the chunk that carries `finish_reason`, and add
  OpenAI's usage-only chunk (`choices: []`) when `stream_options.include_usage` is true. Responses also
  carry `timings` (server-side seconds; in disaggregated mode `prefill_s`, `transfer_s`,
  `decode_queue_s`, ...).
- `GET /v1/models`, `GET /health` (200 `{"status": "ok"}` once ready and paired, else 503 with the
  reason), `GET /metrics` (Prometheus text), `GET /server_info` (resolved deployment, fingerprints,
  adaptive state and switch timeline, per-role timing).
- Every malformed or oversized request is answered with a 4xx JSON error `{"error": {"message", "type",
  "param", "code"}}` and the server keeps serving; engine-side failures are 5xx JSON errors (or an SSE
  `error` event then `[DONE]` once streaming has begun).

Chat template (byte-level builtin models have no template of their own): each message becomes
`<|ROLE|>\\nCONTENT\\n` in order, followed by `<|assistant|>\\n`; the assistant's reply is the completion.

Sampling fields understood: max_tokens (or max_completion_tokens), temperature, top_p, top_k, seed,
stop (string or list), ignore_eos. `n` must be 1. Extension: `return_token_ids: true` adds the generated
`token_ids` to each choice (each chunk's new ids when streaming), so clients can compare outputs exactly.
The HTTP layer knows nothing about engines: it talks to
a `Backend` (colocated engine, or the router's prefill+decode client).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from aiohttp import web

from specctl.engine.async_engine import RequestOutput
from specctl.engine.metrics import ServingMetrics

log = logging.getLogger("specctl.http")

MAX_REQUEST_BYTES = 1 << 20  # a 1 MiB JSON body is far beyond any prompt the builtin models can take
DEFAULT_MAX_TOKENS = 128


class Backend(Protocol):
    """What the HTTP layer needs from whatever generates tokens."""

    model_name: str
    max_context: int  # prompt + completion tokens one request may use

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def health(self) -> tuple[bool, dict[str, Any]]: ...
    def generate(self, prompt_ids: list[int], params: dict[str, Any]) -> AsyncIterator[RequestOutput]: ...
    async def server_info(self) -> dict[str, Any]: ...
    async def refresh_metrics(self, metrics: ServingMetrics) -> None: ...


class RequestError(Exception):
    """A client error: becomes a 4xx JSON body naming the offending parameter."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def error_body(message: str, *, status: int, param: str | None = None, kind: str | None = None) -> dict:
    if kind is None:
        kind = "invalid_request_error" if status < 500 else ("service_unavailable" if status == 503 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def json_error(message: str, *, status: int, param: str | None = None) -> web.Response:
    return web.json_response(error_body(message, status=status, param=param), status=status)


# request parsing ----------------------------------------------------------------------------------
def chat_prompt(messages: Any) -> str:
    """The documented chat template (module docstring)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    parts = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role'", param="messages")
        content = msg.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string", param="messages")
        parts.append(f"<|{msg['role']}|>\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def _number(body: dict, name: str, default: Any, *, lo: float | None = None, hi: float | None = None,
            integer: bool = False) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise RequestError(f"{name} must be {'an integer' if integer else 'a number'}", param=name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise RequestError(f"{name}={value} is out of range [{lo}, {hi}]", param=name)
    return value


def sampling_params(body: dict, *, prompt_len: int, max_context: int) -> dict[str, Any]:
    """OpenAI request fields -> a plain sampling dict (serialisable; engines build SamplingParams from it)."""
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported", param="n")
    room = max_context - prompt_len
    if room < 1:
        raise RequestError(
            f"prompt is {prompt_len} tokens; this model's context is {max_context} tokens", param="prompt"
        )
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, name, min(DEFAULT_MAX_TOKENS, room), lo=1, integer=True)
    if max_tokens > room:
        raise RequestError(
            f"{name}={max_tokens} plus the {prompt_len}-token prompt exceeds the context of {max_context} tokens",
            param=name,
        )
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise RequestError("stop must be a non-empty string or a list of up to 16 of them", param="stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError("seed must be an integer", param="seed")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError("ignore_eos must be a boolean", param="ignore_eos")
    return {
        "max_tokens": int(max_tokens),
        "temperature": float(_number(body, "temperature", 1.0, lo=0.0, hi=100.0)),
        "top_p": _top_p(body),
        "top_k": int(_number(body, "top_k", 0, lo=0, integer=True)),
        "seed": seed,
        "stop": stop,
        "ignore_eos": ignore_eos,
    }


def _top_p(body: dict) -> float:
    value = float(_number(body, "top_p", 1.0, lo=0.0, hi=1.0))
    if value <= 0.0:
        raise RequestError("top_p must be in (0, 1]", param="top_p")
    return value


def _prompt_ids(body: dict, backend: Backend) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt must not be empty", param="prompt")
        return backend.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise RequestError("prompt must be a non-empty string or a list of token ids (one prompt per request)",
                       param="prompt")


class _Detokenizer:
    """Incremental text for streaming: holds back a trailing partial UTF-8 sequence, and the last
    `holdback` characters while stop strings are set (the engine cuts the text where a stop string
    starts, which may be in characters already decoded). The engine's final text, when it gives one,
    is authoritative."""

    def __init__(self, backend: Backend, *, holdback: int = 0) -> None:
        self.backend = backend
        self.ids: list[int] = []
        self.emitted = 0
        self.holdback = holdback

    def push(self, ids: list[int], *, final: bool = False, final_text: str | None = None) -> str:
        self.ids.extend(ids)
        if final and final_text is not None:
            text = final_text
        else:
            text = self.backend.decode(self.ids)
            if not final:
                text = text.rstrip("\ufffd")
                if self.holdback:
                    text = text[: max(0, len(text) - self.holdback)]
        delta = text[self.emitted :]
        self.emitted = max(self.emitted, len(text))
        return delta


class _TokenClock:
    """First-token time and inter-token latency of one response, fed each chunk of new tokens.

    A chunk may carry several tokens (speculative decoding accepts a few at once): its gap is spread
    over them, so ITL stays per token.
    """

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics
        self.first: float | None = None
        self.last: float | None = None

    def tokens(self, n: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        elif self.last is not None:
            self.metrics.itl.observe((now - self.last) / n)
        self.last = now
        self.metrics.generation_tokens.inc(n)


def usage_of(prompt_len: int, completion: int, accept_lengths: list[int]) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_len,
        "completion_tokens": completion,
        "total_tokens": prompt_len + completion,
        "spec_accepted_tokens": int(sum(accept_lengths)),
        "spec_verify_steps": len(accept_lengths),
        "accept_lengths": list(accept_lengths),
    }


class OpenAIServer:
    """Routes + request lifecycle; one per process. `app` is the aiohttp Application."""

    def __init__(self, backend: Backend, *, metrics: ServingMetrics | None = None,
                 max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.backend = backend
        self.metrics = metrics or ServingMetrics()
        self.app = web.Application(client_max_size=max_request_bytes, middlewares=[self._errors])
        self.app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/health", self.health),
            web.get("/metrics", self.metrics_endpoint),
            web.get("/server_info", self.server_info),
        ])
        self.in_flight = 0
        from specctl.engine.sglang_http import add_sglang_routes

        add_sglang_routes(self)  # SGLang's native surface (/generate, /model_info, /get_load, ...)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as exc:
            self.metrics.http_errors.inc(code=str(exc.status))
            return json_error(str(exc), status=exc.status, param=exc.param)
        except web.HTTPException as exc:  # 404, 405, 413 ...: JSON instead of aiohttp's text/plain
            if exc.status < 400:
                raise
            self.metrics.http_errors.inc(code=str(exc.status))
            return json_error(exc.reason or str(exc), status=exc.status)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # a bug or an engine failure: answer 500 and keep serving
            log.exception("request %s %s failed", request.method, request.path)
            self.metrics.http_errors.inc(code="500")
            return json_error(f"internal error: {type(exc).__name__}: {exc}", status=500)

    # simple endpoints -------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.backend.model_name, "object": "model", "created": 0, "owned_by": "specctl",
             "max_model_len": self.backend.max_context}]})

    async def health(self, request: web.Request) -> web.Response:
        ready, detail = self.backend.health()
        body = {"status": "ok" if ready else detail.get("status", "starting"), **detail}
        body["status"] = "ok" if ready else body["status"]
        return web.json_response(body, status=200 if ready else 503)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        try:
            await self.backend.refresh_metrics(self.metrics)
        except Exception:  # metrics must keep answering even when the engine is busy or down
            log.debug("refresh_metrics failed", exc_info=True)
        self.metrics.running.set(self.in_flight)
        text = self.metrics.render()
        mirror = getattr(self.backend, "mirrored_metrics", None)
        if mirror is not None:
            # Metric families another role owns (the router shows prefill's transfer metrics).
            prefix, extra = await mirror()
            text = self.metrics.render(skip=(prefix,)) + extra
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def server_info(self, request: web.Request) -> web.Response:
        info = await self.backend.server_info()
        info.setdefault("in_flight", self.in_flight)
        return web.json_response(info, dumps=lambda o: json.dumps(o, default=str))

    # generation ------------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError("request body too large", status=413) from None
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise RequestError("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        return body

    def _unavailable(self) -> web.Response | None:
        ready, detail = self.backend.health()
        if ready:
            return None
        self.metrics.http_errors.inc(code="503")
        self.metrics.requests.inc(status="unavailable")
        reason = detail.get("detail") or detail.get("status") or "starting"
        return json_error(f"server not ready ({detail.get('status')}): {reason}", status=503)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        ids = _prompt_ids(body, self.backend)
        return await self._generate(request, body, ids, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        ids = self.backend.encode(chat_prompt(body.get("messages")))
        return await self._generate(request, body, ids, chat=True)

    async def _generate(self, request: web.Request, body: dict, ids: list[int], *, chat: bool) -> web.StreamResponse:
        params = sampling_params(body, prompt_len=len(ids), max_context=self.backend.max_context)
        from specctl.engine.sglang_http import bootstrap_fields

        params.update(bootstrap_fields(body))  # sglang-router's PD fields reach the backend
        check = getattr(self.backend, "check_params", None)
        if check is not None:
            check(params)  # a role that cannot serve these params says why (4xx) before any stream starts
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream must be a boolean", param="stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise RequestError("stream_options must be an object", param="stream_options")
        include_usage = bool(options.get("include_usage", False))
        return_ids = body.get("return_token_ids", False)
        if not isinstance(return_ids, bool):
            raise RequestError("return_token_ids must be a boolean", param="return_token_ids")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        model = body.get("model") or self.backend.model_name
        self.in_flight += 1
        try:
            if stream:
                return await self._stream(request, ids, params, rid=rid, created=created, model=model, chat=chat,
                                          include_usage=include_usage, return_ids=return_ids)
            return await self._unary(ids, params, rid=rid, created=created, model=model, chat=chat,
                                     return_ids=return_ids)
        finally:
            self.in_flight -= 1

    def _record(self, *, t0: float, first: float | None, ids: list[int], final: RequestOutput | None,
                status: str) -> None:
        m = self.metrics
        m.requests.inc(status=status)
        m.e2e.observe(time.perf_counter() - t0)
        if first is not None:
            m.ttft.observe(first - t0)
        if final is not None:
            m.prompt_tokens.inc(len(ids))
            for n in final.accept_lengths:
                m.spec_accept_length.observe(n)
            m.spec_accepted.inc(sum(final.accept_lengths))
            m.spec_verify_steps.inc(len(final.accept_lengths))

    async def _unary(self, ids: list[int], params: dict, *, rid: str, created: int, model: str,
                     chat: bool, return_ids: bool) -> web.Response:
        t0 = time.perf_counter()
        clock = _TokenClock(self.metrics)
        out: list[int] = []
        final: RequestOutput | None = None
        async for item in self.backend.generate(ids, params):
            if item.token_ids:
                clock.tokens(len(item.token_ids))
                out.extend(item.token_ids)
            if item.finished:
                final = item
                break
        if final is None or final.finish_reason == "error":
            message = (final.error if final else None) or "generation ended without a result"
            self._record(t0=t0, first=clock.first, ids=ids, final=None, status="error")
            self.metrics.http_errors.inc(code="503")
            return json_error(message, status=503)
        self._record(t0=t0, first=clock.first, ids=ids, final=final, status=final.finish_reason or "stop")
        text = final.text if final.text is not None else self.backend.decode(out)
        usage = usage_of(len(ids), len(out), final.accept_lengths)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": final.finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "finish_reason": final.finish_reason, "logprobs": None}
        if return_ids:
            choice["token_ids"] = out
        return web.json_response({
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage, "timings": final.timings,
        })

    async def _stream(self, request: web.Request, ids: list[int], params: dict, *, rid: str, created: int,
                      model: str, chat: bool, include_usage: bool, return_ids: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        stops = params.get("stop") or []
        detok = _Detokenizer(self.backend, holdback=max((len(x) for x in stops), default=1) - 1)

        def chunk(text: str | None, finish: str | None, *, role: bool = False, token_ids: list[int] | None = None
                  ) -> dict:
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if text:
                    delta["content"] = text
                c: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            else:
                c = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            if return_ids and token_ids is not None:
                c["token_ids"] = token_ids
            return {"id": rid, "object": kind, "created": created, "model": model, "choices": [c]}

        async def send(obj: dict) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        t0 = time.perf_counter()
        clock = _TokenClock(self.metrics)
        count = 0
        final: RequestOutput | None = None
        status = "error"
        try:
            if chat:
                await send(chunk(None, None, role=True))
            async for item in self.backend.generate(ids, params):
                if item.token_ids:
                    clock.tokens(len(item.token_ids))
                    count += len(item.token_ids)
                text = detok.push(item.token_ids, final=item.finished, final_text=item.text)
                if item.finished:
                    final = item
                    if item.finish_reason == "error":
                        if text or item.token_ids:
                            await send(chunk(text, None, token_ids=item.token_ids))
                        await send(error_body(item.error or "generation failed", status=503))
                        break
                    c = chunk(text, item.finish_reason, token_ids=item.token_ids)
                    c["usage"] = usage_of(len(ids), count, item.accept_lengths)
                    c["timings"] = item.timings
                    await send(c)
                    if include_usage:
                        await send({"id": rid, "object": kind, "created": created, "model": model, "choices": [],
                                    "usage": c["usage"]})
                    status = item.finish_reason or "stop"
                    break
                if text or (return_ids and item.token_ids):
                    await send(chunk(text, None, token_ids=item.token_ids))
            else:
                await send(error_body("generation ended without a result", status=503))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            status = "disconnected"  # the backend generator's finally aborted the request
            raise
        finally:
            recorded = final if status not in {"error", "disconnected"} else None
            self._record(t0=t0, first=clock.first, ids=ids, final=recorded, status=status)
        return resp


async def start_http(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (port 0 picks a free one); returns the runner and the bound port."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    server = site._server  # aiohttp exposes no public accessor for the bound port
    bound = server.sockets[0].getsockname()[1] if server is not None and server.sockets else port
    return runner, int(bound)
