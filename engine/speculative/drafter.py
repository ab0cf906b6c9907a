"""Drafters: cheap proposals of the next k tokens of each request, for the target to verify.

Contract (the `Drafter` protocol, used by `SpeculativeDecoder`):

- `propose(seqs, budgets, buf)` writes request i's proposals into `buf.draft_tokens[i, :n_i]` and
  `n_i <= budgets[i]` into `buf.num_drafts[i]`. A request that asks the drafter nothing (budget 0) or
  for which it has nothing to offer gets n_i = 0: it is then decoded plainly by the same verify path.
  When `samples` is True and a row is sampled (temperature > 0), `buf.draft_probs[i, j]` holds the
  distribution q that d_j was drawn from; verify needs q for rejection sampling. Deterministic
  drafters (`samples` False) propose point masses, and verify treats q as one.
- `commit(seq, num_drafts, accepted)` is called after verify, before the new tokens are appended to
  `seq`: the drafter drops whatever it derived from rejected drafts.
- `release(rid)` forgets a request (finished, aborted or preempted); idempotent.

Two drafters:

- `NgramDrafter`: prompt lookup, no model. It finds the longest suffix of the request's tokens
  (between `min_match` and `max_match` tokens) that occurred earlier in the same request and proposes
  what followed that occurrence (the most recent one; continuations are extended periodically when the
  match overlaps the end, so repeated text proposes a full k tokens).
- `ModelDrafter`: a small draft model run autoregressively on its own `ModelRunner` (own paged KV;
  must share the target's tokenizer, i.e. vocabulary). Its cache catches up lazily: each round feeds
  every token of the request it has not cached yet (the newest token, plus any tokens the target
  accepted last round that the draft never saw, or the whole request after a release), then drafts
  one token per forward. After verify it is truncated to the longest prefix that is still correct,
  always within its last forward, so hybrid (mamba/swa) draft models roll back exactly too.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from specctl.engine.ops import ChainSampling
from specctl.engine.sampling import draws, inverse_cdf, probs_from_logits, temperature_only
from specctl.engine.sequence import Sequence
from specctl.errors import RuntimeFailure

if TYPE_CHECKING:
    from specctl.engine.model_runner import ModelRunner


@dataclass
class DraftBuffers:
    """Where a drafter writes one batch's proposals (views into a prebuilt runtime state)."""

    draft_tokens: torch.Tensor  # [B, K] long
    num_drafts: torch.Tensor  # [B] long
    draft_probs: torch.Tensor | None  # [B, K, V] float32, or None for deterministic drafters


class Drafter(Protocol):
    """What the speculative decoder asks of a drafter (every drafter implements all of it). `runner` is
    the draft model's runner (None for a drafter without a model); `export_request` / `import_request`
    hand its cache of one request over in PD (None / a no-op for a drafter that keeps no cache)."""

    name: str
    samples: bool

    @property
    def runner(self) -> ModelRunner | None: ...

    def propose(self, seqs: Seq[Sequence], budgets: Seq[int], buf: DraftBuffers) -> None: ...

    def commit(self, seq: Sequence, num_drafts: int, accepted: int) -> None: ...

    def release(self, rid: int) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def export_request(self, seq: Sequence) -> tuple[dict[str, torch.Tensor], int] | None: ...

    def import_request(self, seq: Sequence, tensors: dict[str, torch.Tensor], length: int) -> None: ...


