"""SGLang's native HTTP surface on a specctl serving process, beside the OpenAI routes of serve/http.py.

Contract: `add_sglang_routes(server)` registers, on an `OpenAIServer`'s app,

- `GET /model_info`: `model_path` and `tokenizer_path` as local directories (sglang-router loads its tokenizer
  from `model_path`; SGLang's bench_serving and transformers' AutoTokenizer load `tokenizer_path`, a directory
  holding only the tokenizer files, so no hub is ever asked), `is_generation`, `served_model_name`.
- `GET /get_load`: `[{"dp_rank": 0, "num_reqs", "num_waiting_reqs", "num_tokens"}]` (sglang-router's
  load-aware policies poll it).
- `POST /generate`: SGLang's native request (`text` or `input_ids`, `sampling_params` with
  `max_new_tokens`, `temperature`, `top_p`, `top_k`, `stop`, `ignore_eos`, `seed`; `stream`), answered with
  `{"text", "output_ids", "meta_info"}`; `meta_info` carries `id`, `finish_reason` (`{"type": ...}`),
  `prompt_tokens`, `completion_tokens`, the request's speculative statistics in SGLang's keys
  (serve/spec_stats.py: `spec_verify_ct`, `spec_num_correct_drafts`, `spec_accept_length`,
  `spec_correct_drafts_histogram`, ...; specctl's `spec_accept_lengths` per verify), SGLang's request times
  and `timings`. With `SPECCTL_EXPORT_METRICS_TO_FILE_DIR` set (`specctl serve --export-metrics-to-file-dir`)
  every finished request is appended to SGLang's metrics file there (`spec_stats.MetricsFile`).
  Streaming (`stream: true`) sends the cumulative text in each `data:` chunk, as SGLang does, then `[DONE]`;
  the text grows through the incremental detokenizer (engine/detokenizer.py), never a re-decode of the whole
  output, and the last chunk's text is the engine's own (cut at a stop string), as the unary answer's is.
- `GET /v1/models/{id}`, `POST /tokenize` (`{"prompt"}` -> `{"tokens", "count", "max_model_len"}`),
  `POST /detokenize` (`{"tokens"}` -> `{"text"}`).

`/server_info` keeps its route in serve/http.py; the backends put SGLang's keys in it
(`specctl.schemas.server_info.sglang_server_args`, the one list of its keys).
The PD fields sglang-router adds to every request (`bootstrap_host`, `bootstrap_port`, `bootstrap_room`) are
read by `openai_request.pd_route`; both the OpenAI and the native routes pass them to `Backend.generate` as its
`route`, beside the request's `SamplingParams`. Every malformed request is a 4xx JSON error.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from specctl.engine.detokenizer import Detokenizer
from specctl.engine.serve.http import json_error
from specctl.engine.serve.openai_request import PdRoute, RequestError, _check_ids, pd_route, sampling_params
from specctl.engine.serve.spec_stats import RequestClock, request_meta
from specctl.schemas.server_info import model_paths

if TYPE_CHECKING:
    from specctl.engine.async_engine import RequestOutput
    from specctl.engine.sampling_params import SamplingParams
    from specctl.engine.serve.http import OpenAIServer



def native_body(body: dict[str, Any]) -> dict[str, Any]:
    """SGLang's `sampling_params` as the OpenAI fields `sampling_params()` understands."""
    sp = body.get("sampling_params")
    sp = {} if sp is None else sp
    if not isinstance(sp, dict):
        raise RequestError("sampling_params must be an object", param="sampling_params")
    out: dict[str, Any] = {k: sp[k] for k in ("temperature", "top_p", "top_k", "stop", "ignore_eos", "seed")
                           if sp.get(k) is not None}
    if sp.get("max_new_tokens") is not None:
        out["max_tokens"] = sp["max_new_tokens"]
    if out.get("top_k") == -1:
        out["top_k"] = 0  # SGLang's "no top-k"
    return out


def meta_info(rid: str, prompt_len: int, out: list[int], final: RequestOutput | None, *, launch: int | None = None,
              received_ts: float | None = None, first_token_latency: float | None = None,
              e2e_latency: float | None = None) -> dict[str, Any]:
    """SGLang's `meta_info` of one (cumulative) chunk; a finished request's carries SGLang's speculative keys
    (`spec_stats.request_meta`) and specctl's `timings`."""
    if final is None:
        return {"id": rid, "finish_reason": None, "prompt_tokens": prompt_len, "completion_tokens": len(out)}
    meta = request_meta(rid, prompt_tokens=prompt_len, completion_tokens=len(out), finish_reason=final.finish_reason,
                        accepts=final.accept_lengths, launch=launch, received_ts=received_ts,
                        first_token_latency=first_token_latency, e2e_latency=e2e_latency)
    meta["timings"] = final.timings
    if final.error:
        meta["error"] = final.error
    return meta


