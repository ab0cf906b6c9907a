"""SpeculativeDecoder: the engine's Decoder for draft-then-verify decoding with fixed or adaptive steps.

Contract (the engine's `Decoder` seam, engine/engine.py):
- `decode(seqs) -> list[list[int]]`: per sequence, the accepted drafts plus one token chosen by the
  target (>= 1 token). Before and after: `runner.cached_len(rid) == len(seq) - 1` once the engine has
  appended the returned tokens (the verify forward caches up to k + 1 positions; the rejected tail is
  truncated here, per request).
- `lookahead`: cache slots one decode may write per sequence (largest prebuilt steps + 1); the
  scheduler guarantees them before calling `decode`.
- `release(seq)`: the sequence left the running set; the drafter forgets it.
- `stats()`: acceptance histogram, per-bucket steps and EMA, the switch timeline, per-steps batch counts.

What "steps" means. SGLang's reference facts say "steps s run with s + 1 draft tokens": in EAGLE with
topk 1, `num_draft_tokens = num_steps + 1` counts the verify tree's root (the last committed token)
plus the s drafted tokens. We use the same accounting with a separate draft model or n-gram lookup:
steps s = the drafter proposes s tokens (s draft forwards for a draft model) and the target verifies
s + 1 positions (the newest committed token followed by the s proposals) in ONE forward, so a verify
step yields between 1 and s + 1 tokens and the accepted-draft count the policy sees lies in 0..s.
Steps 0 is plain decoding through the same decoder and policy accounting: a 1-position verify with no
drafts is exactly one plain forward + sample, so it runs as that (and costs what plain decoding costs).

Runtime states. Every step the runtime can select (`required_states` of `step_coverage`, the same
function `specctl validate` runs) gets a `RuntimeState` built at start-up: the draft-token, draft-
probability, verify-output and padded-logits buffers sized for `max_batch_size`. The decoder looks the
active step up in that fixed mapping; a step outside it cannot be selected (the policy only returns
candidates, and every candidate of every reachable bucket plus the initial step is in the mapping),
and a switch is a dictionary lookup that allocates nothing. A configuration `validate` rejects (e.g.
an initial step outside the candidates) is refused here with the same finding (RuntimeFailure, exit
3). CUDA graph capture per padded batch size is not implemented; the buffers are what a capture would
bind to.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from specctl.adaptive.trace import TraceWriter
from specctl.engine.logprobs import attach as attach_logprobs
from specctl.engine.logprobs import attach_verify as attach_verify_logprobs
from specctl.engine.penalties import adjust as adjust_logits
from specctl.engine.penalties import adjust_verify as adjust_verify_logits
from specctl.engine.sampling import greedy_ids, probs_from_logits, sample, temperature_only
from specctl.engine.sequence import Sequence
from specctl.engine.speculative.drafter import DraftBuffers, Drafter, ModelDrafter, NgramDrafter
from specctl.engine.speculative.verify import greedy_accept, rejection_accept, rejection_accept_logits
from specctl.errors import RuntimeFailure

if TYPE_CHECKING:
    from specctl.adaptive.policy import AdaptivePolicy
    from specctl.engine.config import EngineConfig
    from specctl.engine.model_runner import ModelRunner


@dataclass(frozen=True)
class RuntimeState:
    """Prebuilt buffers of one selectable step count (views of them are used by every batch at that step)."""

    steps: int
    draft_tokens: torch.Tensor  # [max_bs, steps] long
    num_drafts: torch.Tensor  # [max_bs] long
    draft_probs: torch.Tensor | None  # [max_bs, steps, V] float32 (sampling drafters only)
    logits_pad: torch.Tensor  # [max_bs, steps + 1, V] float32: verify logits when requests drafted unequally

    @classmethod
    def build(cls, steps: int, max_bs: int, vocab: int, device: torch.device, with_probs: bool) -> RuntimeState:
        return cls(
            steps=steps,
            draft_tokens=torch.zeros(max_bs, steps, dtype=torch.long, device=device),
            num_drafts=torch.zeros(max_bs, dtype=torch.long, device=device),
            draft_probs=(
                torch.zeros(max_bs, steps, vocab, dtype=torch.float32, device=device) if with_probs and steps else None
            ),
            logits_pad=torch.zeros(max_bs, steps + 1, vocab, dtype=torch.float32, device=device),
        )

    def buffers(self) -> dict[str, torch.Tensor]:
        out = {"draft_tokens": self.draft_tokens, "num_drafts": self.num_drafts, "logits_pad": self.logits_pad}
        if self.draft_probs is not None:
            out["draft_probs"] = self.draft_probs
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers().values())


def _role_view(config: EngineConfig) -> dict[str, Any]:
    """The parts of a merged role dict that step coverage reads, rebuilt from an EngineConfig."""
    return {
        "speculative": config.speculative.to_json(),
        "serve": {"max_batch_size": config.max_batch_size, "graph_batch_sizes": list(config.graph_batch_sizes)},
    }


def make_drafter(config: EngineConfig, runner: ModelRunner) -> Drafter:
    """The drafter the deployment's `speculative` block asks for (its own ModelRunner for a draft model)."""
    spec = config.speculative
    algorithm = spec.algorithm
    if algorithm == "ngram":
        try:
            return NgramDrafter(min_match=spec.ngram.min_match, max_match=spec.ngram.max_match)
        except ValueError as exc:
            raise RuntimeFailure(f"speculative.ngram: {exc}", hint="set 1 <= min_match <= max_match") from None
    if algorithm == "draft":
        ref = spec.draft
        if not ref:
            raise RuntimeFailure("speculative.algorithm is 'draft' but speculative.draft names no model",
                                 hint="set speculative.draft, e.g. builtin:tiny-draft")
        from specctl.engine.model_runner import runner_for

        draft_runner = runner_for(config, ref, device=str(runner.device))
        if draft_runner.facts.vocab_size != runner.facts.vocab_size:
            raise RuntimeFailure(
                f"draft model {ref} has vocab_size {draft_runner.facts.vocab_size} but the target has "
                f"{runner.facts.vocab_size}; a draft must share the target's tokenizer",
                hint="use a draft model trained with the target's tokenizer",
            )
        return ModelDrafter(draft_runner)
    raise RuntimeFailure(f"speculative.algorithm {algorithm!r} has no drafter", hint="use draft, ngram or none")


