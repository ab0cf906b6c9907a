"""The OpenAI-compatible HTTP front of a serving process (aiohttp).

Contract (routes):
- `POST /v1/completions`, `POST /v1/chat/completions`: OpenAI request/response shapes, streaming (SSE,
  `data: {...}` chunks then `data: [DONE]`) and non-streaming. `usage` carries `prompt_tokens`,
  `completion_tokens`, `total_tokens` and the request's speculative statistics: `spec_accepted_tokens`
  (accepted draft tokens), `spec_verify_steps` (verify forwards) and `accept_lengths` (accepted draft
  tokens per verify step). Streams send `usage` only when `stream_options.include_usage` is true, once,
  on OpenAI's usage-only last chunk (`choices: []`). Responses (the finishing chunk when streaming) also
  carry `timings` (server-side seconds; in disaggregated mode `prefill_s`, `transfer_s`,
  `decode_queue_s`, ...). SGLang's extension: a request with `return_spec_tokens_details: true` gets
  `sglext.spec_tokens_details` (serve/spec_stats.py), at the top level of the response, or when streaming
  on a chunk of its own (`choices: []`) before the usage chunk, as SGLang sends it. Every finished
  request is appended to SGLang's metrics file when one is set (`spec_stats.MetricsFile`).
- `GET /v1/models`, `GET /health` (200 `{"status": "ok"}` once ready and paired, else 503 with the
  reason), `GET /metrics` (Prometheus text), `GET /server_info` (resolved deployment, fingerprints,
  adaptive state and switch timeline, per-role timing).
- `GET /v1/models/{id}`: the model card, or 404 `model_not_found`.
- Every request is parsed and bounded by `specctl.engine.serve.openai_request` (JSON depth, integer range,
  finite numbers, valid Unicode, token ids in the vocabulary, content-part types, OpenAI's ranges); a
  malformed, oversized or unsupported request gets a 4xx `{"error": {"message", "type", "param",
  "code"}}` (`code` a string, `param` the field) and the server keeps serving; engine-side failures are
  5xx JSON errors (or an SSE `error` event then `[DONE]` once streaming has begun).
- Connections: request headers must arrive (and an idle keep-alive connection is closed) within
  `HEADER_TIMEOUT_S`, a body within `BODY_TIMEOUT_S` (408). Admission sheds instead of failing (docs/http.md):
  connections are accounted one by one, not per client address (a router and every local client share
  127.0.0.1); at `max_connections` open ones a new connection closes the one idle longest (a connection with no
  request in progress: a stranger's idle or half-sent sockets go first, never a request being served), and only
  when every connection is busy is the new one answered 503 with `Retry-After`. Generation requests queue in
  the engine; beyond `MAX_QUEUED_REQUESTS` in flight the next is a 503 with `Retry-After`.

Chat template (byte-level builtin models have no template of their own): each message becomes
`<|ROLE|>\\nCONTENT\\n` in order, followed by `<|assistant|>\\n`; the assistant's reply is the completion.

Sampling fields understood: max_tokens (or max_completion_tokens), temperature (0-2), top_p, top_k (-1 or
0: off), seed, stop (string or list), ignore_eos, echo (completions), logprobs (completions: 0-5; chat:
`logprobs` + `top_logprobs` 0-20; the target model's raw log-probs, see engine/logprobs.py). `n` and
`best_of` must be 1; presence/frequency_penalty and logit_bias are applied (engine/penalties.py); suffix,
tools and a response_format other than text are refused with a 400 naming them. Streams carry `usage`
only with `stream_options.include_usage`, once, on OpenAI's last chunk (`choices: []`). Extension:
`return_token_ids: true` adds the generated `token_ids` to each choice (each chunk's new ids when
streaming), so clients can compare outputs exactly. The HTTP layer knows nothing about engines: it talks
to a `Backend` (serve/backend.py `EngineBackend` for colocated, serve/prefill.py and serve/decode.py for a
disaggregated pair behind sglang-router) and streams text through the one detokenizer
(engine/detokenizer.py, with stop-string holdback).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from specctl.engine.async_engine import RequestOutput
from specctl.engine.detokenizer import Detokenizer
from specctl.engine.serve.metrics import ServingMetrics, TokenClock
from specctl.engine.serve.openai_request import (
    DEFAULT_MAX_TOKENS,
    MAX_REQUEST_BYTES,
    GenerationRequest,
    PdRoute,
    RequestError,
    chat_prompt,
    parse_chat,
    parse_completion,
    parse_json_body,
    pd_route,
)
from specctl.engine.serve.spec_stats import MetricsFile, RequestClock, request_meta, spec_tokens_details

if TYPE_CHECKING:
    from specctl.engine.logprobs import TokenLogprob  # torch; the front stays light
    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.tokenizer import Tokenizer

__all__ = ["DEFAULT_MAX_TOKENS", "Backend", "OpenAIServer", "RequestError", "chat_prompt", "error_body",
           "json_error", "start_http"]

log = logging.getLogger("specctl.http")

# A connection must finish its headers, and an idle keep-alive connection is closed, within this (slowloris).
# Longer than the 15 s idle keep-alive of common clients (aiohttp, httpx), so they close first and never
# send on a connection the server is closing.
HEADER_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 30.0  # from the end of the headers to the last byte of the body
MAX_CONNECTIONS = 8192  # open connections in all (bounded further by the process's descriptor limit)
FD_RESERVE = 512  # descriptors kept for everything but HTTP connections (models, sockets of the PD plane, logs)
MAX_QUEUED_REQUESTS = 4096  # generation requests in flight (running or queued in the engine) before a 503
RETRY_AFTER_S = 1


class Backend(Protocol):
    """What the HTTP layer needs from whatever generates tokens (every backend implements all of it)."""

    model_name: str
    max_context: int  # prompt + completion tokens one request may use
    supports_logprobs: bool  # reports each token's log-prob (engine/logprobs.py)
    supports_logit_processors: bool  # applies penalties and logit_bias (engine/penalties.py)
    max_new_tokens: int | None  # the most tokens one request may generate (None: the context bounds it)
    # Prompt tokens are counted where they are computed: a PD role's front reads the prompt but prefill's
    # engine counts it (`record_prefill`), and decode never computes it.
    front_counts_prompt_tokens: bool

    @property
    def vocab_size(self) -> int | None:
        """Token ids a request may carry are below this (None: not known yet, the model still loads)."""
    @property
    def launch_steps(self) -> int | None:
        """The role's launch-time draft length (None: no speculation), for SGLang's statistics."""
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def loaded_tokenizer(self) -> Tokenizer:
        """The tokenizer; a 503 RequestError while it still loads."""
    def health(self) -> tuple[bool, dict[str, Any]]: ...
    def check_params(self, params: SamplingParams, route: PdRoute | None) -> None:
        """A RequestError (4xx) when this role cannot serve the request, before any stream starts."""
    def load_info(self) -> dict[str, int]:
        """SGLang's /get_load counts this role knows (`num_reqs`, ...); a key left out is the front's count."""
    def generate(self, prompt_ids: list[int], params: SamplingParams, *, route: PdRoute | None = None,
                 stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Deltas of one request; `stream=False` when only its first tokens and its end are needed."""
    async def server_info(self) -> dict[str, Any]: ...
    async def refresh_metrics(self, metrics: ServingMetrics) -> None: ...


