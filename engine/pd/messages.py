"""The control messages between a decode and a prefill it is paired with, per bootstrap room (typed wire
messages, no pickle; with a shared secret each one carries the session's MAC, see bootstrap.seal). These
four are all that cross a pair's control socket (serve/decode.py sends PdClaim and PdAbort, serve/prefill.py
sends PdProgress and PdDone); the handshake's messages are pd/bootstrap.py's, the KV payload pd/transfer.py's.

Flow of one disaggregated request (SGLang's protocol; KV moves over pd/transfer):

    client -> sglang-router: the request; the router adds bootstrap_host/port/room and sends the same body
              to one prefill and one decode at once (HTTP), and answers with decode's response.
    decode  --PdClaim(room, prompt ids, session)--> prefill   (control socket of the prefill named by
              bootstrap_host:bootstrap_port; "send room R's KV to me")
    decode <--PdProgress(queued)-- prefill                    (the claim is held; liveness)
    prefill: its HTTP half of room R is admitted into its Engine (batched, chunked like every request),
             the first token sampled, the prompt's KV + state exported, its pages freed
    decode <--PdProgress(started)-- prefill                   (both halves present, compute under way)
    prefill --payload(room R)--> decode's transfer endpoint   (the session's decode; decode checks it
             against the registration and acknowledges; its header carries the room's PrefillResult);
             prefill's HTTP half answers with token 1
    decode <--PdDone(error)-- prefill                         (only on failure: the HTTP half never came
             within transfer.timeout_s, the prompts differ, the transfer failed, the room is claimed
             twice, the session is unknown, too many claims wait)
    decode --PdAbort(room)--> prefill                         (the client went away before the KV came)

Each request's `req_id` is its room; every receive has a timeout on the receiving side.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from specctl.engine.pd.wire import Message

MAX_RNG_STATE_BYTES = 1 << 16  # a torch generator's state is a few KiB (CPU) or 16 bytes (CUDA)
_Seconds = Annotated[float, msgspec.Meta(ge=0.0)]


class PdClaim(Message, tag="pd.claim", frozen=True):
    """decode -> prefill: decode holds the HTTP half of `req_id` (the room) and wants its KV + state."""

    req_id: str
    prompt_ids: list[int]
    pairing_id: str  # the session this decode holds; a prefill that restarted refuses stale ids


class PdProgress(Message, tag="pd.progress", frozen=True):
    """prefill -> decode: liveness of one room. `queued` once prefill holds the claim, `started` when both
    halves are present and compute begins; decode's transfer timeout counts from there."""

    req_id: str
    stage: str  # "queued" | "started"


class PdDone(Message, tag="pd.done", frozen=True):
    """prefill -> decode: room `req_id` failed on prefill, and why (success is the payload itself)."""

    req_id: str
    error: str
    status: int = 0  # an HTTP status for the error when it is the client's to fix (408: the room never came), else 0


class PdAbort(Message, tag="pd.abort", frozen=True):
    """decode -> prefill: stop serving this room (the client went away); prefill drops what it holds."""

    req_id: str
    pairing_id: str
    reason: str = "aborted"


def room_key(room: int) -> str:
    return f"room-{int(room)}"


class PrefillResult(msgspec.Struct, frozen=True, kw_only=True):
    """prefill -> decode, in the header of a room's payload (pd/transfer.py): what decode continues from besides the
    caches. Typed and bounded: a payload whose result does not decode as this struct is refused like any malformed
    header."""

    first_token: Annotated[int, msgspec.Meta(ge=0)]  # sampled by prefill; decode applies the stop conditions
    # the request's random stream after that sample (a torch generator state); None for greedy requests
    rng_state: Annotated[bytes, msgspec.Meta(max_length=MAX_RNG_STATE_BYTES)] | None = None
    draft_length: Annotated[int, msgspec.Meta(ge=0)] = 0  # tokens the draft.* components hold (0: none)
    queue_s: _Seconds = 0.0  # arrival on prefill -> the start of the step that prefilled it
    compute_s: _Seconds = 0.0  # that step's duration
    sent_at: float = 0.0  # prefill's wall clock (time.time()) when the payload was handed to the transfer