class NgramIndex:
    """One request's n-gram table: for every n in [lo, hi], each n-gram of the request's tokens -> the index
    just past its most recent occurrence that a token follows. It grows with the request (`extend`), a few
    dict writes per new token, so a lookup is at most hi - lo + 1 dict reads however long the request is
    (rescanning the whole request every step cost ~50 us per request at 250 tokens)."""

    __slots__ = ("hi", "lo", "tables", "tokens")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.tokens: list[int] = []
        self.tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(hi + 1)]

    def extend(self, new: Seq[int]) -> None:
        toks, tables, lo, hi = self.tokens, self.tables, self.lo, self.hi
        for t in new:
            end = len(toks)
            # The n-grams ending at `end` are now followed by a token: the suffix itself never is, so a
            # lookup can only find an earlier occurrence.
            for n in range(lo, min(hi, end) + 1):
                tables[n][tuple(toks[end - n : end])] = end
            toks.append(t)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest recurring suffix (empty when none recurs)."""
        toks = self.tokens
        n_tok = len(toks)
        for n in range(min(self.hi, n_tok - 1), self.lo - 1, -1):
            j = self.tables[n].get(tuple(toks[n_tok - n :]))
            if j is None:
                continue
            out = toks[j : j + k]
            # Reading past the end continues into our own proposals: a match at distance P proposes the
            # period-P repetition, not just the P tokens that exist.
            while len(out) < k:
                out.append(out[len(out) - (n_tok - j)])
            return out
        return []


class NgramDrafter:
    """Prompt lookup: continue the longest earlier match of the request's own suffix."""

    name = "ngram"
    samples = False
    runner = None  # no draft model

    def __init__(self, *, min_match: int = 1, max_match: int = 4) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"ngram needs 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.min_match = min_match
        self.max_match = max_match
        self.lookups = 0
        self.hits = 0
        self._index: dict[int, NgramIndex] = {}

    def lookup(self, tokens: Seq[int], k: int) -> list[int]:
        """Up to k proposed continuation tokens of `tokens` (empty when no suffix recurs); stateless."""
        if k <= 0:
            return []
        index = NgramIndex(self.min_match, self.max_match)
        index.extend(tokens)
        return self._count(index.propose(k))

    def _count(self, prop: list[int]) -> list[int]:
        self.lookups += 1
        self.hits += bool(prop)
        return prop

    def _synced(self, seq: Sequence) -> NgramIndex:
        """seq's index, brought up to its tokens (a request only ever grows while the drafter knows it)."""
        index = self._index.get(seq.rid)
        have = len(index.tokens) if index is not None else 0
        if index is None or have > len(seq):
            index = self._index[seq.rid] = NgramIndex(self.min_match, self.max_match)
            have = 0
        plen = len(seq.prompt_ids)
        if have < plen:
            index.extend(seq.prompt_ids[have:])
            have = plen
        if have < len(seq):
            index.extend(seq.output_ids[have - plen :])
        return index

    def propose(self, seqs: Seq[Sequence], budgets: Seq[int], buf: DraftBuffers) -> None:
        proposals = [self._count(self._synced(seq).propose(k)) if k > 0 else []
                     for seq, k in zip(seqs, budgets, strict=True)]
        _fill(buf, range(len(proposals)), proposals)

    def commit(self, seq: Sequence, num_drafts: int, accepted: int) -> None:
        """Nothing to roll back: the index holds the request's own tokens only, never drafts."""

    def release(self, rid: int) -> None:
        self._index.pop(rid, None)

    def export_request(self, seq: Sequence) -> None:
        """No cache to hand over: decode's index is rebuilt from the request's tokens."""
        return None

    def import_request(self, seq: Sequence, tensors: dict[str, torch.Tensor], length: int) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"drafter": self.name, "min_match": self.min_match, "max_match": self.max_match,
                "lookups": self.lookups, "hits": self.hits}


def _fill(buf: DraftBuffers, rows: Seq[int], proposals: Seq[Seq[int]]) -> None:
    """Write batch rows `rows`' proposals and their counts into the runtime state's buffers: one padded copy
    each (a tensor write per element, or per row, costs microseconds each)."""
    if not proposals:
        return
    dev = buf.num_drafts.device
    width = buf.draft_tokens.shape[1]
    padded = torch.tensor([[*p, *[0] * (width - len(p))] for p in proposals], dtype=torch.long)
    index = torch.tensor(list(rows), dtype=torch.long, device=dev)
    buf.draft_tokens.index_copy_(0, index, padded.to(buf.draft_tokens.device))
    buf.num_drafts.index_copy_(0, index, torch.tensor([len(p) for p in proposals], dtype=torch.long).to(dev))


def _fill_probs(buf: DraftBuffers, rows: Seq[int], probs: torch.Tensor) -> None:
    """The drafted rows' q [len(rows), kmax, V] into the runtime state's draft_probs, one copy."""
    assert buf.draft_probs is not None
    width = probs.shape[1]
    index = torch.tensor(list(rows), dtype=torch.long, device=probs.device)
    if width == buf.draft_probs.shape[1]:
        buf.draft_probs.index_copy_(0, index, probs)
    else:
        buf.draft_probs[index, :width] = probs