def error_body(message: str, *, status: int, param: str | None = None, code: str | None = None,
               kind: str | None = None) -> dict[str, Any]:
    """OpenAI's error object; `code` is always a string (clients switch on it)."""
    if kind is None:
        kind = "invalid_request_error" if status < 500 else ("service_unavailable" if status == 503 else "server_error")
    code = code or STATUS_CODES.get(status, str(status))
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


STATUS_CODES = {400: "invalid_value", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
                413: "request_too_large", 429: "too_many_connections", 500: "internal_error",
                503: "service_unavailable"}


def json_error(message: str, *, status: int, param: str | None = None, code: str | None = None) -> web.Response:
    return web.json_response(error_body(message, status=status, param=param, code=code), status=status)


def token_repr(backend: Backend, token_id: int) -> tuple[str, str, list[int] | None]:
    """(label, text, bytes) of one token: a token that is not valid text on its own (a byte of a
    multi-byte character) is labelled `token_id:N`, vLLM's spelling, so top-logprob keys stay distinct."""
    text = backend.decode([token_id])
    if "\ufffd" in text or not text:
        return f"token_id:{token_id}", text, None
    return text, text, list(text.encode())


def logprobs_of(backend: Backend, ids: list[int], entries: list[TokenLogprob | None] | None, *, chat: bool,
                offset: int = 0) -> dict[str, Any]:
    """OpenAI's `logprobs` object for generated `ids` and their TokenLogprob entries (None: not known).

    Chat: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`; completions
    (legacy): `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`, offsets from
    `offset` in the returned text."""
    entries = list(entries or [])
    entries += [None] * (len(ids) - len(entries))
    reprs = [token_repr(backend, t) for t in ids]
    if chat:
        content = []
        for (label, _, raw), e in zip(reprs, entries, strict=True):
            top = []
            for tid, lp in ([] if e is None else e.top):
                tl, _, tb = token_repr(backend, tid)
                top.append({"token": tl, "logprob": lp, "bytes": tb})
            content.append({"token": label, "logprob": None if e is None else e.logprob, "bytes": raw,
                            "top_logprobs": top})
        return {"content": content}
    offsets = []
    for _, text, _ in reprs:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": [r[0] for r in reprs], "token_logprobs": [None if e is None else e.logprob for e in entries],
            "top_logprobs": [None if e is None else {token_repr(backend, tid)[0]: lp for tid, lp in e.top}
                             for e in entries],
            "text_offset": offsets}


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
                 max_request_bytes: int = MAX_REQUEST_BYTES, body_timeout_s: float = BODY_TIMEOUT_S,
                 max_queued_requests: int = MAX_QUEUED_REQUESTS) -> None:
        self.backend = backend
        self.max_queued_requests = max_queued_requests
        self.shed = 0  # generation requests answered 503 because the queue was full
        self.metrics = metrics or ServingMetrics()
        self.body_timeout_s = body_timeout_s
        self.metrics.set_model_name(backend.model_name)
        self.launch_steps = backend.launch_steps
        self.metrics_file = MetricsFile.from_env()
        self.app = web.Application(client_max_size=max_request_bytes, middlewares=[self._errors])
        self.app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/v1/models/{model_id:.+}", self.model),
            web.get("/health", self.health),
            web.get("/metrics", self.metrics_endpoint),
            web.get("/server_info", self.server_info),
        ])
        self.in_flight = 0
        from specctl.engine.serve.sglang_http import add_sglang_routes

        add_sglang_routes(self)  # SGLang's native surface (/generate, /model_info, /get_load, ...)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connections = request.app.get(CONNECTIONS)
        if connections is not None:
            connections.busy(request.protocol, +1)  # a connection serving a request is never evicted
        try:
            resp: web.StreamResponse = await handler(request)
            return resp
        except RequestError as exc:
            self.metrics.http_errors.inc(code=str(exc.status))
            return json_error(str(exc), status=exc.status, param=exc.param, code=exc.code)
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
        finally:
            if connections is not None:
                connections.busy(request.protocol, -1)

    # simple endpoints -------------------------------------------------------------------------------
    def _model_card(self) -> dict[str, Any]:
        return {"id": self.backend.model_name, "object": "model", "created": 0, "owned_by": "specctl",
                "max_model_len": self.backend.max_context}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model_id"]
        if name != self.backend.model_name:
            raise RequestError(f"the model {name!r} does not exist; this server serves {self.backend.model_name!r}",
                               param="model", status=404, code="model_not_found")
        return web.json_response(self._model_card())

    async def health(self, request: web.Request) -> web.Response:
        ready, detail = self.backend.health()
        body = {"status": "ok" if ready else detail.get("status", "starting"), **detail}
        body["status"] = "ok" if ready else body["status"]
        return web.json_response(body, status=200 if ready else 503)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        self.metrics.running.set(self.in_flight)  # an engine-backed role overrides it with its running batch
        connections = request.app.get(CONNECTIONS)
        if connections is not None:
            self.metrics.http_connections.set(len(connections.open))
            self.metrics.http_shed.mirror(connections.evicted, reason="idle_connection_evicted")
            self.metrics.http_shed.mirror(connections.refused, reason="connection_refused")
        self.metrics.http_shed.mirror(self.shed, reason="queue_full")
        try:
            await self.backend.refresh_metrics(self.metrics)
        except Exception:  # metrics must keep answering even when the engine is busy or down
            log.debug("refresh_metrics failed", exc_info=True)
        text = self.metrics.render()
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def server_info(self, request: web.Request) -> web.Response:
        info = await self.backend.server_info()
        info.setdefault("in_flight", self.in_flight)
        return web.json_response(info, dumps=lambda o: json.dumps(o, default=str))

    # generation ------------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            # The header timeout is aiohttp's (start_http); this bounds a client that trickles its body.
            raw = await asyncio.wait_for(request.read(), self.body_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(f"request body larger than {request.app._client_max_size} bytes",
                               status=413, code="request_too_large") from None
        except asyncio.TimeoutError:
            raise RequestError(f"request body not received within {self.body_timeout_s:g} s", status=408,
                               code="request_timeout") from None
        except (web.HTTPBadRequest, ValueError) as exc:  # a malformed chunked body, a bad Content-Length
            raise RequestError(f"unreadable request body: {exc}", code="invalid_body") from None
        return parse_json_body(raw)

    def _unavailable(self) -> web.Response | None:
        ready, detail = self.backend.health()
        if ready:
            return None
        self.metrics.http_errors.inc(code="503")
        self.metrics.requests.inc(status="unavailable")
        reason = detail.get("detail") or detail.get("status") or "starting"
        return json_error(f"server not ready ({detail.get('status')}): {reason}", status=503)

    def _vocab_size(self) -> int | None:
        return self.backend.vocab_size

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        return await self._generate(request, parse_completion(body, self.backend, vocab_size=self._vocab_size()))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        return await self._generate(request, parse_chat(body, self.backend, vocab_size=self._vocab_size()))

    async def _generate(self, request: web.Request, req: GenerationRequest) -> web.StreamResponse:
        req = dataclasses.replace(req, route=pd_route(req.extra))  # sglang-router's PD fields reach the backend
        self.backend.check_params(req.params, req.route)  # a role that cannot serve them says why (4xx) here
        if self.in_flight >= self.max_queued_requests:  # the queue is full: shed, and say when to come back
            self.shed += 1
            self.metrics.http_errors.inc(code="503")
            self.metrics.requests.inc(status="shed")
            resp = json_error(f"{self.in_flight} requests are queued, the most this server holds; retry in "
                              f"{RETRY_AFTER_S}s", status=503, code="overloaded")
            resp.headers["Retry-After"] = str(RETRY_AFTER_S)
            return resp
        rid = ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        self.in_flight += 1
        try:
            if req.stream:
                return await self._stream(request, req, rid=rid, created=created)
            return await self._unary(req, rid=rid, created=created)
        finally:
            self.in_flight -= 1

    def finished_meta(self, rid: str, prompt_len: int, completion: int, final: RequestOutput, clock: RequestClock,
                      params: SamplingParams, route: PdRoute | None) -> dict[str, Any]:
        """SGLang's `meta_info` of a finished request (serve/spec_stats.py), appended to the metrics file when
        one is set; a metrics file that cannot be written is logged, never a failed request."""
        meta = request_meta(rid, prompt_tokens=prompt_len, completion_tokens=completion,
                            finish_reason=final.finish_reason, accepts=final.accept_lengths, launch=self.launch_steps,
                            **clock.times())
        meta["timings"] = final.timings
        if final.error:
            meta["error"] = final.error
        if self.metrics_file is not None:
            try:
                sampling = {**params.to_json(), **(route.to_json() if route is not None else {})}
                self.metrics_file.write({"rid": rid, "sampling_params": sampling}, meta)
            except (OSError, TypeError, ValueError) as exc:
                log.warning("cannot append to the metrics file in %s: %s", self.metrics_file.dir, exc)
        return meta

    def _echo(self, req: GenerationRequest) -> str:
        if not req.echo:
            return ""
        return req.prompt_text if req.prompt_text is not None else self.backend.decode(req.prompt_ids)

    @property
    def _counts_prompts(self) -> bool:
        return self.backend.front_counts_prompt_tokens

    def _record(self, *, t0: float, first: float | None, ids: list[int], final: RequestOutput | None,
                status: str) -> None:
        self.metrics.record_request(status=status, e2e_s=time.perf_counter() - t0,
                                    ttft_s=None if first is None else first - t0,
                                    prompt_tokens=len(ids) if final is not None and self._counts_prompts else None,
                                    accept_lengths=final.accept_lengths if final is not None else ())

    async def _unary(self, req: GenerationRequest, *, rid: str, created: int) -> web.Response:
        ids, chat = req.prompt_ids, req.chat
        t0 = time.perf_counter()
        clock = TokenClock(self.metrics)
        times = RequestClock()
        out: list[int] = []
        lps: list[TokenLogprob | None] = []
        final: RequestOutput | None = None
        async for item in self.backend.generate(ids, req.params, route=req.route, stream=False):
            times.tokens(item.token_ids)
            if item.token_ids:
                clock.tokens(len(item.token_ids))
                out.extend(item.token_ids)
                lps.extend(item.logprobs or [None] * len(item.token_ids))
            if item.finished:
                final = item
                break
        if final is None or final.finish_reason == "error":
            message = (final.error if final else None) or "generation ended without a result"
            self._record(t0=t0, first=clock.first, ids=ids, final=None, status="error")
            code = (final.error_status if final else None) or 503
            self.metrics.http_errors.inc(code=str(code))
            return json_error(message, status=code)
        self._record(t0=t0, first=clock.first, ids=ids, final=final, status=final.finish_reason or "stop")
        text = final.text if final.text is not None else self.backend.decode(out)
        usage = usage_of(len(ids), len(out), final.accept_lengths)
        choice: dict[str, Any]
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": final.finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": self._echo(req) + text, "finish_reason": final.finish_reason,
                      "logprobs": None}
        if req.return_token_ids:
            choice["token_ids"] = out
        if req.logprobs is not None:
            choice["logprobs"] = logprobs_of(self.backend, out, lps, chat=chat)
        body: dict[str, Any] = {
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": req.model, "choices": [choice], "usage": usage, "timings": final.timings,
        }
        sglext = self._sglext(req, self.finished_meta(rid, len(ids), len(out), final, times, req.params, req.route))
        if sglext is not None:
            body["sglext"] = sglext
        return web.json_response(body)

    @staticmethod
    def _sglext(req: GenerationRequest, meta: dict[str, Any]) -> dict[str, Any] | None:
        """SGLang's response-level `sglext` when the request set `return_spec_tokens_details: true`."""
        if req.extra.get("return_spec_tokens_details") is not True:
            return None
        details = spec_tokens_details(meta)
        return None if details is None else {"spec_tokens_details": details}

    async def _stream(self, request: web.Request, req: GenerationRequest, *, rid: str, created: int
                      ) -> web.StreamResponse:
        ids, chat, model = req.prompt_ids, req.chat, req.model
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        stops = req.params.stop
        detok = Detokenizer(self.backend, holdback=max((len(x) for x in stops), default=1) - 1)

        offset = [len(self._echo(req))]  # text_offset of the next token (completions' logprobs)

        def chunk(text: str | None, finish: str | None, *, token_ids: list[int] | None = None,
                  logprobs: list[TokenLogprob | None] | None = None) -> dict[str, Any]:
            c: dict[str, Any]
            if chat:
                c = {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish,
                     "logprobs": None}
            else:
                c = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            if req.return_token_ids and token_ids is not None:
                c["token_ids"] = token_ids
            if req.logprobs is not None and token_ids:
                c["logprobs"] = logprobs_of(self.backend, token_ids, logprobs, chat=chat, offset=offset[0])
                offset[0] += len(self.backend.decode(token_ids))
            return {"id": rid, "object": kind, "created": created, "model": model, "choices": [c]}

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        t0 = time.perf_counter()
        clock = TokenClock(self.metrics)
        times = RequestClock()
        count = 0
        final: RequestOutput | None = None
        status = "error"
        try:
            if chat:  # OpenAI's first chunk: the role, with empty (not null) content
                await send({"id": rid, "object": kind, "created": created, "model": model, "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                     "logprobs": None}]})
            elif req.echo:
                await send(chunk(self._echo(req), None))
            async for item in self.backend.generate(ids, req.params, route=req.route):
                times.tokens(item.token_ids)
                if item.token_ids:
                    clock.tokens(len(item.token_ids))
                    count += len(item.token_ids)
                text = detok.push(item.token_ids, final=item.finished, final_text=item.text)
                if item.finished:
                    final = item
                    if item.finish_reason == "error":
                        if text or item.token_ids:
                            await send(chunk(text, None, token_ids=item.token_ids, logprobs=item.logprobs))
                        await send(error_body(item.error or "generation failed", status=item.error_status or 503))
                        break
                    c = chunk(text, item.finish_reason, token_ids=item.token_ids, logprobs=item.logprobs)
                    c["timings"] = item.timings
                    await send(c)
                    meta = self.finished_meta(rid, len(ids), count, item, times, req.params, req.route)
                    sglext = self._sglext(req, meta)
                    if sglext is not None:  # SGLang: its own chunk, no choices, before the usage chunk
                        await send({"id": rid, "object": kind, "created": created, "model": model, "choices": [],
                                    "sglext": sglext})
                    if req.include_usage:  # OpenAI: usage once, on a last chunk with no choices
                        await send({"id": rid, "object": kind, "created": created, "model": model, "choices": [],
                                    "usage": usage_of(len(ids), count, item.accept_lengths)})
                    status = item.finish_reason or "stop"
                    break
                if text or ((req.return_token_ids or req.logprobs is not None) and item.token_ids):
                    await send(chunk(text, None, token_ids=item.token_ids, logprobs=item.logprobs))
            else:
                await send(error_body("generation ended without a result", status=503))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            status = "disconnected"  # the backend generator's finally aborted the request
            raise
        except Exception as exc:  # a failure once the stream began: it still ends with an error event
            log.warning("stream %s failed: %s: %s", rid, type(exc).__name__, exc)
            self.metrics.http_errors.inc(code="500")
            with contextlib.suppress(ConnectionError, RuntimeError):
                await send(error_body(f"internal error: {type(exc).__name__}: {exc}", status=500))
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
        finally:
            recorded = final if status not in {"error", "disconnected"} else None
            self._record(t0=t0, first=clock.first, ids=ids, final=recorded, status=status)
        return resp


class _MalformedHttp(logging.Filter):
    """aiohttp logs a client's malformed HTTP (bad request line, oversized header, broken chunking) as
    an ERROR with a traceback, then answers 400 itself: a client fault is one line of INFO here, and a client
    that disconnects mid-request one line of DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, ConnectionError):  # the client went away mid-request: nothing to fix here
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.msg, record.args = "client %s disconnected: %s", (*args[:1], exc)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return _protocol_log.isEnabledFor(logging.DEBUG)
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.msg, record.args = "malformed HTTP request from %s: %s", (*args[:1], exc)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_protocol_log = logging.getLogger("specctl.http.protocol")
_protocol_log.addFilter(_MalformedHttp())


@dataclasses.dataclass
class _Conn:
    transport: asyncio.BaseTransport
    last_active: float
    busy: int = 0


class Connections:
    """Per-connection accounting on aiohttp's `Server` (whose `connection_made` / `connection_lost` see every
    connection): at `limit` open connections a new one evicts the connection idle longest (no request in
    progress), and only when all are busy is it answered 503 with `Retry-After` and closed before aiohttp reads
    anything from it. A router and a stranger on the same address are told apart by what their connections do,
    not by where they come from."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self.open: dict[web.RequestHandler, _Conn] = {}  # handlers have __slots__: the state lives here
        self.evicted = 0
        self.refused = 0

    def install(self, server: web.Server) -> None:
        self._made = server.connection_made
        self._lost = server.connection_lost
        server.connection_made = self.connection_made  # type: ignore[method-assign]
        server.connection_lost = self.connection_lost  # type: ignore[method-assign]

    def busy(self, handler: Any, delta: int) -> None:
        conn = self.open.get(handler)
        if conn is not None:
            conn.busy = max(0, conn.busy + delta)
            conn.last_active = time.monotonic()

    def _idlest(self) -> web.RequestHandler | None:
        idle = [(c.last_active, i, h) for i, (h, c) in enumerate(self.open.items()) if not c.busy]
        return min(idle)[2] if idle else None

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        self._made(handler, transport)
        if len(self.open) >= self.limit:
            victim = self._idlest()
            if victim is None:
                self.refused += 1
                body = json.dumps(error_body(f"all {self.limit} connections of this server are serving requests; "
                                             f"retry in {RETRY_AFTER_S}s", status=503, code="overloaded")).encode()
                transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Retry-After: " + str(RETRY_AFTER_S).encode() + b"\r\nConnection: close\r\n"
                                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                handler.force_close()
                transport.close()
                return
            self.evicted += 1
            conn = self.open.pop(victim)
            victim.force_close()
            conn.transport.close()
        self.open[handler] = _Conn(transport, time.monotonic())

    def connection_lost(self, handler: web.RequestHandler, exc: BaseException | None = None) -> None:
        self.open.pop(handler, None)
        self._lost(handler, exc)


CONNECTIONS = web.AppKey("connections", Connections)


def connection_budget(limit: int = MAX_CONNECTIONS) -> int:
    """`limit`, bounded by this process's descriptor limit (raised to its hard limit first) less FD_RESERVE."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(64, min(limit, int(soft) - FD_RESERVE))


async def start_http(app: web.Application, host: str, port: int, *, header_timeout_s: float = HEADER_TIMEOUT_S,
                     max_connections: int | None = None) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (port 0 picks a free one); returns the runner and the bound port.

    aiohttp's keep-alive timer starts when a connection opens, so `header_timeout_s` closes both a
    connection that never completes its request headers and one idle between requests. The body
    timeout is the server's (`OpenAIServer(body_timeout_s=...)`). `max_connections` (default: MAX_CONNECTIONS
    within the descriptor limit, `connection_budget`) bounds the open connections (`Connections`)."""
    connections = Connections(connection_budget() if max_connections is None else max_connections)
    app[CONNECTIONS] = connections
    # lingering_time: after an early answer (413, 408) aiohttp drains the unread body this long before
    # closing, so the client can read the answer; bounded by the same timeout.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, keepalive_timeout=header_timeout_s,
                           lingering_time=min(2.0, header_timeout_s), logger=_protocol_log)
    await runner.setup()
    assert runner.server is not None
    connections.install(runner.server)
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    server = site._server  # aiohttp exposes no public accessor for the bound port
    sockets = getattr(server, "sockets", None)
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)
