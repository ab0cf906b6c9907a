"""Per-request caches of a hybrid model: paged full-attention KV, sliding-window KV, mamba state slots.

Components, derived from the model's layer kinds (`ModelFacts.state_types` gives their order):

* `full` layers: a paged KV pool, `page_size` tokens per page, one page table per request. Pages are the
  admission currency (`can_allocate` / `allocate` / `ensure_capacity` / `free`).
* `swa` layers (state type "swa"): a ring of `window + max_draft_tokens` positions per request slot, so a
  speculative verify of up to `max_draft_tokens + 1` tokens can be rolled back and still see a full window.
* `mamba` layers (state type "mamba"): one conv state (last d_conv-1 conv inputs) and one SSM state per
  request slot. During a multi-token forward the per-position intermediate states are kept (for the last
  `max_draft_tokens + 1` positions, and the state before the forward when it is that short) so
  `truncate()` can commit the state after the last accepted token.

A request holds one slot (swa ring + mamba state) for its lifetime plus pages for its tokens. `Group` is
the `CacheContext` one padded model forward uses (engine/model.py).

Export format of one request (`export_request`): `kv` [n_full, 2, n_pages, page_size, kv_heads, head_dim]
(pages covering the cached length), `swa` [n_swa, 2, window, kv_heads, head_dim] (the last `window`
positions, oldest first, zeros before position 0), `mamba_conv` [n_mamba, conv_dim, d_conv-1] and
`mamba_ssm` [n_mamba, heads, head_dim, d_state] (float32). These shapes do not depend on
`max_draft_tokens`, so prefill and decode may differ in speculation depth.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specctl.engine import ops
from specctl.engine.model import ModelConfig, attention_mask, sdpa
from specctl.errors import RuntimeFailure

# Key position of padding: larger than any query position, so the causal mask always hides it.
_PAD_POS = 1 << 40


@dataclass
class _Rollback:
    """What the last forward of one request kept so `truncate` can move back inside it."""

    start: int
    end: int
    min_len: int  # the shortest length truncate can restore
    # per mamba layer: ssm states for lengths [min_len, end] ([n, H, P, N]) and conv inputs (positions
    # start-(d_conv-1) .. end-1, [d_conv-1+L, conv_dim])
    ssm: list[torch.Tensor] = field(default_factory=list)
    xcat: list[torch.Tensor] = field(default_factory=list)


@dataclass
class _Request:
    slot: int
    pages: list[int]
    length: int = 0
    page_tensor: torch.Tensor | None = None  # cached torch copy of `pages`
    slot_tensor: torch.Tensor | None = None  # cached flat KV slots of every position the pages hold
    slot_index: torch.Tensor | None = None  # cached tensor([slot])
    base: int | None = -1  # cached `_contiguous_base` (-1: not computed since the pages last changed)
    rollback: _Rollback | None = None


class HybridCache:
    """All cache memory of one model instance and the per-request bookkeeping over it."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        page_size: int,
        max_tokens: int,
        max_requests: int,
        max_draft_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if page_size < 1 or max_tokens < 1 or max_requests < 1 or max_draft_tokens < 0:
            raise RuntimeFailure(
                f"bad cache sizes: page_size={page_size} max_tokens={max_tokens} "
                f"max_requests={max_requests} max_draft_tokens={max_draft_tokens}"
            )
        self.cfg = cfg
        self.page_size = page_size
        self.num_pages = math.ceil(max_tokens / page_size)
        self.max_requests = max_requests
        self.max_draft_tokens = max_draft_tokens
        self.rollback_tokens = max_draft_tokens + 1  # a verify forwards the last token + the drafts
        self.dtype, self.device = dtype, device
        kinds = cfg.layer_kinds
        self.full_index = {i: n for n, i in enumerate(i for i, k in enumerate(kinds) if k == "full")}
        self.swa_index = {i: n for n, i in enumerate(i for i, k in enumerate(kinds) if k == "swa")}
        self.mamba_index = {i: n for n, i in enumerate(i for i, k in enumerate(kinds) if k == "mamba")}
        kvh, hd = cfg.num_kv_heads, cfg.head_dim
        # [n_full, 2 (k, v), pages * page_size, kv_heads, head_dim]: one flat slot space per layer.
        self.kv = torch.zeros(len(self.full_index), 2, self.num_pages * page_size, kvh, hd, dtype=dtype, device=device)
        self.window = cfg.sliding_window or 0
        self.ring = self.window + max_draft_tokens if self.swa_index else 0
        self.swa = torch.zeros(len(self.swa_index), 2, max_requests * max(self.ring, 1), kvh, hd, dtype=dtype,
                               device=device) if self.swa_index else torch.zeros(0, 2, 0, kvh, hd, dtype=dtype)
        nm = len(self.mamba_index)
        self.conv = torch.zeros(nm, max_requests, cfg.mamba_conv_dim, cfg.mamba_d_conv - 1, dtype=dtype, device=device)
        # SSM states stay float32 whatever the model dtype: they accumulate over the whole sequence.
        self.ssm = torch.zeros(nm, max_requests, cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_d_state,
                               dtype=torch.float32, device=device)
        self._free_pages = list(range(self.num_pages - 1, -1, -1))  # pop() hands out low pages first
        self._free_slots = list(range(max_requests - 1, -1, -1))
        self.requests: dict[int, _Request] = {}
        # Set by a draft model's drafter (full attention only): keep each request on consecutive pages where
        # the pool allows, so its keys are one slice of it (HybridForCausalLM.forward_lone, the lean chain).
        # A target never reads them that way, so its requests grow on any free page without copying.
        self.keep_contiguous = False
        self._arange = torch.arange(1024, device=device)
        self._trues = torch.ones(64, dtype=torch.bool, device=device)

    # ---- allocator -------------------------------------------------------------------------------

    def pages_needed(self, num_tokens: int) -> int:
        return math.ceil(max(0, num_tokens) / self.page_size)

    @property
    def num_free_pages(self) -> int:
        return len(self._free_pages)

    def can_allocate(self, num_tokens: int) -> bool:
        return bool(self._free_slots) and self.pages_needed(num_tokens) <= len(self._free_pages)

    def allocate(self, rid: int, num_tokens: int) -> None:
        if rid in self.requests:
            raise RuntimeFailure(f"request {rid} is already allocated")
        if not self._free_slots:
            raise RuntimeFailure(f"no free request slot for request {rid} (max_requests={self.max_requests})")
        n = self.pages_needed(num_tokens)
        if n > len(self._free_pages):
            raise RuntimeFailure(f"KV pool exhausted: request {rid} needs {n} pages, {len(self._free_pages)} free")
        slot = self._free_slots.pop()
        pages = self._take_run(n) if self.keep_contiguous else None
        if pages is None:
            pages = [self._free_pages.pop() for _ in range(n)]
        self.conv[:, slot].zero_()
        self.ssm[:, slot].zero_()
        self.requests[rid] = _Request(slot=slot, pages=pages)

    def ensure_capacity(self, rid: int, num_tokens: int) -> bool:
        req = self._req(rid)
        extra = self.pages_needed(num_tokens) - len(req.pages)
        if extra <= 0:
            return True
        if extra > len(self._free_pages):
            return False
        if not (self.keep_contiguous and self._grow_contiguous(req, extra)):
            req.pages.extend(self._free_pages.pop() for _ in range(extra))
        req.page_tensor = None
        req.slot_tensor = None
        req.base = -1
        return True

    def _grow_contiguous(self, req: _Request, extra: int) -> bool:
        """Grow a request on consecutive pages by `extra` pages and keep them consecutive: take the pages
        right after its last if they are free, else move it to the middle of the largest free run (copying
        its keys and values: a draft model's are a few hundred KB at most). False, with nothing changed,
        when its pages are already scattered or no free run is long enough; then it grows anywhere."""
        pages = req.pages
        if not pages or self._contiguous_base(req) is None:
            return False
        after = range(pages[-1] + 1, pages[-1] + 1 + extra)
        if extra <= 2 and all(p in self._free_pages for p in after):
            # The usual growth, a page or two in place: scanning the free list beats building a set of it
            # (a draft request grows every 16 tokens; 61 -> ~15 us a growth with ~800 free pages).
            for p in after:
                self._free_pages.remove(p)
            pages.extend(after)
            return True
        free = set(self._free_pages)
        if all(p in free for p in after):
            taken = set(after)
            self._free_pages = [p for p in self._free_pages if p not in taken]
            pages.extend(after)
            return True
        new = self._take_run(len(pages) + extra, free)
        if new is None:
            return False
        old_slots = self._all_slots(req)
        lo = new[0] * self.page_size
        self.kv[:, :, lo : lo + old_slots.numel()] = self.kv[:, :, old_slots]
        self._free_pages.extend(reversed(pages))
        req.pages = new
        return True

    def _take_run(self, n: int, free: set[int] | None = None) -> list[int] | None:
        """Take n consecutive free pages from the middle of the longest free run (so the requests on either
        side can still grow in place), or None when no run is that long."""
        if n == 0:
            return []
        start, length = self._largest_free_run(set(self._free_pages) if free is None else free)
        if length < n:
            return None
        first = start + (length - n) // 2
        taken = set(range(first, first + n))
        self._free_pages = [p for p in self._free_pages if p not in taken]
        return list(range(first, first + n))

    def _largest_free_run(self, free: set[int]) -> tuple[int, int]:
        """(first page, length) of the longest run of consecutive free pages ((0, 0) when none is free)."""
        best = (0, 0)
        for p in sorted(free):
            if p - 1 in free:
                continue
            n = 1
            while p + n in free:
                n += 1
            if n > best[1]:
                best = (p, n)
        return best

    def free(self, rid: int) -> None:
        req = self.requests.pop(rid, None)
        if req is None:
            return
        self._free_pages.extend(reversed(req.pages))
        self._free_slots.append(req.slot)

    def cached_len(self, rid: int) -> int:
        return self._req(rid).length

    def _req(self, rid: int) -> _Request:
        try:
            return self.requests[rid]
        except KeyError:
            raise RuntimeFailure(f"request {rid} is not allocated") from None

    def _pages(self, req: _Request) -> torch.Tensor:
        if req.page_tensor is None:
            req.page_tensor = torch.tensor(req.pages or [0], dtype=torch.long, device=self.device)
        return req.page_tensor

    def _all_slots(self, req: _Request) -> torch.Tensor:
        """Flat full-KV slot of every position 0 .. len(pages) * page_size - 1 of `req` (cached until its
        pages change), so a lone request's keys and writes are slices, not index arithmetic per forward."""
        if req.slot_tensor is None:
            pages = self._pages(req)
            req.slot_tensor = (pages[:, None] * self.page_size
                               + torch.arange(self.page_size, device=self.device)).reshape(-1)
        return req.slot_tensor

    def _contiguous_base(self, req: _Request) -> int | None:
        """First flat slot of `req` when its pages are consecutive (then positions 0 .. end-1 are one slice of
        the pool; the allocator hands out low pages first, so a lone request's pages usually are), else None.
        Computed once per change of its pages: every full-attention layer of every forward asks."""
        if req.base == -1:
            pages = req.pages
            req.base = pages[0] * self.page_size if pages and pages == list(range(pages[0], pages[-1] + 1)) else None
        return req.base

    def _true(self, n: int) -> torch.Tensor:
        """n True values as a slice of one cached tensor."""
        if self._trues.numel() < n:
            self._trues = torch.ones(max(n, 2 * self._trues.numel()), dtype=torch.bool, device=self.device)
        return self._trues[:n]

    def _positions(self, n: int) -> torch.Tensor:
        """arange(n) as a slice of one cached tensor."""
        if self._arange.numel() < n:
            self._arange = torch.arange(max(n, 2 * self._arange.numel()), device=self.device)
        return self._arange[:n]

    # ---- rollback --------------------------------------------------------------------------------

    def truncate(self, rid: int, length: int) -> None:
        """Roll `rid` back to `length` cached tokens. Which lengths can be restored depends on the layer
        kinds: full KV any length up to the end of the last forward; swa at most `max_draft_tokens + 1`
        positions back from that end (the ring's slack); mamba only lengths whose state the last forward
        kept (all of a short forward, the last `max_draft_tokens + 1` of a long one)."""
        req = self._req(rid)
        if length == req.length:
            return
        rb = req.rollback
        end = rb.end if rb else req.length
        lo = 0
        if rb is None and (self.swa_index or self.mamba_index):
            lo = req.length  # imported or never forwarded: no history to return to
        else:
            if self.mamba_index and rb is not None:
                lo = rb.min_len
            if self.swa_index:
                lo = max(lo, end - self.rollback_tokens)
        if not (lo <= length <= end):
            raise RuntimeFailure(f"cannot truncate request {rid} to {length}: restorable lengths are {lo}..{end}")
        if self.mamba_index:
            assert rb is not None
            for m in range(len(self.mamba_index)):
                self.ssm[m, req.slot] = rb.ssm[m][length - rb.min_len]
                j = length - rb.start
                self.conv[m, req.slot] = rb.xcat[m][j : j + self.cfg.mamba_d_conv - 1].transpose(0, 1)
        # Full KV beyond `length` is simply ignored and overwritten; the swa ring still holds the window
        # before `length` because the ring is max_draft_tokens longer than the window.
        req.length = length

    # ---- export / import -------------------------------------------------------------------------

    def export_request(self, rid: int) -> dict[str, torch.Tensor]:
        req = self._req(rid)
        out: dict[str, torch.Tensor] = {}
        if self.full_index:
            n = self.pages_needed(req.length)
            pages = self._pages(req)[:n]
            slots = (pages[:, None] * self.page_size + torch.arange(self.page_size, device=self.device)).reshape(-1)
            kv = self.kv[:, :, slots]
            out["kv"] = kv.reshape(kv.shape[0], 2, n, self.page_size, *kv.shape[-2:]).clone()
        if self.swa_index:
            pos = torch.arange(req.length - self.window, req.length, device=self.device)
            t = self.swa[:, :, req.slot * self.ring + pos.clamp(min=0) % self.ring].clone()
            t[:, :, pos < 0] = 0
            out["swa"] = t
        if self.mamba_index:
            out["mamba_conv"] = self.conv[:, req.slot].clone()
            out["mamba_ssm"] = self.ssm[:, req.slot].clone()
        return out

    def import_request(self, rid: int, tensors: dict[str, torch.Tensor], length: int) -> None:
        """Install an exported request as `rid` with `length` cached tokens (allocating it if needed)."""
        expected = {k: tuple(v) for k, v in self.export_shapes(length).items()}
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        if got != expected:
            raise RuntimeFailure(f"import of request {rid}: tensor shapes {got} do not match this cache {expected}")
        if rid not in self.requests:
            self.allocate(rid, length)
        elif not self.ensure_capacity(rid, length):
            raise RuntimeFailure(f"KV pool exhausted importing request {rid} ({length} tokens)")
        req = self.requests[rid]
        if self.full_index:
            n = self.pages_needed(length)
            pages = self._pages(req)[:n]
            slots = (pages[:, None] * self.page_size + torch.arange(self.page_size, device=self.device)).reshape(-1)
            kv = tensors["kv"].to(self.device, self.dtype)
            self.kv[:, :, slots] = kv.reshape(kv.shape[0], 2, n * self.page_size, *kv.shape[-2:])
        if self.swa_index:
            pos = torch.arange(length - self.window, length, device=self.device)
            keep = pos >= 0
            dst = req.slot * self.ring + pos[keep] % self.ring
            self.swa[:, :, dst] = tensors["swa"].to(self.device, self.dtype)[:, :, keep]
        if self.mamba_index:
            self.conv[:, req.slot] = tensors["mamba_conv"].to(self.device, self.dtype)
            self.ssm[:, req.slot] = tensors["mamba_ssm"].to(self.device, torch.float32)
        req.length = length
        req.rollback = None

    def export_shapes(self, length: int) -> dict[str, torch.Size]:
        cfg = self.cfg
        out: dict[str, torch.Size] = {}
        if self.full_index:
            n = self.pages_needed(length)
            out["kv"] = torch.Size((len(self.full_index), 2, n, self.page_size, cfg.num_kv_heads, cfg.head_dim))
        if self.swa_index:
            out["swa"] = torch.Size((len(self.swa_index), 2, self.window, cfg.num_kv_heads, cfg.head_dim))
        if self.mamba_index:
            out["mamba_conv"] = torch.Size((len(self.mamba_index), cfg.mamba_conv_dim, cfg.mamba_d_conv - 1))
            out["mamba_ssm"] = torch.Size(
                (len(self.mamba_index), cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_d_state)
            )
        return out

    # ---- forward context -------------------------------------------------------------------------

    def group(self, rids: Sequence[int], starts: Sequence[int], lens: Sequence[int]) -> Group:
        return Group(self, rids, starts, lens)

    def lone_base(self, rid: int, end: int) -> int | None:
        """The flat slot of `rid`'s position 0 when its positions 0 .. end-1 are one slice of the pool (pages
        consecutive and allocated), for `HybridForCausalLM.forward_lone`; None when they are not, or the
        model has swa or mamba layers (their state lives elsewhere): then use `group`. Marks `rid` as
        holding no rollback record: with full attention only, any length up to the end of a forward is
        restorable."""
        if self.swa_index or self.mamba_index:
            return None
        req = self._req(rid)
        base = self._contiguous_base(req)
        if base is None or end > len(req.pages) * self.page_size:
            return None
        req.rollback = None
        return base

    def kv_pools(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per full layer, its (keys, values) slot pools [slots, kv_heads, head_dim]."""
        return [(kv[0], kv[1]) for kv in self.kv.unbind(0)]


def _gather(store: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """store[slots] for slots [b, K] -> [b, K, ...]; index_select is much faster than advanced indexing."""
    return store.index_select(0, slots.reshape(-1)).view(*slots.shape, *store.shape[1:])


class Group:
    """`CacheContext` of one padded forward: items [b] of lengths `lens` starting at `starts`."""

    def __init__(self, cache: HybridCache, rids: Sequence[int], starts: Sequence[int], lens: Sequence[int]) -> None:
        self.cache = cache
        dev = cache.device
        self.reqs = [cache.requests[r] for r in rids]
        self.rids = list(rids)
        self.starts_list, self.lens_list = list(starts), list(lens)
        self.lmax = max(lens)
        if len(self.reqs) == 1:
            # One request (batch-1 decode, a verify, every draft forward): slices of cached tensors only.
            start, n = self.starts_list[0], self.lens_list[0]
            self.positions = cache._positions(start + n)[start:][None]
            self._valid = cache._true(n)[None]
            req = self.reqs[0]
            if req.slot_index is None:
                req.slot_index = torch.tensor([req.slot], dtype=torch.long, device=dev)
            self.slots = req.slot_index
        else:
            ar = torch.arange(self.lmax, device=dev)
            self._valid = ar[None, :] < self.lens[:, None]
            self.positions = self.starts[:, None] + ar[None, :]
            self.slots = torch.tensor([r.slot for r in self.reqs], dtype=torch.long, device=dev)
        self.short = self.lmax <= cache.rollback_tokens
        self.all_valid = min(lens) == self.lmax
        self.ends_list = [s + n for s, n in zip(self.starts_list, self.lens_list, strict=True)]
        self._key_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._masks: dict[str, torch.Tensor] = {}
        self._dst: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._pt: torch.Tensor | None = None
        self._entering: dict[int, torch.Tensor] = {}  # mamba layer -> the ssm states `mamba_state` gathered
        self._rollback = [
            _Rollback(start=s, end=s + n, min_len=s if self.short else s + n - min(n, cache.rollback_tokens) + 1)
            for s, n in zip(self.starts_list, self.lens_list, strict=True)
        ]
        for req, rb in zip(self.reqs, self._rollback, strict=True):
            req.rollback = rb

    @functools.cached_property
    def starts(self) -> torch.Tensor:
        return torch.tensor(self.starts_list, dtype=torch.long, device=self.cache.device)

    @functools.cached_property
    def lens(self) -> torch.Tensor:
        return torch.tensor(self.lens_list, dtype=torch.long, device=self.cache.device)

    @functools.cached_property
    def kpos_new(self) -> torch.Tensor:
        # padded queries get a huge position so they never act as keys; as queries they see everything
        return torch.where(self._valid, self.positions, torch.full_like(self.positions, _PAD_POS))

    @property
    def valid(self) -> torch.Tensor:
        return self._valid

    @functools.cached_property
    def valid_rows(self) -> torch.Tensor | None:
        # Worth its two index ops per layer only when padding is a good share of the rows (engine/model.py
        # DecoderLayer: a batch-8 verify of 13 real tokens in 48 rows ran 25% faster, 20 in 32 level, 29 in 32
        # 5% slower).
        if self.all_valid or 4 * sum(self.lens_list) > 3 * len(self.lens_list) * self.lmax:
            return None
        return torch.tensor([r * self.lmax + j for r, n in enumerate(self.lens_list) for j in range(n)],
                            dtype=torch.long, device=self.cache.device)

    @property
    def keep_states(self) -> int:
        return self.cache.rollback_tokens

    def full_plan(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor,
                                 torch.Tensor] | None:
        c = self.cache
        if c.swa_index or c.mamba_index or len(c.full_index) != c.kv.shape[0] or c.device.type != "cpu":
            return None
        slots, kpos = self._keys("full", "full", [0] * len(self.ends_list), self.ends_list)
        if self.all_valid:
            dst = self._slots("full", self.positions).reshape(-1)
        else:  # padding rows: a real slot to look up (their own item's first), then -1: no write
            pos = torch.where(self._valid, self.positions, torch.zeros_like(self.positions))
            dst = torch.where(self._valid, self._slots("full", pos), torch.full_like(pos, -1)).reshape(-1)
        return c.kv_pools(), dst, slots, kpos

    @property
    def max_position(self) -> int:
        return max(self.ends_list) - 1

    # ---- attention ----

    def page_tables(self) -> torch.Tensor:
        """Per-request page tables padded into one [b, max_pages] tensor (built once per forward)."""
        if self._pt is None:
            if len(self.reqs) == 1:
                self._pt = self.cache._pages(self.reqs[0])[None]
            else:
                # One tensor from the padded lists: a pad per request and a stack took ~70 us at batch 32.
                width = max(max(len(r.pages) for r in self.reqs), 1)
                self._pt = torch.tensor([r.pages + [0] * (width - len(r.pages)) for r in self.reqs],
                                        dtype=torch.long, device=self.cache.device)
        return self._pt

    def _slots(self, kind: str, pos: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Flat cache slots of positions `pos` ([b, n], or [n] with their batch `rows`)."""
        c = self.cache
        if kind == "full":
            pt = self.page_tables()
            page = pt.gather(1, pos // c.page_size) if rows is None else pt[rows, pos // c.page_size]
            return page * c.page_size + pos % c.page_size
        slot = self.slots[:, None] if rows is None else self.slots[rows]
        return slot * c.ring + pos % c.ring

    def _keys(self, name: str, kind: str, lo: list[int], hi: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat slots [b, K], key positions [b, K]) of positions [lo_i, hi_i) per item, padded with
        slot 0 at position _PAD_POS (never visible). Built once per forward, shared by the layers."""
        if name in self._key_cache:
            return self._key_cache[name]
        if kind == "swa" and len(self.reqs) == 1:
            c = self.cache
            pos = c._positions(hi[0])[lo[0]:][None]
            out = (pos % c.ring + self.reqs[0].slot * c.ring, pos)
            self._key_cache[name] = out
            return out
        if kind == "full" and len(self.reqs) == 1 and lo[0] == 0:
            # One request reading [0, end): a slice of its cached slot table and of one arange.
            end = hi[0]
            out = (self.cache._all_slots(self.reqs[0])[:end][None], self.cache._positions(end)[None])
            self._key_cache[name] = out
            return out
        dev = self.cache.device
        counts = [h - lo_ for lo_, h in zip(lo, hi, strict=True)]
        kmax = max(counts)
        ar = torch.arange(kmax, device=dev)
        pos = torch.tensor(lo, dtype=torch.long, device=dev)[:, None] + ar[None, :]
        if min(counts) == kmax:
            out = (self._slots(kind, pos), pos)
        else:
            ok = ar[None, :] < torch.tensor(counts, dtype=torch.long, device=dev)[:, None]
            pos0 = torch.where(ok, pos, torch.zeros_like(pos))
            out = (self._slots(kind, pos0), torch.where(ok, pos, torch.full_like(pos, _PAD_POS)))
        self._key_cache[name] = out
        return out

    def _mask(self, name: str, kpos: torch.Tensor, window: int | None) -> torch.Tensor:
        if name not in self._masks:
            mask = attention_mask(self.positions, kpos, window)
            if not self.all_valid:
                # rows of padded queries would be all-False (NaN from softmax): let them see everything
                mask = mask | ~self._valid[:, None, :, None]
            self._masks[name] = mask
        return self._masks[name]

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        c = self.cache
        ends = self.ends_list
        if layer in c.full_index:
            # Full layers never overwrite what this forward reads: write first, then read [0, end).
            store = c.kv[c.full_index[layer]]
            self._write("full", store, k, v)
            slots, kpos = self._keys("full", "full", [0] * len(ends), ends)
            return ops.attention(q, store, slots, kpos, self.positions, self._qvalid, 0,
                                 lambda: self._full_sdpa(q, store, slots, kpos))
        return self._swa_attention(layer, q, k, v)

    def _full_sdpa(self, q: torch.Tensor, store: torch.Tensor, slots: torch.Tensor, kpos: torch.Tensor) -> torch.Tensor:
        """A full layer's attention in torch: sdpa over the keys up to each item's end (written already)."""
        c, ends = self.cache, self.ends_list
        # single-token items that all end at the same position see every cached key: no mask needed
        mask = None if (self.lmax == 1 and min(ends) == max(ends)) else self._mask("full", kpos, None)
        base = c._contiguous_base(self.reqs[0]) if len(self.reqs) == 1 else None
        if base is not None:
            # one request on consecutive pages: its keys are a view of the pool, no gather
            return sdpa(q, store[0].narrow(0, base, ends[0])[None], store[1].narrow(0, base, ends[0])[None], mask)
        return sdpa(q, _gather(store[0], slots), _gather(store[1], slots), mask)

    def _swa_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        c = self.cache
        ends = self.ends_list
        store = c.swa[c.swa_index[layer]]
        lo = [max(0, s - c.window + 1) for s in self.starts_list]
        if self.short:
            # The ring holds window + max_draft_tokens positions, so a short forward fits next to the
            # window before it: write first, then read [start - window + 1, end).
            self._write("swa", store, k, v)
            slots, kpos = self._keys("swa", "swa", lo, ends)
            return ops.attention(q, store, slots, kpos, self.positions, self._qvalid, c.window,
                                 lambda: sdpa(q, _gather(store[0], slots), _gather(store[1], slots),
                                              self._mask("swa", kpos, c.window)))
        # A long forward would overwrite its own window in the ring: read the cached part first.
        slots, kpos_old = self._keys("swa_old", "swa", lo, self.starts_list)
        keys = torch.cat((_gather(store[0], slots), k), dim=1)
        vals = torch.cat((_gather(store[1], slots), v), dim=1)
        kpos = torch.cat((kpos_old, self.kpos_new), dim=1)
        out = sdpa(q, keys, vals, self._mask("swa_long", kpos, c.window))
        self._write("swa", store, k, v)
        return out

    @property
    def _qvalid(self) -> torch.Tensor | None:
        """The queries' validity [b, L] (False at padding), or None when every query is real."""
        return None if self.all_valid else self._valid

    def _write(self, kind: str, store: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store this forward's k/v ([b, L, KV, d]) at their positions (index computed once per kind)."""
        if kind not in self._dst and kind == "full" and len(self.reqs) == 1:
            # One request writing [start, start + n): a slice of its slot table.
            start, n = self.starts_list[0], self.lens_list[0]
            self._dst[kind] = (self.cache._all_slots(self.reqs[0])[start : start + n], None)
        if kind not in self._dst:
            c = self.cache
            sel = self._valid
            if kind == "swa" and self.lmax > c.ring:
                # only the last `ring` positions of each item survive in the ring anyway
                sel = sel & (self.positions >= (self.starts + self.lens)[:, None] - c.ring)
            if bool(sel.all()):
                self._dst[kind] = (self._slots(kind, self.positions).reshape(-1), None)
            else:
                flat = torch.nonzero(sel.reshape(-1), as_tuple=True)[0]
                rows = flat // self.lmax
                self._dst[kind] = (self._slots(kind, self.positions.reshape(-1)[flat], rows), flat)
        dst, src = self._dst[kind]
        kf, vf = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
        if src is not None:
            kf, vf = kf[src], vf[src]
        store[0].index_copy_(0, dst, kf)
        store[1].index_copy_(0, dst, vf)

    # ---- mamba ----

    def mamba_state(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.cache.mamba_index[layer]
        h0 = self._entering[layer] = self.cache.ssm[m, self.slots]  # a copy: commit overwrites the cache's
        return self.cache.conv[m, self.slots], h0

    def mamba_commit(self, layer: int, xcat: torch.Tensor, tail: torch.Tensor) -> None:
        c = self.cache
        m = c.mamba_index[layer]
        dconv = c.cfg.mamba_d_conv
        h0 = self._entering.pop(layer)  # the forward read it from here (the scans never write it in place)
        # Padding has dt = 0, so every state after an item's last real token equals its final state.
        c.ssm[m, self.slots] = tail[:, -1].to(torch.float32)
        idx = self.lens[:, None] + torch.arange(dconv - 1, device=c.device)[None, :]  # conv inputs at the end
        final_conv = xcat.gather(1, idx[..., None].expand(-1, -1, xcat.shape[-1]))
        c.conv[m, self.slots] = final_conv.transpose(1, 2).to(c.dtype)
        keep = tail.shape[1]
        # short: tail[i, j] is the state after position j of the padded group (keep == lmax); with the entering
        # state in front, row i's lengths start .. start + n are one view of one cat for the whole group
        every = torch.cat((h0[:, None], tail), dim=1) if self.short else tail
        for i, rb in enumerate(self._rollback):
            n = self.lens_list[i]
            if self.short:
                states = every[i, : n + 1]
            else:
                states = tail[i, keep - (rb.end - rb.min_len + 1) :]
            rb.ssm.append(states)
            rb.xcat.append(xcat[i, : dconv - 1 + n])

    def mamba_pools(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]] | None:
        c = self.cache
        m = c.mamba_index[layer]
        conv, ssm = c.conv[m], c.ssm[m]
        if conv.dtype != torch.float32 or not (conv.is_contiguous() and ssm.is_contiguous()):
            return None
        return conv, ssm, [r.slot for r in self.reqs], self.lens_list

    @property
    def mamba_keep_rows(self) -> int:
        """How many of a request's last states `mamba_keep` needs (`SmallGemm.mamba_short`'s `keep`): every
        one, the entering state first, when short; the last rollback_tokens of a prompt."""
        return max(n + 1 - (rb.min_len - rb.start) for n, rb in zip(self.lens_list, self._rollback, strict=True))

    def mamba_keep(self, layer: int, xcat: torch.Tensor, states: torch.Tensor) -> None:
        """Keep the kernel's states and conv inputs for rollback: states [b, keep, H, P, N] as `mamba_short`
        returns them, request i's row j the state at length start + off_i + j, off_i = max(0, n_i + 1 - keep)."""
        dconv = self.cache.cfg.mamba_d_conv
        keep = states.shape[1]
        for i, rb in enumerate(self._rollback):
            n = self.lens_list[i]
            off = max(0, n + 1 - keep)
            # the states for lengths min_len .. end: all of them when short, the last rollback_tokens else
            assert rb.min_len - rb.start >= off, "mamba_short kept too few states for this rollback"
            rb.ssm.append(states[i, rb.min_len - rb.start - off : n + 1 - off])
            rb.xcat.append(xcat[i, : dconv - 1 + n])