class ModelDrafter:
    """A draft model proposing k tokens autoregressively from its own cache.

    `runner` is a `ModelRunner` for the draft model (its contract: allocate / ensure_capacity /
    forward / truncate / free / cached_len, where `truncate` can only restore lengths inside the last
    forward). Greedy rows propose the draft's argmax; sampled rows draw from the draft's distribution
    under the request's own sampling parameters and generator, and keep that distribution q for
    rejection sampling.

    Cache discipline, chosen so that every rollback lies inside the draft's last forward (which is all
    a recurrent or sliding-window draft can restore): with c' = len(seq) - 1 tokens committed,
      forward 1 feeds every uncached token up to and including the newest one x_0 -> d_1;
      forward j (2..k) first truncates back to c' and feeds [x_0, d_1 .. d_{j-1}] from c' -> d_j;
    so after drafting the cache holds x_0, d_1..d_{k-1} from ONE forward starting at c', and after verify
    `commit` truncates to c' + 1 + min(accepted, k - 1), always inside it. The price is re-reading up to
    k - 1 tokens per forward (k(k+1)/2 positions instead of k), negligible next to per-forward overhead
    for a small draft model; the number of forwards stays k. A draft of full-attention layers only can
    truncate anywhere, so it feeds one token per forward j >= 2 instead (`incremental`): the cache ends
    up holding the same tokens, and `commit` is the same.
    """

    name = "draft"
    samples = True

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        # A draft of full-attention layers only can truncate to any length, so each draft forward feeds just
        # the newest proposal; sliding-window and mamba drafts re-feed from c' (see the class docstring).
        cache = runner.cache
        self.incremental = not (cache.swa_index or cache.mamba_index)
        if self.incremental:
            # keep each request's draft cache on consecutive pages: the lean chain (draft_chain) needs them
            cache.keep_contiguous = True
        self._owner: dict[int, int] = {}  # rid -> id(Sequence) that filled its draft cache
        self.forwards = 0
        self.capacity_misses = 0

    # -- cache upkeep --------------------------------------------------------------------------
    def _ready(self, seq: Sequence, k: int) -> bool:
        """Make sure seq's draft cache exists and can grow to hold the request plus k-1 drafts."""
        rid = seq.rid
        need = len(seq) + k
        if self._owner.get(rid) != id(seq):
            # New request (or a recycled rid): start the draft cache from scratch.
            self.release(rid)
            if not self.runner.can_allocate(need):
                return False
            self.runner.allocate(rid, need)
            self._owner[rid] = id(seq)
            return True
        return bool(self.runner.ensure_capacity(rid, need))

    def release(self, rid: int) -> None:
        if self._owner.pop(rid, None) is not None:
            self.runner.free(rid)

    # -- PD transfer: the prefill side hands its draft cache to decode ---------------------------
    def export_request(self, seq: Sequence) -> tuple[dict[str, torch.Tensor], int]:
        """Cache every token of `seq` but the newest in the draft model, export it and forget it.

        Returns (tensors, length) for `import_request` on the decode side; length == len(seq) - 1, the
        same cache invariant as the target's."""
        from specctl.engine.model_runner import ForwardItem

        length = len(seq) - 1
        if not self._ready(seq, 1):
            raise RuntimeFailure(f"draft model cache full: cannot prefill request {seq.rid} ({len(seq)} tokens)")
        cached = self.runner.cached_len(seq.rid)
        if cached > length:
            self.runner.truncate(seq.rid, length)
        elif cached < length:
            self.runner.forward([ForwardItem(seq.rid, seq.token_ids(cached, length), cached)], last_only=True)
        tensors = self.runner.export_request(seq.rid)
        self.release(seq.rid)
        return tensors, length

    def import_request(self, seq: Sequence, tensors: dict[str, torch.Tensor], length: int) -> None:
        """Install a draft cache exported by the prefill side; the next `propose` continues from `length`."""
        self.release(seq.rid)
        self.runner.import_request(seq.rid, tensors, length)
        self._owner[seq.rid] = id(seq)

    # -- the three verbs -------------------------------------------------------------------------
    def propose(self, seqs: Seq[Sequence], budgets: Seq[int], buf: DraftBuffers) -> None:
        from specctl.engine.model_runner import ForwardItem

        rows: list[int] = []  # batch rows that draft this round
        buf.num_drafts[: len(seqs)].zero_()
        for i, (seq, k) in enumerate(zip(seqs, budgets, strict=True)):
            if k > 0:
                if self._ready(seq, k):
                    rows.append(i)
                else:
                    self.capacity_misses += 1
        if not rows:
            return
        kmax = max(budgets[i] for i in rows)
        params = [seqs[i].params for i in rows]
        greedy = all(p.greedy for p in params)
        choose: Callable[[torch.Tensor, list[int], int], torch.Tensor] | None = None
        sampling: ChainSampling | None = None
        probs = torch.empty(0)
        if not greedy:
            # Each sampled row's uniforms for this round, drawn up front from its own generator (the numbers
            # one draw per proposal would take: `sampling.draws`), so the kernel can draw the whole chain in
            # one call; a greedy row draws none. q goes to `probs`, then to the runtime state's buffer in one copy.
            gens = [seqs[i].generator for i in rows]
            unif = [draws(g, budgets[i]) if g is not None else [] for i, g in zip(rows, gens, strict=True)]
            assert buf.draft_probs is not None
            probs = torch.empty(len(rows), kmax, buf.draft_probs.shape[-1], dtype=torch.float32,
                                device=buf.draft_probs.device)

            def draw(logits: torch.Tensor, active: list[int], j: int) -> torch.Tensor:
                """Step j's proposals of the `active` rows (indices into `rows`), their q recorded."""
                q = probs_from_logits(logits, [params[a] for a in active])
                probs[torch.as_tensor(active, device=probs.device), j] = q
                u = torch.tensor([unif[a][j] if unif[a] else 0.5 for a in active], device=q.device)
                return inverse_cdf(q, u)

            choose = draw

            if all(temperature_only(p, probs.shape[-1]) for p in params) and probs.is_cpu:
                sampling = ChainSampling([0.0 if p.greedy else float(p.temperature) for p in params], unif, probs)

        if self.incremental:
            # A full-attention draft: every request's whole chain in one runner call (its lean path; None
            # when a request's draft cache is not one slice of the pool), drawing as the loop below does.
            feeds = [seqs[i].token_ids(self.runner.cached_len(seqs[i].rid), len(seqs[i])) for i in rows]
            chains = self.runner.draft_chain([seqs[i].rid for i in rows], feeds, [budgets[i] for i in rows],
                                             choose, sampling)
            if chains is not None:
                self.forwards += kmax
                _fill(buf, rows, chains)
                if choose is not None:
                    _fill_probs(buf, rows, probs)
                return
        committed = [len(seqs[i]) - 1 for i in rows]  # c': everything before the newest token x_0
        proposals: list[list[int]] = [[] for _ in rows]
        active = list(range(len(rows)))  # indices into `rows` still drafting
        for j in range(kmax):
            items = []
            for a in active:
                seq = seqs[rows[a]]
                if j == 0:
                    cached = self.runner.cached_len(seq.rid)
                    items.append(ForwardItem(seq.rid, seq.token_ids(cached, len(seq)), cached))
                elif self.incremental:
                    # The cache holds x_0, d_1..d_{j-1} but d_{j-1}: feed it alone (same cache as re-feeding).
                    items.append(ForwardItem(seq.rid, [proposals[a][-1]], committed[a] + j))
                else:
                    # Back to c' (inside the previous forward), then re-feed x_0 and the proposals so far.
                    self.runner.truncate(seq.rid, committed[a])
                    items.append(ForwardItem(seq.rid, [seq.last_token, *proposals[a]], committed[a]))
            logits = self.runner.forward(items)
            self.forwards += 1
            if logits.shape[0] == len(items):  # one token per item (incremental drafting): every row is last
                last = logits
            else:
                ends = np.cumsum([len(it.token_ids) for it in items]) - 1
                last = logits[torch.as_tensor(ends, device=logits.device)]
            toks = last.argmax(dim=-1) if choose is None else choose(last, active, j)
            tok_list = toks.tolist()
            for r, a in enumerate(active):
                proposals[a].append(tok_list[r])
            # The last proposal d_k is never fed: the draft cache never holds a token verify cannot accept.
            active = [a for a in active if j + 1 < budgets[rows[a]]]
            if not active:
                break
        _fill(buf, rows, proposals)
        if choose is not None:
            _fill_probs(buf, rows, probs)

    def commit(self, seq: Sequence, num_drafts: int, accepted: int) -> None:
        rid = seq.rid
        if self._owner.get(rid) != id(seq) or num_drafts == 0:
            return
        # The last draft forward cached x_0, d_1..d_{n-1} from c' = len(seq) - 1; keep x_0 and the accepted
        # drafts among them. The target's own token (and d_n if accepted) are fed next round.
        keep = len(seq) + min(accepted, num_drafts - 1)
        if keep < self.runner.cached_len(rid):
            self.runner.truncate(rid, keep)

    def stats(self) -> dict[str, Any]:
        return {"drafter": self.name, "draft_model": self.runner.facts.ref, "forwards": self.forwards,
                "capacity_misses": self.capacity_misses}