class SglangRoutes:
    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        self.backend = server.backend

    async def model_info(self, request: web.Request) -> web.Response:
        model_path, tok_path = model_paths(self.backend.model_name)
        return web.json_response({"model_path": model_path, "tokenizer_path": tok_path, "is_generation": True,
                                  "served_model_name": self.backend.model_name, "has_image_understanding": False,
                                  "has_audio_understanding": False, "preferred_sampling_params": None})

    async def server_info(self, request: web.Request) -> web.Response:
        return await self.server.server_info(request)  # SGLang serves both names

    async def get_load(self, request: web.Request) -> web.Response:
        info = self.backend.load_info()
        return web.json_response([{"dp_rank": 0, "num_reqs": int(info.get("num_reqs", self.server.in_flight)),
                                   "num_waiting_reqs": int(info.get("num_waiting_reqs", 0)),
                                   "num_tokens": int(info.get("num_tokens", 0))}])

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self.server._body(request)
        prompt = body.get("prompt", body.get("text"))
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string", param="prompt")
        ids = self.backend.encode(prompt) if body.get("add_special_tokens", True) else \
            self.backend.loaded_tokenizer().encode(prompt)
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.backend.max_context})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self.server._body(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise RequestError("tokens must be a list of token ids", param="tokens")
        return web.json_response({"text": self.backend.decode(ids)})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self.server._body(request)
        unavailable = self.server._unavailable()
        if unavailable is not None:
            return unavailable
        if body.get("input_ids") is not None:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not ids:
                raise RequestError("input_ids must be a non-empty list of token ids", param="input_ids")
            # In the vocabulary, as the OpenAI routes check: the engine refuses others, which would be a 503.
            ids = _check_ids(ids, self.server._vocab_size(), "input_ids")
        else:
            text = body.get("text")
            if not isinstance(text, str) or not text:
                raise RequestError("text (or input_ids) must be a non-empty string", param="text")
            ids = self.backend.encode(text)
        try:
            params = sampling_params(native_body(body), prompt_len=len(ids), max_context=self.backend.max_context,
                                     max_new_tokens=self.backend.max_new_tokens)
        except RequestError as exc:  # name the field as this request spelled it, not its OpenAI translation
            prompt = "input_ids" if body.get("input_ids") is not None else "text"
            exc.param = {"prompt": prompt, "messages": prompt, "max_tokens": "sampling_params.max_new_tokens",
                         None: None}.get(exc.param, f"sampling_params.{exc.param}")
            raise
        route = pd_route(body)
        self.backend.check_params(params, route)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream must be a boolean", param="stream")
        rid = uuid.uuid4().hex
        self.server.in_flight += 1
        try:
            if stream:
                return await self._stream(request, ids, params, route, rid)
            return await self._unary(ids, params, route, rid)
        finally:
            self.server.in_flight -= 1

    async def _unary(self, ids: list[int], params: SamplingParams, route: PdRoute | None, rid: str) -> web.Response:
        clock = RequestClock()
        out: list[int] = []
        final = None
        async for item in self.backend.generate(ids, params, route=route, stream=False):
            clock.tokens(item.token_ids)
            out.extend(item.token_ids)
            if item.finished:
                final = item
                break
        if final is None or final.finish_reason == "error":
            code = (final.error_status if final else None) or 503
            self.server.metrics.http_errors.inc(code=str(code))
            return json_error((final.error if final else None) or "generation ended without a result", status=code)
        meta = self.server.finished_meta(rid, len(ids), len(out), final, clock, params, route)
        text = final.text if final.text is not None else self.backend.decode(out)
        return web.json_response({"text": text, "output_ids": out, "meta_info": meta})

    async def _stream(self, request: web.Request, ids: list[int], params: SamplingParams, route: PdRoute | None,
                      rid: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        clock = RequestClock()
        out: list[int] = []
        # The one incremental detokenizer, as the OpenAI stream uses it: O(window) work per token, and the tail
        # a stop string may still cut is held back until the engine's final text decides it.
        detok = Detokenizer(self.backend, holdback=max((len(x) for x in params.stop), default=1) - 1)
        text = ""
        async for item in self.backend.generate(ids, params, route=route):
            clock.tokens(item.token_ids)
            out.extend(item.token_ids)
            final = item if item.finished else None
            if final is not None and final.finish_reason == "error":
                err = {"error": {"message": final.error or "generation failed", "type": "server_error"}}
                await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                break
            text += detok.push(item.token_ids, final=final is not None, final_text=item.text)
            meta = (meta_info(rid, len(ids), out, None) if final is None
                    else self.server.finished_meta(rid, len(ids), len(out), final, clock, params, route))
            chunk = {"text": text, "output_ids": list(out), "meta_info": meta}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if final is not None:
                break
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def add_sglang_routes(server: OpenAIServer) -> None:
    routes = SglangRoutes(server)
    server.app.add_routes([
        web.get("/model_info", routes.model_info),
        web.get("/get_model_info", routes.model_info),
        web.get("/get_server_info", routes.server_info),
        web.get("/get_load", routes.get_load),
        web.post("/generate", routes.generate),
        web.post("/tokenize", routes.tokenize),
        web.post("/detokenize", routes.detokenize),
    ])