class SpeculativeDecoder:
    """Draft k tokens, verify k + 1 positions in one target forward, accept per request, roll back the rest."""

    def __init__(self, runner: ModelRunner, config: EngineConfig, *, drafter: Drafter | None = None) -> None:
        from specctl.schemas.adaptive import check_deployment_steps, parse_deployment_adaptive

        self.runner = runner
        self.config = config
        spec = config.speculative
        topk = spec.topk
        if topk != 1:
            # Refuse rather than silently run a chain (SGLang quietly ignores adaptive with topk > 1).
            raise RuntimeFailure(f"speculative.topk is {topk}: tree drafting (topk > 1) is not implemented",
                                 hint="set speculative.topk: 1")
        coverage, findings = check_deployment_steps(_role_view(config))
        errors = [f for f in findings if f.severity == "error"]
        if errors or coverage is None:
            # The same findings `specctl validate` reports for this deployment.
            detail = "; ".join(f"{f.code} {f.path}: {f.message}" for f in errors) or "no usable speculative steps"
            fix = errors[0].fix if errors else "set speculative.num_steps"
            raise RuntimeFailure(f"refusing to start speculative decoding: {detail}", hint=fix)
        self.coverage = coverage
        self.initial_steps = coverage.initial_steps
        self.policy: AdaptivePolicy | None = None
        if spec.adaptive is not None:
            from specctl.adaptive.policy import AdaptivePolicy

            cfg, _ = parse_deployment_adaptive(spec.adaptive)
            assert cfg is not None  # check_deployment_steps returned a coverage, so it parsed
            self.policy = AdaptivePolicy(cfg, initial_steps=self.initial_steps,
                                         graph_batch_sizes=config.graph_batch_sizes)
            # Internal invariant: whatever the policy can select at a reachable batch size was covered.
            for b in range(1, config.max_batch_size + 1):
                bucket = cfg.route(b, config.graph_batch_sizes)
                assert set(bucket.candidate_steps) <= set(coverage.required_states), (b, bucket)
        self.drafter: Drafter = drafter if drafter is not None else make_drafter(config, runner)
        self.max_batch_size = int(config.max_batch_size)
        vocab = int(runner.facts.vocab_size)
        device = torch.device(runner.device)
        # `--trace-steps K` drafts K every step whatever the policy says (a counterfactual-complete
        # trace, adaptive/trace.py); K gets its runtime state like any selectable step.
        self.trace_steps: int | None = config.trace_steps
        selectable = set(coverage.required_states) | ({self.trace_steps} if self.trace_steps else set())
        self.states: dict[int, RuntimeState] = {
            s: RuntimeState.build(s, self.max_batch_size, vocab, device, self.drafter.samples)
            for s in sorted(selectable)
        }
        self.lookahead = max(self.states) + 1
        runner_max = runner.max_draft_tokens
        if max(self.states) > runner_max:
            # The runner keeps per-position rollback state for max_draft_tokens drafts + the last token.
            raise RuntimeFailure(
                f"the target ModelRunner was built with max_draft_tokens={runner_max}, but steps "
                f"{max(self.states)} verify {self.lookahead} positions per request and must be able to roll back",
                hint="build the ModelRunner with max_draft_tokens = EngineConfig.max_draft_tokens",
            )
        self.last_state: RuntimeState | None = None
        self._hist: Counter[int] = Counter()  # accepted drafts per verify (steps > 0), over requests
        self._batches_per_steps: Counter[int] = Counter()
        self._counters = {"verify_batches": 0, "verify_requests": 0, "draft_tokens": 0, "accepted_tokens": 0,
                          "emitted_tokens": 0}
        self._draft_s = 0.0
        self._verify_s = 0.0
        self.trace: TraceWriter | None = None
        if config.trace_out:
            self.trace = TraceWriter(config.trace_out, trace_steps=self.trace_steps)

    def pin_steps(self, steps: int) -> None:
        """Profiling (`specctl adaptive profile`): run every batch at `steps`, bypassing the policy. A step
        without a runtime state gets one built here (never on the serving path); it must fit the lookahead
        the scheduler was given, so build the engine with `trace_steps` = the largest step to pin."""
        if steps < 0 or steps + 1 > self.lookahead:
            raise RuntimeFailure(f"cannot pin steps {steps}: this decoder verifies at most {self.lookahead} "
                                 "positions", hint="build the EngineConfig with trace_steps = the largest step")
        if steps not in self.states:
            self.states[steps] = RuntimeState.build(steps, self.max_batch_size, int(self.runner.facts.vocab_size),
                                                    torch.device(self.runner.device), self.drafter.samples)
        self.trace_steps = steps

    # -- the Decoder seam ----------------------------------------------------------------------
    def current_steps(self, batch_size: int) -> int:
        if self.trace_steps is not None:
            return self.trace_steps
        return self.policy.steps_for_batch(batch_size) if self.policy is not None else self.initial_steps

    def decode(self, seqs: list[Sequence]) -> list[list[int]]:
        from specctl.engine.model_runner import ForwardItem

        b = len(seqs)
        assert 0 < b <= self.max_batch_size, (b, self.max_batch_size)
        steps = self.current_steps(b)
        state = self.states[steps]  # prebuilt for every selectable step: a lookup, never a build
        self.last_state = state
        if steps == 0:
            return self._decode_plain(seqs)
        k = steps
        # Never draft past max_tokens: verify emits accepted + 1 tokens, so at most remaining - 1 drafts.
        budgets = [max(0, min(k, s.params.max_tokens - len(s.output_ids) - 1)) for s in seqs]
        draft_tokens = state.draft_tokens[:b]
        num_drafts = state.num_drafts[:b]
        num_drafts.zero_()
        t0 = time.perf_counter()
        if any(budgets):
            probs_view = state.draft_probs[:b] if state.draft_probs is not None else None
            self.drafter.propose(seqs, budgets, DraftBuffers(draft_tokens, num_drafts, probs_view))
        t1 = time.perf_counter()

        # One target forward over [x_0, d_1..d_n] per request, starting at its cached length.
        nd = num_drafts.tolist()
        drafts = draft_tokens.tolist()
        items = [ForwardItem(s.rid, [s.last_token, *drafts[i][: nd[i]]], len(s) - 1) for i, s in enumerate(seqs)]
        logits = self.runner.forward(items)  # [sum(n_i + 1), V]
        if all(n == k for n in nd):
            target_logits = logits.view(b, k + 1, -1)
        else:
            # Unequal draft lengths (n-gram misses, max_tokens caps): scatter rows into the padded buffer.
            target_logits = state.logits_pad[:b]
            idx = [i * (k + 1) + j for i in range(b) for j in range(nd[i] + 1)]
            target_logits.view(b * (k + 1), -1).index_copy_(
                0, torch.as_tensor(idx, device=logits.device), logits.to(target_logits.dtype))
        # logit_bias / penalties per verify position (engine/penalties.py); raw logits stay for log-probs
        adjusted = adjust_verify_logits(seqs, target_logits, draft_tokens, num_drafts)
        if all(s.params.greedy for s in seqs):
            # greedy: one host copy of the argmax, then the acceptance rule on lists (verify.greedy_accept)
            acc, new_tokens = greedy_accept(drafts, nd, greedy_ids(adjusted).tolist())
        else:
            acc, new_tokens = self._verify(seqs, state, drafts, nd, adjusted)

        for i, seq in enumerate(seqs):
            a = acc[i]
            if a < nd[i]:
                # Keep x_0, d_1..d_a in the target cache (length len(seq) + a); the target's own token
                # is appended by the engine and cached by the next forward. Mamba/swa restore the state
                # after position len(seq) + a - 1 from the verify forward's per-position states.
                self.runner.truncate(seq.rid, len(seq) + a)
            self.drafter.commit(seq, nd[i], a)
            seq.accepted_per_step.append(a)
            self._hist[a] += 1
        attach_verify_logprobs(seqs, target_logits, new_tokens)  # the target's log-probs (engine/logprobs.py)
        t2 = time.perf_counter()

        self._draft_s += t1 - t0
        self._verify_s += t2 - t1
        self._batches_per_steps[steps] += 1
        self._counters["verify_batches"] += 1
        self._counters["verify_requests"] += b
        self._counters["draft_tokens"] += sum(nd)
        self._counters["accepted_tokens"] += sum(acc)
        self._counters["emitted_tokens"] += sum(a + 1 for a in acc)
        if self.trace is not None:
            self.trace.record(batch_size=b, steps=steps, accepted=acc, drafted=nd, rids=[s.rid for s in seqs],
                              draft_s=t1 - t0, verify_s=t2 - t1, sampled=sum(not s.params.greedy for s in seqs))
        if self.policy is not None and self.trace_steps is None:
            self.policy.on_verify_complete(acc, b)
        return new_tokens

    def _decode_plain(self, seqs: list[Sequence]) -> list[list[int]]:
        """Steps 0: a one-position verify with no drafts is plain decoding, so it takes plain decoding's
        cost: one forward, one batched sample (the same draw as PlainDecoder for a seeded request)."""
        from specctl.engine.model_runner import ForwardItem

        b = len(seqs)
        t0 = time.perf_counter()
        logits = self.runner.forward([ForwardItem(s.rid, (s.last_token,), len(s) - 1) for s in seqs])
        ids = sample(adjust_logits(seqs, logits), [s.params for s in seqs], [s.generator for s in seqs]).tolist()
        attach_logprobs(seqs, logits, ids)
        dt = time.perf_counter() - t0
        self._verify_s += dt
        if self.trace is not None:
            self.trace.record(batch_size=b, steps=0, accepted=[0] * b, drafted=[0] * b,
                              rids=[s.rid for s in seqs], draft_s=0.0, verify_s=dt,
                              sampled=sum(not s.params.greedy for s in seqs))
        self._batches_per_steps[0] += 1
        self._counters["verify_batches"] += 1
        self._counters["verify_requests"] += b
        self._counters["emitted_tokens"] += b
        if self.policy is not None:
            # No drafts, nothing learned: the zeros count as a batch (warmup/interval) while the policy
            # leaves its EMA alone, exactly as SGLang does at steps 0.
            self.policy.on_verify_complete([0] * b, b)
        return [[t] for t in ids]

    def _verify(
        self,
        seqs: Seq[Sequence],
        state: RuntimeState,
        drafts: list[list[int]],
        nd: list[int],
        target_logits: torch.Tensor,
    ) -> tuple[list[int], list[list[int]]]:
        """A batch with sampled requests (all-greedy batches take `greedy_accept` in `decode`): greedy rows by
        `greedy_accept`, sampled rows by `rejection_accept`, both on host lists."""
        b = len(seqs)
        acc = [0] * b
        new_tokens: list[list[int]] = [[] for _ in range(b)]
        sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
        greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
        if greedy:
            gi = torch.as_tensor(greedy, device=target_logits.device)
            ga, gt = greedy_accept([drafts[i] for i in greedy], [nd[i] for i in greedy],
                                   greedy_ids(target_logits[gi]).tolist())
            for j, i in enumerate(greedy):
                acc[i], new_tokens[i] = ga[j], gt[j]
        whole = len(sampled) == b
        logits = target_logits if whole else target_logits[torch.as_tensor(sampled, device=target_logits.device)]
        k1, vocab = target_logits.shape[1], target_logits.shape[2]
        q = None
        if self.drafter.samples and state.draft_probs is not None:
            q = state.draft_probs[:b]
            if not whole:
                q = q[torch.as_tensor(sampled, device=logits.device)]
        gens = [seqs[i].generator for i in sampled]

        def by_probs() -> tuple[list[int], list[list[int]]]:
            # p: the exact distribution plain sampling draws from (temperature, top-k, top-p), per position.
            params = [seqs[i].params for i in sampled for _ in range(k1)]
            p = probs_from_logits(logits.reshape(len(sampled) * k1, -1), params).view(len(sampled), k1, -1)
            return rejection_accept([drafts[i] for i in sampled], [nd[i] for i in sampled], p, q, gens)

        if all(g is not None and temperature_only(seqs[i].params, vocab) for i, g in zip(sampled, gens, strict=True)):
            # temperature only: from the logits (the kernel normalises what it reads and draws, where it applies)
            sa, st = rejection_accept_logits([drafts[i] for i in sampled], [nd[i] for i in sampled], logits,
                                             [float(seqs[i].params.temperature) for i in sampled], q,
                                             [g for g in gens if g is not None], by_probs)
        else:
            sa, st = by_probs()
        for j, i in enumerate(sampled):
            acc[i], new_tokens[i] = sa[j], st[j]
        return acc, new_tokens

    def release(self, seq: Sequence) -> None:
        self.drafter.release(seq.rid)

    # -- PD: draft-model cache hand-over (a drafter without a cache hands nothing; decode rebuilds from tokens)
    @property
    def draft_runner(self) -> ModelRunner | None:
        return self.drafter.runner

    def export_draft(self, seq: Sequence) -> tuple[dict[str, torch.Tensor], int] | None:
        """Prefill side: the draft model's cache of `seq` (all but the newest token) and its length, or None
        when the drafter keeps no cache (n-gram)."""
        return self.drafter.export_request(seq)

    def import_draft(self, seq: Sequence, tensors: dict[str, torch.Tensor], length: int) -> None:
        """Decode side: install a draft cache received from prefill (`Engine.add_imported` calls this)."""
        self.drafter.import_request(seq, tensors, length)

    # -- observability -------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        c = self._counters
        out: dict[str, Any] = {
            "algorithm": self.drafter.name,
            "mode": "adaptive" if self.policy is not None else "fixed",
            "initial_steps": self.initial_steps,
            "runtime_states": sorted(self.states),
            "runtime_state_bytes": {str(s): st.nbytes() for s, st in sorted(self.states.items())},
            **c,
            "acceptance_rate": c["accepted_tokens"] / c["draft_tokens"] if c["draft_tokens"] else None,
            "mean_tokens_per_verify": c["emitted_tokens"] / c["verify_requests"] if c["verify_requests"] else None,
            # accepted drafts per request per verify step (steps > 0) -> how often
            "acceptance_histogram": {str(a): n for a, n in sorted(self._hist.items())},
            "batches_per_steps": {str(s): n for s, n in sorted(self._batches_per_steps.items())},
            "draft_s": self._draft_s,
            "verify_s": self._verify_s,
            "drafter": self.drafter.stats(),
        }
        if self.trace is not None:
            out["trace"] = {"path": self.trace.path, "records": self.trace.records, "trace_steps": self.trace_steps}
        if self.policy is not None:
            snap = self.policy.snapshot()
            out["buckets"] = snap["buckets"]  # per bucket: current steps, ema, batches, candidates
            out["switches"] = snap["switches"]  # timeline: time, bucket, from_steps, to_steps, ema
        else:
            out["buckets"] = {}
            out["switches"] = []
        return out
