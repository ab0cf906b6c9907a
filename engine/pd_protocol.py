"""The request/token control messages between router, decode and prefill (typed wire messages, no pickle).

Flow of one disaggregated request (KV moves over `engine.transfer`, everything else is these messages):

    router --PdGenerate--> decode --PdPrefill--> prefill      (decode pulls the prompt's KV + state)
    decode <--PdPrefillProgress(queued, then started)-- prefill  (liveness: the timeout measures progress)
    prefill: forward prompt (+ draft), sample token 1, export, send over the transfer backend
    decode <--PdPrefillDone(+ tensors or shm ref)-- prefill,  decode --PdTransferAck--> prefill
    router <--PdTokens...-- decode                           (streamed; the last one has finished=True;
                                                              an empty non-final one is a keepalive)
    router --PdAbort--> decode (client went away); decode --PdAbort--> prefill (prefill frees its pages)

Every receive of these has a timeout on the receiving side; `req_id` ties messages to one request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import zmq

from specctl.engine import wire
from specctl.engine.wire import Message

log = logging.getLogger("specctl.pd")


class PdGenerate(Message):
    """router -> decode: generate for this prompt (ids already tokenized by the router)."""

    req_id: str
    prompt_ids: list[int]
    params: dict[str, Any]


class PdTokens(Message):
    """decode -> router: new tokens of a request; `finished` on the last one."""

    req_id: str
    token_ids: list[int]
    completion_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    accept_lengths: list[int] = []
    timings: dict[str, float] = {}
    text: str | None = None  # decode's final text (cut at a stop string); on the finished message only


class PdAbort(Message):
    """Stop a request and free its pages (router -> decode, decode -> prefill)."""

    req_id: str
    reason: str = "aborted"


class PdPrefill(Message):
    """decode -> prefill: run this prompt and send its KV + state to me."""

    req_id: str
    prompt_ids: list[int]
    params: dict[str, Any]
    pairing_id: str  # the handshake this decode completed; a prefill that restarted refuses stale ids
    with_draft: bool = False


class PdPrefillProgress(Message):
    """prefill -> decode: liveness of one request. `queued` is sent as soon as prefill holds the request,
    `started` when its compute begins; decode's transfer timeout counts from `started` (a queued request
    fails only when prefill as a whole makes no progress for the timeout), so queueing is not a fault."""

    req_id: str
    stage: str  # "queued" | "started"


class PdPrefillDone(Message):
    """prefill -> decode: the first token and the request's exported state (tensors follow as frames,
    or live in shared memory named by `shm_name`)."""

    req_id: str
    ok: bool
    error: str | None = None
    first_token: int = -1
    length: int = 0  # tokens cached on prefill (the prompt)
    draft_length: int = 0
    nbytes: int = 0
    timings: dict[str, float] = {}
    transfer: dict[str, Any] = {}  # backend-specific descriptor (shm segment name, layout of tensors)


class PdTransferAck(Message):
    """decode -> prefill: the transfer landed (or not); prefill may now free its pages."""

    req_id: str
    ok: bool
    error: str | None = None


class PdPing(Message):
    """decode -> prefill liveness probe; the reply names the prefill instance (restarts change it)."""

    pairing_id: str


class PdPong(Message):
    instance_id: str
    paired: bool


async def serve_requests(
    sock: Any,
    request_type: type[Message],
    handle: Callable[[bytes, Any], Awaitable[None]],
    tasks: dict[str, asyncio.Task],
    *,
    what: str,
) -> None:
    """Receive loop of a ROUTER control socket (zmq.asyncio), shared by decode and prefill.

    Each `request_type` message starts `handle(identity, msg)` as a task keyed by its `req_id`; a
    `PdAbort` cancels that task (its handler frees what the request holds); a malformed frame is
    logged and skipped, never fatal. Polls so that cancellation is seen within half a second.
    """
    while True:
        if not await sock.poll(500, zmq.POLLIN):
            continue
        frames = await sock.recv_multipart(copy=False)
        identity = frames[0].bytes
        try:
            env = wire.decode(frames[1:], as_torch=False, expect=(request_type, PdAbort))
        except wire.WireError as exc:
            log.warning("bad message from %s: %s", what, exc)
            continue
        msg = env.msg
        if isinstance(msg, PdAbort):
            task = tasks.get(msg.req_id)
            if task is not None:
                task.cancel()
            continue
        tasks[msg.req_id] = asyncio.create_task(handle(identity, msg))
