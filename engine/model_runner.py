"""ModelRunner: one loaded model plus its caches, driven by request ids the caller chooses.

The scheduler (engine/engine.py), the speculative decoder and the PD transfer all talk to a model
through this class alone:

* cache verbs — `can_allocate`, `allocate`, `ensure_capacity`, `free`, `cached_len`, `truncate`;
* `forward(items)` — items of different lengths in one call; each item extends its request's cache from
  `start_pos == cached_len(rid)` and gets float32 logits for every input position, rows in item order;
* PD facts — `layout()` for the handshake, `export_request` / `import_request` for the transfer.

`runner_for(config, model_ref=None, device=None)` is the one place a runner is built from an engine
config: the target (the Engine) and a draft model (speculative decoding) alike, with the same page size,
pool and batch limits, so the two caches always agree.

Batching: items of at most `max_draft_tokens + 1` tokens (decode and speculative verify) run as one
padded group; longer items (prefill) run one group each, so a long prompt never pads a decode batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specctl.engine.alloc import AllocatorTuning, tune_allocator
from specctl.engine.cache import HybridCache
from specctl.engine.cache_layout import CacheLayout
from specctl.engine.checkpoint import load_model, model_config, weights_hash
from specctl.engine.config import EngineConfig
from specctl.engine.device import dtype_name, resolve_device, resolve_dtype
from specctl.engine.model import apply_linear
from specctl.engine.ops import ChainSampling
from specctl.engine.tokenizer import Tokenizer, load_tokenizer
from specctl.errors import RuntimeFailure
from specctl.schemas.model_facts import ModelFacts, resolve_model_dir


@dataclass(frozen=True)
class ForwardItem:
    rid: int
    token_ids: Sequence[int]
    start_pos: int


class ModelRunner:
    def __init__(
        self,
        model_ref: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        page_size: int = 16,
        max_tokens: int = 32768,
        max_requests: int = 64,
        max_draft_tokens: int = 8,
    ) -> None:
        self.model_ref = model_ref
        # Before the first large tensor: a step's big temporaries must not fault in fresh pages each time.
        self.allocator: AllocatorTuning = tune_allocator()
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        facts, cfg = model_config(model_ref)
        self.facts: ModelFacts = facts
        self.config = cfg
        model_dir = resolve_model_dir(model_ref)
        self.model = load_model(model_ref, dtype=self.dtype, device=self.device)
        self.tokenizer: Tokenizer = load_tokenizer(model_dir)
        self.weights_hash = weights_hash(model_dir)
        self.cache = HybridCache(
            cfg,
            page_size=page_size,
            max_tokens=max_tokens,
            max_requests=max_requests,
            max_draft_tokens=max_draft_tokens,
            dtype=self.dtype,
            device=self.device,
        )
        self.page_size = page_size
        self.max_draft_tokens = max_draft_tokens

    # ---- cache verbs -----------------------------------------------------------------------------

    def pages_needed(self, num_tokens: int) -> int:
        return self.cache.pages_needed(num_tokens)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.cache.can_allocate(num_tokens)

    def allocate(self, rid: int, num_tokens: int) -> None:
        self.cache.allocate(rid, num_tokens)

    def ensure_capacity(self, rid: int, num_tokens: int) -> bool:
        return self.cache.ensure_capacity(rid, num_tokens)

    def free(self, rid: int) -> None:
        self.cache.free(rid)

    @property
    def num_free_pages(self) -> int:
        return self.cache.num_free_pages

    @property
    def num_total_pages(self) -> int:
        return self.cache.num_pages

    def cached_len(self, rid: int) -> int:
        return self.cache.cached_len(rid)

    def truncate(self, rid: int, length: int) -> None:
        self.cache.truncate(rid, length)

    # ---- forward ---------------------------------------------------------------------------------

    def forward(self, items: Sequence[ForwardItem], last_only: bool = False) -> torch.Tensor:
        """Logits [sum(len(token_ids)), vocab] (float32, on self.device) for every input position; with
        `last_only`, [len(items), vocab] for each item's last position (a prompt's: what a prefill samples
        from). Every position is cached either way; `last_only` spares the last layer's output projection
        and MLP and the lm_head on the rows nobody reads (`HybridForCausalLM.forward_hidden`'s `rows`)."""
        if not items:
            return torch.empty(0, self.config.vocab_size, device=self.device)
        seen: set[int] = set()
        for it in items:
            if it.rid in seen:
                raise RuntimeFailure(f"request {it.rid} appears twice in one forward")
            seen.add(it.rid)
            if not it.token_ids:
                raise RuntimeFailure(f"request {it.rid}: empty forward item")
            have = self.cache.cached_len(it.rid)
            if it.start_pos != have:
                raise RuntimeFailure(f"request {it.rid}: start_pos {it.start_pos} != cached length {have}")
            if not self.cache.ensure_capacity(it.rid, it.start_pos + len(it.token_ids)):
                raise RuntimeFailure(f"KV pool exhausted: request {it.rid} cannot grow to "
                                     f"{it.start_pos + len(it.token_ids)} tokens")
        short = [i for i, it in enumerate(items) if len(it.token_ids) <= self.cache.rollback_tokens]
        groups = ([short] if short else []) + [[i] for i, it in enumerate(items) if i not in set(short)]
        hidden_rows: list[torch.Tensor | None] = [None] * len(items)
        with torch.no_grad():
            flat: torch.Tensor | None = None
            for g in groups:
                its = [items[i] for i in g]
                lens = [len(it.token_ids) for it in its]
                lmax = max(lens)
                ctx = self.cache.group([it.rid for it in its], [it.start_pos for it in its], lens)
                # one host-to-tensor copy of the padded ids (per-row writes cost microseconds each)
                ids = torch.tensor([[*it.token_ids, *[0] * (lmax - n)] for it, n in zip(its, lens, strict=True)],
                                   dtype=torch.long, device=self.device)
                if last_only:
                    rows = torch.tensor([r * lmax + n - 1 for r, n in enumerate(lens)], device=self.device)
                    hidden = self.model.forward_hidden(ids, ctx.positions, ctx, rows)  # [len(g), hidden]
                    if len(groups) == 1:
                        flat = hidden
                        break
                    for r, i in enumerate(g):
                        hidden_rows[i] = hidden[r : r + 1]
                    continue
                hidden = self.model.forward_hidden(ids, ctx.positions, ctx)
                if len(groups) == 1 and min(lens) == lmax:
                    flat = hidden.reshape(-1, hidden.shape[-1])  # no padding: every row is a real position
                    break
                for r, i in enumerate(g):
                    hidden_rows[i] = hidden[r, : lens[r]]
            for it in items:
                self.cache.requests[it.rid].length = it.start_pos + len(it.token_ids)
            if flat is None:
                flat = torch.cat([h for h in hidden_rows if h is not None], dim=0)
            logits = apply_linear(flat, self.model.lm_head)
            return logits if logits.dtype == torch.float32 else logits.float()

    def draft_chain(
        self,
        rids: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        steps: Sequence[int],
        choose: Callable[[torch.Tensor, list[int], int], torch.Tensor] | None = None,
        sampling: ChainSampling | None = None,
    ) -> list[list[int]] | None:
        """Continuations of requests, in one call: request i feeds `token_ids[i]` from its cached length,
        then each token chosen for it but the last, `steps[i]` tokens in all (a draft model's proposals;
        the last is never fed, so its cache ends at the last fed position). `choose(logits, requests, j)`
        picks step j's tokens ([len(requests)] long) from the logits [len(requests), vocab] of the listed
        requests (indices into `rids`); default: the argmax. `sampling`, given with a `choose` that makes
        the draws it describes (temperature-only rows, the caller's uniforms), lets the CPU's fused loop draw
        the whole chains in one call instead of a call per token. None, with the cached tokens unchanged, when
        the lean path does not apply (a model with swa or mamba layers, or a request whose pages are not
        consecutive: see `HybridCache.lone_base`); the caller then runs `forward` per step.

        Why: a draft step of a tiny model is mostly per-call overhead. This skips the item checks, the
        padded group and the host round trip per step (the tokens stay a tensor until the end), and
        computes logits for each request's last position only (`HybridForCausalLM.forward_lone`). On the
        CPU the chains run in the small-row kernel's fused loop (`HybridForCausalLM.lone_chain`), all the
        requests together: greedy chains in one call (5 tokens of builtin:tiny-draft: 81 vs 580 us here),
        sampled ones too when `sampling` applies (the kernel draws), else a call per token, `choose`
        drawing from the logits in between."""
        if not self.model._lone_layers or not rids or min(steps) < 1 or not all(token_ids):
            return None
        starts = [self.cache.cached_len(r) for r in rids]
        bases: list[int] = []
        for rid, s, feed, k in zip(rids, starts, token_ids, steps, strict=True):
            end = s + len(feed) + k - 1
            base = self.cache.lone_base(rid, end) if self.cache.ensure_capacity(rid, end) else None
            if base is None:
                return None
            bases.append(base)
        model, pools = self.model, self.cache.kv_pools()
        if self.device.type == "cpu":
            # All the requests' chains in the fused loop: whole when greedy, a token per call when sampling.
            if choose is None or sampling is not None:
                chains = model.lone_chain(pools, bases, starts, token_ids, steps, sampling=sampling)
            else:
                chains = self._sampled_lone_chain(bases, starts, token_ids, steps, choose)
            if chains is not None:
                for rid, s, feed, k in zip(rids, starts, token_ids, steps, strict=True):
                    self.cache.requests[rid].length = s + len(feed) + k - 1
                return chains
        ids = torch.tensor([t for feed in token_ids for t in feed], dtype=torch.long, device=self.device)
        spans = [(s, len(feed)) for s, feed in zip(starts, token_ids, strict=True)]
        active = list(range(len(rids)))
        record: list[tuple[list[int], torch.Tensor]] = []  # (requests, their argmax) per step
        with torch.no_grad():
            for j in range(max(steps)):
                hidden = model.forward_lone(ids, [spans[i] for i in active], pools, [bases[i] for i in active])
                logits = apply_linear(hidden, model.lm_head)
                tok = logits.argmax(dim=-1) if choose is None else choose(logits.float(), active, j)
                record.append((active, tok))
                for i in active:
                    spans[i] = (spans[i][0] + spans[i][1], 1)
                going = [r for r, i in enumerate(active) if j + 1 < steps[i]]
                if not going:
                    break
                ids = tok if len(going) == len(active) else tok[torch.tensor(going, device=tok.device)]
                active = [active[r] for r in going]
        flat = torch.cat([t for _, t in record]).tolist()
        out: list[list[int]] = [[] for _ in rids]
        at = 0
        for reqs, _ in record:
            for i in reqs:
                out[i].append(flat[at])
                at += 1
        for rid, (s, _n) in zip(rids, spans, strict=True):
            self.cache.requests[rid].length = s
        return out

    def _sampled_lone_chain(
        self,
        bases: Sequence[int],
        starts: Sequence[int],
        token_ids: Sequence[Sequence[int]],
        steps: Sequence[int],
        choose: Callable[[torch.Tensor, list[int], int], torch.Tensor],
    ) -> list[list[int]] | None:
        """`draft_chain` for a caller that draws the tokens: per step, one fused-loop call for all the
        requests still going (their forwards and logits), then `choose` on those logits; None where the
        fused loop does not apply (nothing written then)."""
        model, pools = self.model, self.cache.kv_pools()
        out: list[list[int]] = [[] for _ in token_ids]
        feeds = [list(f) for f in token_ids]
        pos = list(starts)
        active = list(range(len(token_ids)))
        logits = torch.empty(len(active), 1, model.config.vocab_size, dtype=torch.float32)
        for j in range(max(steps)):
            rows = logits[: len(active)]
            ran = model.lone_chain(pools, [bases[i] for i in active], [pos[i] for i in active],
                                   [feeds[i] for i in active], [1] * len(active), rows)
            if ran is None:
                assert j == 0, "the fused loop stopped applying mid-chain"
                return None
            toks = choose(rows[:, 0], active, j).tolist()
            for r, i in enumerate(active):
                out[i].append(int(toks[r]))
                pos[i] += len(feeds[i])
                feeds[i] = [int(toks[r])]
            active = [i for i in active if j + 1 < steps[i]]
            if not active:
                break
        return out

    # ---- PD facts --------------------------------------------------------------------------------

    def layout(self) -> CacheLayout:
        """Facts the PD handshake compares (engine/cache_layout.py), derived from the live caches."""
        c, cfg = self.cache, self.config
        esize = torch.empty(0, dtype=self.dtype).element_size()
        kv_item = 2 * c.page_size * cfg.num_kv_heads * cfg.head_dim * esize
        shapes = c.export_shapes(0)
        state_dims: list[tuple[int, ...]] = []
        state_lens: list[int] = []
        for st in self.facts.state_types:
            if st == "mamba":
                conv, ssm = shapes["mamba_conv"], shapes["mamba_ssm"]
                state_dims.append((*conv, *ssm[1:]))
                state_lens.append(conv.numel() * esize + ssm.numel() * 4)  # ssm states are float32
            else:
                state_dims.append(tuple(shapes["swa"]))
                state_lens.append(shapes["swa"].numel() * esize)
        return CacheLayout(
            page_size=c.page_size,
            dtype=dtype_name(self.dtype),
            kv_item_lens=(kv_item,) * len(c.full_index),
            state_types=tuple(self.facts.state_types),
            state_item_lens=tuple(state_lens),
            state_dims=tuple(state_dims),
            weights_hash=self.weights_hash,
            architecture=self.facts.architecture,
            layer_kinds=tuple(self.facts.layer_kinds),
            vocab_size=cfg.vocab_size,
        )

    def export_request(self, rid: int) -> dict[str, torch.Tensor]:
        """Everything decode needs to continue `rid` from `cached_len(rid)` (see engine/cache.py)."""
        return self.cache.export_request(rid)

    def import_request(self, rid: int, tensors: dict[str, torch.Tensor], length: int) -> None:
        self.cache.import_request(rid, tensors, length)


def runner_for(config: EngineConfig, model_ref: str | None = None, *, device: str | None = None) -> ModelRunner:
    """A runner for `model_ref` (default: the config's target) under `config`'s dtype, page size, KV pool
    and batch limits, on `device` (default: the config's, resolved). The draft runner passes the target
    runner's device so both models live on one device."""
    return ModelRunner(
        model_ref if model_ref is not None else config.model_ref,
        dtype=config.dtype,
        device=device if device is not None else str(resolve_device(config.device)),
        page_size=config.page_size,
        max_tokens=config.max_tokens,
        max_requests=config.max_batch_size,
        max_draft_tokens=config.max_draft_tokens,
    )
