"""PrefillBackend: the prefill role of a disaggregated deployment.

Contract:
- Loads the target ModelRunner (and the draft's, when `speculative.algorithm == "draft"`: decode then
  continues from draft KV that prefill produced), builds its RegistrationInfo from the live layouts,
  and serves W's bootstrap endpoint on `bootstrap_port`; the registration advertises this process's
  ZMQ control endpoint (`endpoints["control"]`) where the paired decode sends `PdPrefill`.
- Per request: allocate, forward the prompt (target, then draft), sample token 1 with the request's own
  generator, export KV + state (+ draft KV), push it with `TransferSender` to decode's transfer endpoint
  (the transfer `extra` carries the first token, the generator state and prefill timings), wait for the
  ack, free. Every failure (send error, ack timeout, decode gone, abort, stale pairing) frees the pages
  and, where decode can still hear it, answers `PdPrefillDone(ok=False, error)`.
- All runner work runs on one compute thread (the runner is not thread-safe); sends run on one sender
  thread (W's sender is single-threaded). Liveness, not queueing, is what decode times: each request is
  acknowledged at once (`PdPrefillProgress(queued)`) and reported again when its compute starts
  (`started`); decode's transfer timeout counts from there. /health is 200 once the model is loaded and the bootstrap
  endpoint listens (`paired` in the body says whether a decode registered).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from specctl.engine import wire
from specctl.engine.async_engine import RequestOutput
from specctl.engine.metrics import ServingMetrics
from specctl.engine.pd_protocol import PdPrefill, PdPrefillDone, PdPrefillProgress, serve_requests
from specctl.engine.roles import RoleContext, encode_prompt, max_context_of, model_name_of, sampling_params_of

log = logging.getLogger("specctl.prefill")

# Test-only fault injection: hold each request's pages this long between export and send, so a test
# can kill decode "in the middle of a transfer" deterministically. Never set in production.
HOLD_ENV = "SPECCTL_TEST_PREFILL_HOLD_S"
# Test-only fault injection: a request whose prompt contains this marker has its components sent in
# reverse order, so a test can check that decode rejects a payload breaking the registration.
CORRUPT_ENV = "SPECCTL_TEST_PREFILL_CORRUPT"


def export_with_draft(runner: Any, draft_runner: Any | None, rid: int) -> dict[str, Any]:
    tensors = dict(runner.export_request(rid))
    if draft_runner is not None:
        tensors.update({f"draft.{k}": v for k, v in draft_runner.export_request(rid).items()})
    return tensors


class _FirstToken:
    """The request as engine/penalties.py sees it when prefill samples its first token: no output yet."""

    def __init__(self, params: Any) -> None:
        self.params = params
        self.output_ids: list[int] = []


class PrefillBackend:
    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx
        self.model_name = model_name_of(ctx.role)
        self.max_context = max_context_of(self.model_name)
        self.runner: Any = None
        self.draft_runner: Any = None
        self.tokenizer: Any = None
        self.bootstrap: Any = None
        self.info: Any = None
        self._compute = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="specctl-prefill")
        self._send_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="specctl-send")
        self._sender: Any = None
        self._sender_endpoint: str | None = None
        self._peer_endpoint: str | None = None
        self._peer_lock = threading.Lock()
        self._zctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._tasks: dict[str, asyncio.Task] = {}
        self._bg: list[asyncio.Task] = []
        self._rids = itertools.count(1)
        self.completed = 0
        self.failed = 0
        self.compute_s = 0.0
        self.transfer_s = 0.0
        self.baseline_free_pages = 0

    # lifecycle ------------------------------------------------------------------------------------
    async def load(self) -> None:
        from specctl.engine.bootstrap import BootstrapServer
        from specctl.engine.config import EngineConfig
        from specctl.engine.registration import build_registration

        cfg = EngineConfig.from_role(self.ctx.role)
        self.config = cfg
        self._slots = asyncio.Semaphore(cfg.max_batch_size)
        self.runner, self.draft_runner = await asyncio.get_running_loop().run_in_executor(
            self._compute, _load_runners, cfg)
        self.tokenizer = self.runner.tokenizer
        self.baseline_free_pages = int(self.runner.num_free_pages)
        host = str(self.ctx.role.get("host") or "127.0.0.1")
        self._sock = self._zctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.bind(f"tcp://{host}:0")
        control = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        backend = str(self.ctx.transfer.get("backend", "zmq"))
        self.info = build_registration(
            "prefill", self.runner.layout(), speculative=cfg.speculative,
            draft_layout=self.draft_runner.layout() if self.draft_runner is not None else None,
            transfer_backend=backend, endpoints={"control": control}, facts=self.runner.facts,
            draft_facts=self.draft_runner.facts if self.draft_runner is not None else None,
        )  # fmt: skip
        from specctl.engine.transfer import PayloadSpec

        # Components go out in the order the registration fixes; decode checks each payload against it.
        self._component_order = PayloadSpec.from_registration(self.info).names
        bport = self.ctx.role.get("bootstrap_port")
        if bport is None:
            from specctl.errors import UsageError

            raise UsageError("the prefill role needs roles.prefill.bootstrap_port (decode registers there)")
        self.bootstrap = BootstrapServer(self.info, host=host, port=int(bport), secret=_secret(self.ctx),
                                         on_pair=self._on_pair).start()
        self._bg.append(asyncio.create_task(self._control_loop()))
        self.ctx.state.extra.update({"bootstrap_endpoint": self.bootstrap.endpoint, "control_endpoint": control,
                                     "fingerprint": self.info.fingerprint(), "paired": False})
        self.ctx.state.set("ready", ready=True)
        log.info("prefill ready: bootstrap %s, control %s, fingerprint %s", self.bootstrap.endpoint, control,
                 self.info.fingerprint())

    def _on_pair(self, peer: Any) -> None:
        endpoint = peer.info.endpoints.get("transfer")
        if not endpoint:
            raise ValueError("decode advertised no transfer endpoint")
        with self._peer_lock:
            self._peer_endpoint = endpoint
        self.ctx.state.extra["paired"] = True
        self.ctx.state.extra["peer"] = {"generation": peer.generation, "transfer": endpoint,
                                        "fingerprint": peer.info.fingerprint()}
        log.info("paired with decode (generation %d, transfer endpoint %s)", peer.generation, endpoint)

    async def close(self) -> None:
        for t in list(self._tasks.values()) + self._bg:
            t.cancel()
        for t in list(self._tasks.values()) + self._bg:
            with contextlib.suppress(BaseException):
                await t
        if self.bootstrap is not None:
            await asyncio.to_thread(self.bootstrap.stop)
        await asyncio.get_running_loop().run_in_executor(self._send_pool, self._close_sender)
        self._send_pool.shutdown(wait=False)
        self._compute.shutdown(wait=False)
        if self._sock is not None:
            self._sock.close(linger=0)
        self._zctx.destroy(linger=0)

    # Backend protocol (prefill serves no completions itself) --------------------------------------
    def encode(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def health(self) -> tuple[bool, dict[str, Any]]:
        return self.ctx.state.health()

    async def generate(self, prompt_ids: list[int], params: dict[str, Any]) -> AsyncIterator[RequestOutput]:
        yield RequestOutput([], True, "error", "this is the prefill role: send requests to the router")

    async def server_info(self) -> dict[str, Any]:
        info = self.ctx.base_info()
        info["fingerprints"] = {"registration": self.info.fingerprint() if self.info else None,
                                "target": (self.info.model.weights_hash if self.info else None),
                                "draft": (self.info.draft.model.weights_hash if self.info and self.info.draft
                                          else None)}
        info["registration"] = self.info.to_json() if self.info else None
        info["pool"] = await self._pool()
        info["in_flight"] = len(self._tasks)
        info["bootstrap"] = vars(self.bootstrap.stats) if self.bootstrap else None
        info["timing"] = {"completed": self.completed, "failed": self.failed,
                          "mean_compute_s": self.compute_s / self.completed if self.completed else None,
                          "mean_transfer_s": self.transfer_s / self.completed if self.completed else None}
        return info

    async def _pool(self) -> dict[str, int]:
        if self.runner is None:
            return {}

        def read() -> dict[str, int]:
            out = {"free_pages": int(self.runner.num_free_pages), "total_pages": int(self.runner.num_total_pages),
                   "baseline_free_pages": self.baseline_free_pages}
            if self.draft_runner is not None:
                out["draft_free_pages"] = int(self.draft_runner.num_free_pages)
                out["draft_total_pages"] = int(self.draft_runner.num_total_pages)
            return out

        return await asyncio.get_running_loop().run_in_executor(self._compute, read)

    async def refresh_metrics(self, metrics: ServingMetrics) -> None:
        pool = await self._pool()
        if pool:
            metrics.pages_total.set(pool["total_pages"])
            metrics.pages_used.set(pool["total_pages"] - pool["free_pages"])

    # control socket -------------------------------------------------------------------------------
    async def _control_loop(self) -> None:
        assert self._sock is not None
        await serve_requests(self._sock, PdPrefill, self._handle, self._tasks, what="decode")

    async def _reply(self, identity: bytes, msg: PdPrefillDone | PdPrefillProgress) -> None:
        if self._sock is None:
            return
        try:
            await asyncio.wait_for(self._sock.send_multipart([identity, *wire.encode(msg)]), 2.0)
        except (zmq.ZMQError, asyncio.TimeoutError) as exc:
            log.info("could not answer decode for %s: %s", msg.req_id, exc)  # decode is gone

    async def _handle(self, identity: bytes, msg: PdPrefill) -> None:
        loop = asyncio.get_running_loop()
        rid = next(self._rids)
        t_arrival = time.time()
        allocated = acquired = False
        error: str | None = None
        try:
            peer = self.bootstrap.peer if self.bootstrap else None
            if peer is None or peer.session_id != msg.pairing_id:
                raise _Refuse("prefill is not paired with this decode (it restarted); re-register")
            await self._reply(identity, PdPrefillProgress(req_id=msg.req_id, stage="queued"))
            await self._slots.acquire()  # bounded: every held request needs a state slot in the runner
            acquired = True
            allocated = True
            result = await loop.run_in_executor(self._compute, self._prefill_sync, rid, msg,
                                                lambda: loop.call_soon_threadsafe(self._started, identity, msg.req_id))
            hold = float(os.environ.get(HOLD_ENV, "0") or 0)
            if hold > 0:
                await asyncio.sleep(hold)
            extra = {"first_token": result["first_token"], "prefill_s": result["compute_s"],
                     "queue_s": result["started"] - t_arrival, "sent_at": time.time(),
                     "draft_length": result["draft_length"], **result["split"]}
            if result["rng"] is not None:
                extra["rng_state"] = result["rng"]
            sent = await loop.run_in_executor(self._send_pool, self._send_sync, msg.req_id, result["tensors"],
                                              result["length"], extra)
            self.completed += 1
            self.compute_s += result["compute_s"]
            self.transfer_s += sent.seconds
            self.ctx.metrics.transfer_bytes.inc(sent.nbytes, direction="sent")
            self.ctx.metrics.transfer_seconds.observe(sent.seconds)
            self.ctx.metrics.record_prefill(prompt_tokens=len(msg.prompt_ids), compute_s=result["compute_s"])
        except asyncio.CancelledError:
            error = "aborted"
            self.ctx.metrics.transfer_failures.inc(reason="aborted")
            raise
        except _Refuse as exc:
            error = str(exc)
        except Exception as exc:  # transfer error/timeout, runner failure: fail this request only
            error = f"{type(exc).__name__}: {exc}"
            kind = type(exc).__name__
            self.ctx.metrics.transfer_failures.inc(reason=kind)
            log.warning("request %s failed on prefill: %s", msg.req_id, error)
        finally:
            self._tasks.pop(msg.req_id, None)
            if allocated:
                # Free on every path; the compute thread serialises this after any forward in flight.
                await asyncio.shield(loop.run_in_executor(self._compute, self._free_sync, rid))
            if acquired:
                self._slots.release()
            if error is not None:
                self.failed += 1
                if error != "aborted":
                    await self._reply(identity, PdPrefillDone(req_id=msg.req_id, ok=False, error=error))

    def _started(self, identity: bytes, req_id: str) -> None:
        task = asyncio.ensure_future(self._reply(identity, PdPrefillProgress(req_id=req_id, stage="started")))
        self._bg.append(task)
        task.add_done_callback(lambda t: self._bg.remove(t) if t in self._bg else None)

    # compute thread -------------------------------------------------------------------------------
    def _prefill_sync(self, rid: int, msg: PdPrefill, on_start: Any = None) -> dict[str, Any]:
        import torch

        from specctl.engine.model_runner import ForwardItem
        from specctl.engine.penalties import adjust as adjust_logits
        from specctl.engine.sampling import make_generator, sample

        started = time.time()
        if on_start is not None:
            on_start()  # decode's transfer timeout for this request counts from here
        t0 = time.perf_counter()
        params = sampling_params_of(msg.params)
        ids = list(msg.prompt_ids)
        if not ids:
            bos = getattr(self.tokenizer, "bos_token_id", None)
            ids = [bos] if bos is not None else ids
        runner = self.runner
        if not runner.can_allocate(len(ids)):
            raise RuntimeError(f"prefill KV pool full ({runner.num_free_pages} pages free) for {len(ids)} tokens")
        runner.allocate(rid, len(ids))
        logits = runner.forward([ForwardItem(rid, ids, 0)])
        gen = make_generator(params, runner.device)
        # logit_bias applies to the first token too (penalties have no output to count yet): engine/penalties.py
        first = int(sample(adjust_logits([_FirstToken(params)], logits[-1:]), [params], [gen]).tolist()[0])
        t_target = time.perf_counter()
        draft_length = 0
        if self.draft_runner is not None and msg.with_draft:
            # The draft's prefill: decode's drafter continues from this cache instead of recomputing it.
            self.draft_runner.allocate(rid, len(ids))
            self.draft_runner.forward([ForwardItem(rid, ids, 0)])
            draft_length = len(ids)
        t_draft = time.perf_counter()
        exported = export_with_draft(runner, self.draft_runner if draft_length else None, rid)
        tensors = {n: exported[n] for n in self._component_order if n in exported}
        tensors.update({n: t for n, t in exported.items() if n not in tensors})
        marker = os.environ.get(CORRUPT_ENV)
        if marker and marker in self.tokenizer.decode(ids):
            tensors = dict(reversed(list(tensors.items())))
        rng = None
        if gen is not None:
            rng = bytes(gen.get_state().to(torch.uint8).numpy().tobytes())
        done = time.perf_counter()
        return {"first_token": first, "tensors": tensors, "length": len(ids), "draft_length": draft_length,
                "compute_s": done - t0, "started": started, "rng": rng,
                "split": {"prefill_target_s": t_target - t0, "prefill_draft_s": t_draft - t_target,
                          "export_s": done - t_draft}}

    def _free_sync(self, rid: int) -> None:
        self.runner.free(rid)
        if self.draft_runner is not None:
            self.draft_runner.free(rid)

    # sender thread --------------------------------------------------------------------------------
    def _send_sync(self, req_id: str, tensors: dict[str, Any], length: int, extra: dict[str, Any]) -> Any:
        from specctl.engine.transfer import TransferSender

        with self._peer_lock:
            endpoint = self._peer_endpoint
        if endpoint is None:
            raise RuntimeError("no decode is paired")
        if self._sender is None or self._sender_endpoint != endpoint:
            self._close_sender()
            self._sender = TransferSender(endpoint, backend=str(self.ctx.transfer.get("backend", "zmq")),
                                          timeout_s=self.ctx.timeout_s)
            self._sender_endpoint = endpoint
        return self._sender.send(req_id, tensors, length=length, extra=extra)

    def _close_sender(self) -> None:
        if self._sender is not None:
            with contextlib.suppress(Exception):
                self._sender.close()
        self._sender = None


class _Refuse(Exception):
    pass


def _load_runners(cfg: Any) -> tuple[Any, Any]:
    from specctl.engine.device import resolve_device
    from specctl.engine.model_runner import ModelRunner

    device = str(resolve_device(cfg.device))
    kw = dict(dtype=cfg.dtype, device=device, page_size=cfg.page_size, max_tokens=cfg.max_tokens,
              max_requests=cfg.max_batch_size, max_draft_tokens=cfg.max_draft_tokens)
    runner = ModelRunner(cfg.model_ref, **kw)
    draft = None
    if cfg.algorithm == "draft" and cfg.speculative.get("draft"):
        draft = ModelRunner(str(cfg.speculative["draft"]), **kw)
    return runner, draft


def _secret(ctx: RoleContext) -> str | None:
    name = ctx.transfer.get("secret_env")
    if not name:
        return None
    value = os.environ.get(str(name))
    if not value:
        from specctl.errors import UsageError

        raise UsageError(f"transfer.secret_env names ${name}, which is not set in this process's environment")
    return value
