"""Engine: the offline generation loop (Scheduler -> ModelRunner / Decoder -> stop conditions).

Contract:
- `Engine(config)` builds the ModelRunner, a Scheduler over its cache verbs, and a Decoder chosen by
  `config.speculative` (`PlainDecoder` for `algorithm: none`, else
  `specctl.engine.speculative.decoder.SpeculativeDecoder(runner, config)`).
- `add_request(prompt | ids, params: SamplingParams) -> rid`; `step() -> [Sequence]` runs one scheduling step and
  returns the sequences that got tokens or finished in it; `generate(prompts, params)` runs to
  completion and returns `GenerationResult`s in prompt order; `abort(rid)`; `stats()`.
- A request that can never fit the KV pool, or whose batch hit an engine error, finishes with
  `finish_reason == "error"` and a message in `.error`; other requests carry on.

The Decoder seam (speculative decoding plugs in here; every decoder implements all of it):
- `decode(seqs) -> list[list[int]]`: at least one new token per sequence. Invariant before and
  after: `runner.cached_len(rid) == len(seq) - 1` (the newest token is not cached yet). The engine
  appends the returned tokens one by one through the stop conditions; a stop mid-way discards the rest.
- `lookahead: int`: cache slots per sequence one `decode()` may write beyond the cached length; the
  scheduler guarantees that capacity before calling `decode()`.
- `release(seq)`: the sequence left the running set (finished, aborted or preempted for recompute);
  free any per-request state the decoder keeps (e.g. draft-model caches).
- `stats() -> dict | None`: decoder-level statistics (acceptance histogram, step switches); None for
  plain decoding.
- `draft_runner`: the draft model's runner (None without a draft model); `export_draft(seq)` /
  `import_draft(seq, tensors, length)` hand the draft cache over in PD (None / a no-op without one: decode
  then rebuilds the draft cache from the tokens).

The decode hot path is one batched forward for all running sequences, one on-device sampling call
and one host transfer of the sampled ids per step.
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from specctl.engine.config import EngineConfig
from specctl.engine.logprobs import attach as attach_logprobs
from specctl.engine.model_runner import ForwardItem, runner_for
from specctl.engine.penalties import adjust as adjust_logits
from specctl.engine.prefill_export import PrefillExport
from specctl.engine.sampling import make_generator, sample
from specctl.engine.sampling_params import SamplingParams
from specctl.engine.scheduler import Batch, PrefillChunk, Scheduler
from specctl.engine.sequence import Sequence, SequenceStatus
from specctl.engine.speculative.decoder import SpeculativeDecoder
from specctl.engine.tokenizer import prompt_token_ids
from specctl.errors import InvalidInput, RuntimeFailure

if TYPE_CHECKING:
    from specctl.engine.model_runner import ModelRunner

log = logging.getLogger(__name__)


class Decoder(Protocol):
    """The seam speculative decoding plugs into (module docstring)."""

    @property
    def lookahead(self) -> int: ...
    @property
    def draft_runner(self) -> ModelRunner | None: ...
    def decode(self, seqs: list[Sequence]) -> list[list[int]]: ...
    def release(self, seq: Sequence) -> None: ...
    def stats(self) -> dict[str, Any] | None: ...
    def export_draft(self, seq: Sequence) -> tuple[dict[str, torch.Tensor], int] | None: ...
    def import_draft(self, seq: Sequence, tensors: dict[str, torch.Tensor], length: int) -> None: ...


DEFAULT_PARAMS = SamplingParams()


class PlainDecoder:
    """One token per sequence per step: one batched forward, one batched sample."""

    lookahead = 1
    draft_runner = None  # no draft model

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def decode(self, seqs: list[Sequence]) -> list[list[int]]:
        items = [ForwardItem(s.rid, (s.last_token,), len(s) - 1) for s in seqs]
        logits = self.runner.forward(items)
        ids = sample(adjust_logits(seqs, logits), [s.params for s in seqs], [s.generator for s in seqs]).tolist()
        attach_logprobs(seqs, logits, ids)
        return [[t] for t in ids]

    def release(self, seq: Sequence) -> None:
        pass

    def stats(self) -> None:
        return None

    def export_draft(self, seq: Sequence) -> None:
        return None

    def import_draft(self, seq: Sequence, tensors: dict[str, torch.Tensor], length: int) -> None:
        pass


@dataclass(frozen=True)
class GenerationResult:
    rid: int
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "error" | "abort"
    error: str | None
    prompt_token_ids: list[int]
    timing: dict[str, float | None]  # ttft_s, total_s, tokens_per_s, decode_tokens_per_s
    spec: dict[str, Any] = field(default_factory=dict)  # acceptance statistics; empty for plain decoding
    num_preemptions: int = 0

    @classmethod
    def from_sequence(cls, seq: Sequence) -> GenerationResult:
        return cls(
            rid=seq.rid,
            text=seq.text,
            token_ids=list(seq.output_ids),
            finish_reason=seq.finish_reason or "error",
            error=seq.error,
            prompt_token_ids=list(seq.prompt_ids),
            timing=seq.timing(),
            spec=seq.spec_stats(),
            num_preemptions=seq.num_preemptions,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rid": self.rid,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "num_prompt_tokens": len(self.prompt_token_ids),
            "num_output_tokens": len(self.token_ids),
            "timing": self.timing,
            "speculative": self.spec,
            "num_preemptions": self.num_preemptions,
        }


def make_decoder(config: EngineConfig, runner: ModelRunner) -> Decoder:
    if config.algorithm == "none":
        return PlainDecoder(runner)
    return SpeculativeDecoder(runner, config)


@functools.cache
def freeze_startup_heap() -> None:
    """Once per process, after the first engine is built: collect, then move every object alive (torch's
    modules, the model, the tokenizer: ~285,000 tracked objects) out of the cyclic collector's reach
    (`gc.freeze`). They live as long as the process anyway, and each full collection walked all of them:
    13% of a batch-8 verify's CPU time here (3,130 vs 2,715 us, interleaved). Objects made later are
    collected as before."""
    gc.collect()
    gc.freeze()


class Engine:
    def __init__(self, config: EngineConfig, *, runner: ModelRunner | None = None,
                 decoder: Decoder | None = None) -> None:
        self.config = config
        if runner is None:
            runner = runner_for(config)
        self.runner = runner
        self.tokenizer = runner.tokenizer
        self.decoder = decoder if decoder is not None else make_decoder(config, runner)
        self.scheduler = Scheduler(
            runner,
            page_size=config.page_size,
            max_batch_size=config.max_batch_size,
            max_prefill_tokens=config.max_prefill_tokens,
            lookahead=self.decoder.lookahead,
        )
        self._rids = itertools.count()
        self._seqs: dict[int, Sequence] = {}  # unfinished requests by rid
        self._finished_outside_step: list[Sequence] = []  # reported by the next step()
        self._counters = {"steps": 0, "prefill_tokens": 0, "decode_steps": 0, "generated_tokens": 0, "finished": 0}
        self._busy_s = 0.0
        self._step_start = time.monotonic()  # of the step under way (prefill exports' timings)
        freeze_startup_heap()

    # -- requests ------------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | Seq[int],
        params: SamplingParams = DEFAULT_PARAMS,
        *,
        export_after_prefill: bool = False,
    ) -> int:
        """Queue a request; returns its rid. Text is tokenized here; ids are taken as they are.

        `export_after_prefill` (PD prefill role): once the prompt is cached and the first token sampled,
        the request's caches, first token, random stream and prefill timings are exported into
        `seq.exported` (a `PrefillExport`) and it finishes with reason "prefilled", freeing its pages;
        the step() that does this returns it."""
        prompt_text = prompt if isinstance(prompt, str) else None
        ids = prompt_token_ids(self.tokenizer, prompt)
        vocab = self.runner.facts.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise InvalidInput(f"prompt token ids must be in [0, {vocab})")
        rid = next(self._rids)
        seq = Sequence(rid, ids, params, tokenizer=self.tokenizer, prompt_text=prompt_text)
        seq.generator = make_generator(params, self.runner.device)
        seq.export_after_prefill = export_after_prefill
        if self.scheduler.add(seq):
            self._seqs[rid] = seq
        else:
            self._counters["finished"] += 1
            self._finished_outside_step.append(seq)
        return rid

    def add_imported(
        self,
        prompt_ids: Seq[int],
        first_token: int,
        tensors: dict[str, torch.Tensor],
        params: SamplingParams = DEFAULT_PARAMS,
        *,
        generator_state: torch.Tensor | bytes | None = None,
        draft_tensors: dict[str, torch.Tensor] | None = None,
        draft_length: int = 0,
    ) -> Sequence:
        """Admit a request prefilled elsewhere (PD decode role) and return its Sequence.

        `tensors` come from the prefill side's `runner.export_request` with the prompt cached;
        `first_token` is the token prefill sampled (it goes through the stop conditions here, so the
        request may come back already finished; the next step() reports it). `generator_state`
        continues prefill's random stream (a generator state, or `PrefillExport.rng_state`).
        `draft_tensors` (the draft model's export, `draft_length` tokens) are handed to the decoder's
        `import_draft(seq, tensors, length)`; without it the drafter rebuilds its cache from
        the tokens. The request joins the running batch at once; RuntimeFailure when it can never fit,
        or the batch or pool has no room (nothing is left allocated then)."""
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise InvalidInput("an imported request needs its prompt ids")
        sched = self.scheduler
        need = len(ids) + params.max_tokens + sched.lookahead - 1
        if self.runner.pages_needed(need) > self.runner.num_total_pages:
            raise RuntimeFailure(
                f"request needs {len(ids)} prompt + {params.max_tokens} new tokens, more than the decode KV pool "
                f"holds ({self.runner.num_total_pages} pages of {self.config.page_size})",
                hint="lower max_tokens or raise cache.max_tokens",
            )
        if len(sched.running) >= sched.max_batch_size:
            raise RuntimeFailure(f"decode is at serve.max_batch_size={sched.max_batch_size} running requests")
        rid = next(self._rids)
        seq = Sequence(rid, ids, params, tokenizer=self.tokenizer)
        seq.generator = make_generator(params, self.runner.device)
        if seq.generator is not None and generator_state is not None:
            if isinstance(generator_state, bytes):
                generator_state = torch.frombuffer(bytearray(generator_state), dtype=torch.uint8)
            seq.generator.set_state(generator_state)
        self.runner.import_request(rid, tensors, len(ids))  # allocates; raises on a layout mismatch
        try:
            if draft_tensors:
                self.decoder.import_draft(seq, draft_tensors, draft_length)
            seq.num_cached = len(ids)
            seq.status = SequenceStatus.RUNNING
            sched.running.append(seq)
            self._seqs[rid] = seq
            self._append(seq, [int(first_token)])
            if seq.is_finished:
                self._finished_outside_step.append(seq)
        except BaseException:
            self.runner.free(rid)
            self.decoder_release(seq)
            if seq in sched.running:
                sched.running.remove(seq)
            self._seqs.pop(rid, None)
            raise
        return seq

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a text prompt (`tokenizer.prompt_token_ids`: BOS + the text's ids)."""
        return prompt_token_ids(self.tokenizer, text)

    def abort(self, rid: int) -> bool:
        """Stop a request now (finish_reason "abort"); False if it is unknown or already finished."""
        seq = self.scheduler.abort(rid)
        if seq is None:
            return False
        self._release(seq)
        self._finished_outside_step.append(seq)
        return True

    def has_unfinished(self) -> bool:
        return bool(self._seqs or self._finished_outside_step)

    # -- the loop ------------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """One scheduling step; the sequences that got tokens or finished in it."""
        t0 = time.perf_counter()
        self._step_start = time.monotonic()
        updated, self._finished_outside_step = self._finished_outside_step, []
        batch = self.scheduler.schedule()
        for seq in batch.preempted:
            self.decoder_release(seq)
        for seq in batch.failed:
            self._done(seq)
            updated.append(seq)
        if batch.decode:
            self._run(self._decode, batch.decode, batch, updated)
        if batch.prefill:
            self._run(self._prefill, [c.seq for c in batch.prefill], batch, updated)
        self._counters["steps"] += 1
        self._busy_s += time.perf_counter() - t0
        end = time.monotonic()
        for seq in updated:
            if seq.exported is not None and seq.finish_reason == "prefilled":
                seq.exported.compute_s = end - self._step_start
        return updated

    def generate(
        self,
        prompts: str | Seq[str] | Seq[Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        """Run `prompts` (text or token ids) to completion; results in the same order."""
        items: list[str | Seq[int]]
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            items = [cast("str | Seq[int]", prompts)]  # one prompt: text, or token ids
        else:
            items = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or DEFAULT_PARAMS] * len(items)
        if len(params) != len(items):
            raise InvalidInput(f"{len(items)} prompts but {len(params)} sampling params")
        rids = [self.add_request(p, sp) for p, sp in zip(items, params, strict=True)]
        results: dict[int, Sequence] = {}
        wanted = set(rids)
        while wanted - results.keys():
            for seq in self.step():
                if seq.is_finished and seq.rid in wanted:
                    results[seq.rid] = seq
        return [GenerationResult.from_sequence(results[r]) for r in rids]

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "num_waiting": len(self.scheduler.waiting),
            "num_running": len(self.scheduler.running),
            "free_pages": self.runner.num_free_pages,
            "total_pages": self.runner.num_total_pages,
            "page_size": self.config.page_size,
            "preemptions": self.scheduler.num_preemptions,
            "busy_s": self._busy_s,
            "allocator": self.runner.allocator.to_json(),
            **self._counters,
        }
        decoder_stats = self.decoder.stats()
        if decoder_stats is not None:
            out["speculative"] = decoder_stats
        return out

    # -- phases --------------------------------------------------------------------------------
    def _run(self, phase: Callable[[Batch, list[Sequence]], None], seqs: list[Sequence], batch: Batch,
             updated: list[Sequence]) -> None:
        # An engine failure in one batch fails those requests clearly instead of killing the loop.
        try:
            phase(batch, updated)
        except (AssertionError, KeyboardInterrupt):
            raise
        except Exception as exc:
            log.exception("engine step failed")
            for seq in seqs:
                if not seq.is_finished:
                    self.scheduler.finish(seq, "error", f"engine error: {type(exc).__name__}: {exc}")
                    self._done(seq)
                    updated.append(seq)

    def _prefill(self, batch: Batch, updated: list[Sequence]) -> None:
        chunks: list[PrefillChunk] = batch.prefill
        items = [ForwardItem(c.seq.rid, c.seq.token_ids(c.start, c.end), c.start) for c in chunks]
        logits = self.runner.forward(items, last_only=True)  # [len(chunks), vocab]: only last positions sample
        self._counters["prefill_tokens"] += sum(c.end - c.start for c in chunks)
        # Requests whose prompt is now fully cached and that have no token yet sample their first one
        # from the logits of the prompt's last position (a recompute after preemption samples nothing).
        rows, firsts = [], []
        for i, c in enumerate(chunks):
            c.seq.num_cached = c.end
            if c.completes:
                c.seq.status = SequenceStatus.RUNNING
                if not c.seq.output_ids:
                    rows.append(i)
                    firsts.append(c.seq)
        if not firsts:
            return
        last = logits[torch.tensor(rows, device=logits.device)]
        ids = sample(adjust_logits(firsts, last), [s.params for s in firsts], [s.generator for s in firsts]).tolist()
        attach_logprobs(firsts, last, ids)
        for seq, tok in zip(firsts, ids, strict=True):
            self._append(seq, [tok])
            if seq.export_after_prefill and not seq.is_finished:
                # PD prefill: ship the prompt's caches with the first token; decode continues elsewhere.
                state = None if seq.generator is None else bytes(seq.generator.get_state().cpu().numpy().tobytes())
                seq.exported = PrefillExport(self.runner.export_request(seq.rid), len(seq.prompt_ids), int(tok),
                                             rng_state=state, queue_s=max(0.0, self._step_start - seq.arrival_time))
                self.scheduler.finish(seq, "prefilled")
                self._done(seq)
            updated.append(seq)

    def _decode(self, batch: Batch, updated: list[Sequence]) -> None:
        seqs = batch.decode
        new_tokens = self.decoder.decode(seqs)
        if len(new_tokens) != len(seqs):
            raise RuntimeFailure(f"decoder returned {len(new_tokens)} token lists for {len(seqs)} sequences")
        self._counters["decode_steps"] += 1
        for seq, toks in zip(seqs, new_tokens, strict=True):
            self._append(seq, toks)
            updated.append(seq)

    def _append(self, seq: Sequence, tokens: list[int]) -> None:
        eos = None if seq.params.ignore_eos else self.tokenizer.eos_token_id
        pending, seq.pending_logprobs = seq.pending_logprobs, None
        for j, tok in enumerate(tokens):
            self._counters["generated_tokens"] += 1
            reason = seq.append(tok, eos, pending[j] if pending is not None and j < len(pending) else None)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self._done(seq)
                return

    def _done(self, seq: Sequence) -> None:
        self._release(seq)
        self._counters["finished"] += 1

    def _release(self, seq: Sequence) -> None:
        self._seqs.pop(seq.rid, None)
        self.decoder_release(seq)

    def decoder_release(self, seq: Sequence) -> None:
        self.decoder.release(seq)
