"""The decoder-only model family: per-layer kind `full` attention, `swa` (sliding window) or `mamba`.

One module tree serves three model families: the builtin hybrid (`SpecctlHybridForCausalLM`), Llama and
Qwen2. Parameter names follow Hugging Face's Llama layout (`model.embed_tokens.weight`,
`model.layers.{i}.self_attn.q_proj.weight`, ..., `model.norm.weight`, `lm_head.weight`), so Hugging Face
safetensors load by name; mamba layers hold their mixer under `model.layers.{i}.mixer.*` (Mamba-2 names).

Two ways to run it:

* `HybridForCausalLM.forward(input_ids)` — a plain full-sequence forward with no cache (training and the
  reference the cache path is tested against).
* `HybridForCausalLM.forward_hidden(input_ids, positions, ctx)` — the serving path. Items are padded to
  one `[batch, length]` group; every attention layer hands its q/k/v to `ctx.attention(...)` and every
  mamba layer reads/writes its per-request state through `ctx.mamba_state(...)` / `ctx.mamba_commit(...)`.
  The cache (engine/cache.py) implements that context; the model never knows about pages or slots.

Mamba layer maths (Mamba-2 style, scalar decay per head, one group of B/C):

    h_t = exp(dt_t * A) h_{t-1} + dt_t * x_t B_t^T        h: [heads, head_dim, d_state]
    y_t = h_t C_t + D x_t

after a causal depthwise conv over (x, B, C). Prefill and training use the chunked parallel (SSD) form;
single-token decode uses the recurrence. Both are tested to agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from specctl.engine import ops
from specctl.engine.ops import PackedLinear
from specctl.schemas.model_facts import ModelFacts

SSD_CHUNK = 64
# A prompt's Mamba mixer runs the small-row kernel's recurrence (`mamba_short`, position by position, keeping only
# the states a rollback can reach) when a position's state has at most this many values: the builtin hybrid's
# 8 x 48 x 16 = 6,144. There it beats the chunked torch form (dozens of small ops per chunk): a forward of
# builtin:tiny-hybrid over 160-token prompts took 8.8 -> 7.4 ms for one and 70.6 -> 57.4 ms for eight (one
# thread, medians of 15, three alternating runs); spec_bench's code runs at batch 8 spent 300 -> 245 ms of
# CPU in prefill. A model with a large state (Mamba-2 at scale: 64 x 64 x 128) keeps the chunked form, whose
# matmuls do a prompt's work in far fewer steps.
RECURRENCE_MAX_STATE = 16384
CONV_UNFOLD_MAX_LEN = 8  # causal_conv: longer inputs take F.conv1d
# torch >= 2.5 shares K/V heads inside SDPA; older versions need them repeated (pyproject allows torch 2.1).
_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
_SDPA_GQA = _TORCH >= (2, 5)
Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sign-folded sin), each [b, L, 1, head_dim]
# forward_lone: spans of more tokens than this (a new request's prompt) attend alone, not padded with the rest
LONE_SHORT = 16
PACKED_MAX_BYTES = 1 << 30  # packing keeps a second copy of the weights: only for models up to 1 GiB


@dataclass(frozen=True)
class ModelConfig:
    """Shape of one model, read from its config.json (through `ModelFacts`)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_kinds: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mamba_d_state: int = 16
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_head_dim: int = 64
    max_position_embeddings: int = 4096
    # Hugging Face rope scaling ({"rope_type": "llama3" | "linear", ...}) as sorted items, or None.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_expand * self.hidden_size

    @property
    def mamba_heads(self) -> int:
        return self.mamba_d_inner // self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the causal conv: x (d_inner) then B and C (d_state each)."""
        return self.mamba_d_inner + 2 * self.mamba_d_state

    @classmethod
    def from_facts(cls, facts: ModelFacts) -> ModelConfig:
        cfg: dict[str, Any] = facts.config
        arch = facts.architecture
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):  # Hugging Face allows several; the first one is the canonical stop token
            eos = eos[0] if eos else None
        # transformers >= 5 writes rope settings under `rope_parameters`, older versions at top level
        raw_rope = cfg.get("rope_parameters")
        rope: dict[str, Any] = raw_rope if isinstance(raw_rope, dict) else {}
        theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        scaling = rope if rope.get("rope_type", "default") != "default" else cfg.get("rope_scaling")
        if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
        # Qwen2 always carries q/k/v biases; Llama only when `attention_bias` says so.
        bias = arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=facts.vocab_size,
            hidden_size=facts.hidden_size,
            intermediate_size=int(cfg.get("intermediate_size", 4 * facts.hidden_size)),
            layer_kinds=facts.layer_kinds,
            num_heads=facts.num_attention_heads,
            num_kv_heads=facts.num_key_value_heads,
            head_dim=facts.head_dim,
            sliding_window=facts.sliding_window,
            rope_theta=theta,
            rope_scaling=tuple(sorted(scaling.items())) if isinstance(scaling, dict) else None,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bias,
            mamba_d_state=int(cfg.get("mamba_d_state", 16)),
            mamba_d_conv=int(cfg.get("mamba_d_conv", 4)),
            mamba_expand=int(cfg.get("mamba_expand", 2)),
            mamba_head_dim=int(cfg.get("mamba_head_dim", 64)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos,
        )


class CacheContext(Protocol):
    """What the serving path needs from the cache for one padded group of items (engine/cache.py)."""

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [b, L, H, d], k/v [b, L, KV, d] (rotary applied) -> attention output [b, L, H, d]; stores k/v."""
        ...

    def mamba_state(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv state [b, conv_dim, d_conv-1], ssm state [b, heads, head_dim, d_state]) before this forward."""
        ...

    def mamba_commit(self, layer: int, xcat: torch.Tensor, tail: torch.Tensor) -> None:
        """Store the conv inputs (old conv state ++ new, [b, d_conv-1+L, conv_dim]) and the ssm states after
        each of the last `tail.shape[1]` positions ([b, keep, heads, head_dim, d_state])."""
        ...

    def mamba_pools(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]] | None:
        """For a kernel that reads and writes the states in place: (conv pool [slots, conv_dim, d_conv-1],
        ssm pool [slots, heads, head_dim, d_state], each item's slot, each item's length), float32 and
        contiguous; None when the pools are not."""
        ...

    @property
    def mamba_keep_rows(self) -> int:
        """How many of a request's last states `mamba_keep` needs (the kernel's `keep`)."""
        ...

    def mamba_keep(self, layer: int, xcat: torch.Tensor, states: torch.Tensor) -> None:
        """After such a kernel stored the final states: keep what rollback needs of the conv inputs
        ([b, d_conv-1+L, conv_dim]) and of the states ([b, 1 + L, ...], the entering one first)."""
        ...

    @property
    def valid(self) -> torch.Tensor:
        """[b, L] bool: True where the padded group holds a real token."""
        ...

    @property
    def valid_rows(self) -> torch.Tensor | None:
        """Indices of the real tokens in the group's rows flattened ([b * L]), or None when every row is one."""
        ...

    @property
    def keep_states(self) -> int:
        """How many trailing per-position mamba states the cache wants (for rollback)."""
        ...

    @property
    def max_position(self) -> int:
        """The largest position of any token in this forward."""
        ...

    @property
    def positions(self) -> torch.Tensor:
        """[b, L] the position of every row (padding rows continue their item's positions)."""
        ...

    @property
    def all_valid(self) -> bool:
        """Every row of the group is a real token (no padding)."""
        ...

    def full_plan(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor,
                                 torch.Tensor] | None:
        """For a model whose layers are all full attention, what a kernel that runs them all needs: (per layer
        its (keys, values) pools [slots, KV, d], each row's slot to write [b * L] (-1 at padding), the
        items' key slots [b, K] and key positions [b, K] as `attention` reads them); None where the
        cache cannot hand them out (then the layers go one by one through `attention`)."""
        ...


def _linear(
    packed: PackedLinear | None, weight: torch.Tensor | None, bias: torch.Tensor | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x W^T + b: the packed kernels when the weight has them, else F.linear."""
    if packed is not None:
        return packed
    assert weight is not None

    def linear(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight, bias)

    return linear


def apply_linear(x: torch.Tensor, lin: nn.Linear) -> torch.Tensor:
    packed: PackedLinear | None = getattr(lin, "packed", None)
    return packed(x) if packed is not None else lin(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Rotary inverse frequencies (float32, cpu), with Hugging Face's `linear` / `llama3` scaling."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device="cpu") / d))
    if cfg.rope_scaling is None:
        return inv
    sc = dict(cfg.rope_scaling)
    kind = sc.get("rope_type", sc.get("type"))
    factor = float(sc.get("factor", 1.0))
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        old = float(sc["original_max_position_embeddings"])
        low, high = float(sc.get("low_freq_factor", 1.0)), float(sc.get("high_freq_factor", 4.0))
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope scaling {kind!r}")


def rope_table(inv_freq: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin tables [n, head_dim] for positions 0 .. n-1 (float32, on inv_freq's device).

    The sin table holds -sin in its first half, so `rotary` needs no negation: for Llama's rotate-half,
    x * cos + cat(-x2, x1) * sin == x * cos + cat(x2, x1) * sin_folded, exactly (negation is exact)."""
    freqs = torch.arange(n, dtype=torch.float32, device=inv_freq.device)[:, None] * inv_freq  # [n, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin()
    sin[:, : inv_freq.shape[0]].neg_()
    return emb.cos(), sin


def rope_cos_sin(positions: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> Rope:
    """cos/sin [b, L, 1, d] for positions [b, L]: rows of the tables (`rope_table`), two gathers per forward
    shared by every layer, instead of recomputing cos and sin of every position."""
    cos, sin = table
    return F.embedding(positions, cos)[:, :, None, :], F.embedding(positions, sin)[:, :, None, :]


def rotary(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Apply rotary embeddings (Llama's rotate-half convention). x [b, L, h, d]; rope from `rope_cos_sin`."""
    cos, sin = rope
    xf = x.float()
    # the halves swapped by one roll (the same values as cat(x2, x1), in one op instead of three: 8.5 vs
    # 5.3 us a call at a decode step's [1, 4, 64]); the sign lives in the sin table
    swapped = torch.roll(xf, x.shape[-1] // 2, dims=-1)
    return (xf * cos + swapped * sin).to(x.dtype)


def attention_mask(qpos: torch.Tensor, kpos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean [b, 1, Lq, Lk] mask: causal, and within the last `window` positions (self included) for swa."""
    allowed = kpos[:, None, :] <= qpos[:, :, None]
    if window is not None:
        allowed &= kpos[:, None, :] > qpos[:, :, None] - window
    return allowed[:, None]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, window: int | None) -> None:
        super().__init__()
        self.layer = layer
        self.window = window
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, cfg.num_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, h, bias=False)
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by fuse()
        self.qkv_packed: PackedLinear | None = None  # set by pack()

    def fuse(self) -> None:
        """Serve q/k/v with one matmul: the three weights become views into one concatenated tensor
        (same memory, same parameter names for loading and saving)."""
        w = torch.cat((self.q_proj.weight.data, self.k_proj.weight.data, self.v_proj.weight.data))
        b = None
        if self.q_proj.bias is not None:
            b = torch.cat((self.q_proj.bias.data, self.k_proj.bias.data, self.v_proj.bias.data))
        nq, nk = self.q_proj.out_features, self.k_proj.out_features
        for lin, lo, hi in ((self.q_proj, 0, nq), (self.k_proj, nq, nq + nk), (self.v_proj, nq + nk, nq + 2 * nk)):
            lin.weight.data = w[lo:hi]
            if b is not None:
                lin.bias.data = b[lo:hi]
        self.qkv = (w, b)

    def pack(self) -> None:
        if self.qkv is not None:
            self.qkv_packed = PackedLinear(*self.qkv)
        self.o_proj.packed = PackedLinear(self.o_proj.weight, None)  # type: ignore[assignment]

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rope: Rope, ctx: CacheContext | None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[b, n, hidden] -> [b, n, hidden]; with `rows` (flat indices into b * n) only those rows' outputs,
        [len(rows), hidden] (every position is still cached and attended)."""
        b, n, _ = x.shape
        if self.qkv is not None:
            nq, nk = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            qkv = self.qkv_packed(x) if self.qkv_packed is not None else F.linear(x, *self.qkv)
            # q and k sit side by side in the fused output: rotate them with one call, split the result.
            qk = rotary(qkv[..., : nq + nk].view(b, n, self.num_heads + self.num_kv_heads, self.head_dim), rope)
            q, k = qk[:, :, : self.num_heads], qk[:, :, self.num_heads :]
            v = qkv[..., nq + nk :].view(b, n, self.num_kv_heads, self.head_dim)
        else:
            q = rotary(self.q_proj(x).view(b, n, self.num_heads, self.head_dim), rope)
            k = rotary(self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim), rope)
            v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim)
        if ctx is not None:
            o = ctx.attention(self.layer, q, k, v)
        else:
            mask = attention_mask(positions, positions, self.window)
            o = sdpa(q, k, v, mask)
        if rows is not None:
            return apply_linear(o.reshape(b * n, self.num_heads * self.head_dim).index_select(0, rows), self.o_proj)
        return apply_linear(o.reshape(b, n, self.num_heads * self.head_dim), self.o_proj)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention. q [b, Lq, H, d], k/v [b, Lk, KV, d], mask [b, 1, Lq, Lk] or None (every key
    visible) -> [b, Lq, H, d]."""
    rep = q.shape[2] // k.shape[2]
    if rep > 1 and not _SDPA_GQA:
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
    kw = {"enable_gqa": True} if rep > 1 and _SDPA_GQA else {}
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, **kw)
    return o.transpose(1, 2)


def ssd_chunk(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, bm: torch.Tensor, cm: torch.Tensor, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the SSD parallel form, all in float32.

    x [b, q, H, P], dt [b, q, H] (0 at padding), a = dt*A [b, q, H], bm/cm [b, q, N], h [b, H, P, N] the state
    entering the chunk. Returns y [b, q, H, P] (without the D skip) and the state after the chunk.
    """
    q = x.shape[1]
    # Heads lead ([b, H, ...]) so the two big contractions are plain batched matmuls on contiguous operands
    # (einsum's permute-and-copy plans cost 275 vs 211 us per 64-token chunk at b1; same values bit for bit).
    cs = torch.cumsum(a, dim=1).transpose(1, 2)  # [b, H, q] log-decay from the chunk start through t
    # seg[t, s] = sum_{s < r <= t} a_r: the decay applied to the input of step s when read at step t.
    seg = cs[:, :, :, None] - cs[:, :, None, :]  # [b, H, t, s]
    causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
    # exp first, then zero the future: exp(-inf) is twice the price of exp, and exp overflowing to inf above
    # the diagonal is replaced, never multiplied
    decay = torch.exp(seg).masked_fill_(~causal, 0.0)
    cb = torch.bmm(cm, bm.transpose(1, 2))  # [b, t, s]: C_t . B_s
    w = decay * cb[:, None] * dt.transpose(1, 2)[:, :, None, :]  # [b, H, t, s]
    xh = x.transpose(1, 2)  # [b, H, s, P]
    b, heads, p, n = h.shape
    y_h0 = torch.matmul(cm, h.reshape(b, heads * p, n).transpose(1, 2)).view(b, q, heads, p)  # C_t h0
    y = torch.matmul(w, xh).transpose(1, 2) + torch.exp(cs).transpose(1, 2)[..., None] * y_h0
    # state after the chunk: decayed old state + every input decayed to the chunk's end
    to_end = torch.exp(cs[:, :, -1:] - cs) * dt.transpose(1, 2)  # [b, H, q]
    h_new = torch.exp(cs[:, :, -1])[..., None, None] * h + torch.matmul(to_end[..., None, :] * xh.transpose(2, 3),
                                                                         bm[:, None])
    return y, h_new


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    bm: torch.Tensor,
    cm: torch.Tensor,
    h0: torch.Tensor,
    keep: int = 0,
    chunk: int = SSD_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Chunked parallel scan over a whole sequence (float32; chunks aligned to its end), with the states
    after each of the last `keep` positions ([b, keep, H, P, N]) or None.

    The chunked form covers all but the last `keep` positions and the recurrence (`ssd_short`) the rest:
    asking the parallel form for per-position states costs a [b, keep, s, H, P, N] product (a prefill of
    160 tokens with keep 8: 1.73 vs 0.73 ms), keep multiply-adds cost tens of microseconds."""
    length = x.shape[1]
    keep = min(keep, length)
    if keep:
        cut = length - keep
        head = ssd_scan(x[:, :cut], dt[:, :cut], A, bm[:, :cut], cm[:, :cut], h0, 0, chunk) if cut else None
        h_cut = head[1] if head is not None else h0
        y_tail, states = ssd_short(x[:, cut:], dt[:, cut:], A, bm[:, cut:], cm[:, cut:], h_cut)
        y = torch.cat((head[0], y_tail), dim=1) if head is not None else y_tail
        return y, states[:, -1], states
    a = dt * A
    first = length % chunk or min(chunk, length)
    bounds = [0, first] + list(range(first + chunk, length + 1, chunk))
    ys = []
    h = h0
    for i in range(len(bounds) - 1):
        s, e = bounds[i], bounds[i + 1]
        y, h = ssd_chunk(x[:, s:e], dt[:, s:e], a[:, s:e], bm[:, s:e], cm[:, s:e], h)
        ys.append(y)
    return torch.cat(ys, dim=1), h, None


def ssd_short(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, bm: torch.Tensor, cm: torch.Tensor, h0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every per-position state of a short forward (a speculative verify) and y from them, by the recurrence.

    x [b, q, H, P], dt [b, q, H] (0 at padding), bm/cm [b, q, N], h0 [b, H, P, N]. Returns y [b, q, H, P]
    (without the D skip) and the states after each position [b, q, H, P, N], which the cache keeps for
    rollback. Each position's decay exp(dt_t A) and input dt_t x_t B_t^T are formed for all positions at
    once, then one fused multiply-add per position writes

        h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T

    straight into the states tensor, and y_t = h_t C_t is one contraction over all positions. For the
    q <= max_draft_tokens + 1 positions of a verify this beats the quadratic (SSD) form, whose masks and
    [q, q] decay products cost more ops than q multiply-adds, and
    it is the recurrence `ssd_step` runs, so a verify's states are plain decoding's.
    """
    da = torch.exp(dt * A)[..., None, None]  # [b, q, H, 1, 1]
    u = (dt[..., None] * x)[..., None] * bm[:, :, None, None, :]  # [b, q, H, P, N]
    states = torch.empty_like(u)
    h = h0
    for t in range(x.shape[1]):
        h = torch.addcmul(u[:, t], da[:, t], h, out=states[:, t])
    # y_t = h_t C_t as a multiply and a sum over N: at [8, 2] einsum's batched-matmul plan cost 58 vs 32 us,
    # and ssd_step reduces the same way, so verify and decode agree bit for bit on every row
    return (states * cm[:, :, None, None, :]).sum(-1), states


def causal_conv(xcat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv of the serving path: xcat [b, C, d_conv-1+L] -> [b, C, L].

    conv[c, t] = bias[c] + sum_j weight[c, 0, j] xcat[c, t + j]. For the few positions of a decode step or a
    verify it is one batched matrix-vector product over an unfold (oneDNN's grouped convolution has a fixed
    cost of ~40 us per call; the product takes 9 us at b1 L1, 47 at b8 L4); for a prompt it is
    `F.conv1d` (b1 L160: 56 us, where the unfold product takes 820 and einsum 700).
    """
    if xcat.shape[-1] - weight.shape[-1] + 1 > CONV_UNFOLD_MAX_LEN:
        return F.conv1d(xcat, weight, bias, groups=weight.shape[0])
    windows = xcat.unfold(2, weight.shape[-1], 1)  # [b, C, L, d_conv] (a view)
    return torch.matmul(windows, weight[:, 0, :, None]).squeeze(-1) + bias[:, None]


def ssd_step(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, bm: torch.Tensor, cm: torch.Tensor, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form for one token: x [b, H, P], dt [b, H], bm/cm [b, N], h [b, H, P, N]."""
    da = torch.exp(dt * A)[..., None, None]
    h = da * h + (dt[..., None, None] * x[..., None]) * bm[:, None, None, :]
    y = (h * cm[:, None, None, :]).sum(-1)  # the reduction ssd_short uses (see there)
    return y, h


def _take_rows(y: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """y [b, n, f] itself, or its flat rows `rows` [len(rows), f]."""
    return y if rows is None else y.reshape(-1, y.shape[-1]).index_select(0, rows)


class GatedRMSNorm(nn.Module):
    """Mamba-2's output norm: RMSNorm(y * silu(z))."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        g = (y.float() * F.silu(z.float()))
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.to(y.dtype)


class Mamba(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.d_inner, self.d_state, self.d_conv = cfg.mamba_d_inner, cfg.mamba_d_state, cfg.mamba_d_conv
        self.heads, self.head_dim = cfg.mamba_heads, cfg.mamba_head_dim
        self.prompt_by_recurrence = self.heads * self.head_dim * self.d_state <= RECURRENCE_MAX_STATE
        self.conv_dim = cfg.mamba_conv_dim
        self.in_proj = nn.Linear(cfg.hidden_size, 2 * self.d_inner + 2 * self.d_state + self.heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.d_conv, groups=self.conv_dim, bias=True)
        self.dt_bias = nn.Parameter(torch.zeros(self.heads))
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = GatedRMSNorm(self.d_inner, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.d_inner, cfg.hidden_size, bias=False)
        # see _short_consts: (the parameters, their versions, what was built from them)
        self._consts: tuple[tuple[torch.Tensor, ...], tuple[int, ...], ops.MambaConsts] | None = None

    @torch.no_grad()
    def init_ssm(self, generator: torch.Generator | None = None) -> None:
        """Mamba-2's initialisation: A in [1, 16], dt in [1e-3, 1e-1] log-uniform (dt_bias = softplus^-1)."""
        self.A_log.copy_(torch.log(torch.empty(self.heads).uniform_(1.0, 16.0, generator=generator)))
        dt = torch.exp(torch.rand(self.heads, generator=generator) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.D.fill_(1.0)

    def forward(self, x: torch.Tensor, ctx: CacheContext | None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[b, n, hidden] -> [b, n, hidden]; with `rows` (flat indices into b * n) only those rows' outputs,
        [len(rows), hidden] (the state still advances over every position)."""
        n = x.shape[1]
        zxbcdt = apply_linear(x, self.in_proj)
        if ctx is not None and (n == 1 or n <= ctx.keep_states or self.prompt_by_recurrence):
            # a decode step, a verify, or a prompt of a small state: the position-by-position recurrence
            y = ops.mamba_mixer(zxbcdt, lambda sg: self._short_kernel(sg, zxbcdt, ctx),
                                lambda: self._mixer(zxbcdt, ctx))
        else:
            y = self._mixer(zxbcdt, ctx)
        return apply_linear(_take_rows(y, rows), self.out_proj)

    def _mixer(self, zxbcdt: torch.Tensor, ctx: CacheContext | None) -> torch.Tensor:
        """The mixer's torch form after in_proj: zxbcdt [b, n, width] -> the input of out_proj [b, n, d_inner],
        the states read from and committed to `ctx` (None: zero states, nothing kept)."""
        b, n, _ = zxbcdt.shape
        if ctx is None:
            conv_state = zxbcdt.new_zeros(b, self.conv_dim, self.d_conv - 1)
            h0 = zxbcdt.new_zeros(b, self.heads, self.head_dim, self.d_state, dtype=torch.float32)
            valid = None
            keep = 0
        else:
            keep = ctx.keep_states
            conv_state, h0 = ctx.mamba_state(self.layer)
            valid = ctx.valid
        z, xbc, dt = torch.split(zxbcdt, [self.d_inner, self.conv_dim, self.heads], dim=-1)
        # Causal depthwise conv over (previous d_conv-1 inputs ++ this forward's inputs).
        xcat = torch.cat((conv_state.to(xbc.dtype), xbc.transpose(1, 2)), dim=2)  # [b, C, d_conv-1+L]
        if ctx is None:
            conv = F.conv1d(xcat, self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim)  # [b, C, L]
        else:
            conv = causal_conv(xcat, self.conv1d.weight, self.conv_bias)
        xbc = F.silu(conv.transpose(1, 2))
        xs, bm, cm = torch.split(xbc, [self.d_inner, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float())
        if valid is not None:
            # Padding positions must leave the state untouched: dt = 0 means decay 1 and no input.
            dt = dt * valid[..., None]
        A = -torch.exp(self.A_log.float())
        xh = xs.float().view(b, n, self.heads, self.head_dim)
        if n == 1:  # decode: the recurrence is cheaper than the chunked form
            y, h = ssd_step(xh[:, 0], dt[:, 0], A, bm[:, 0].float(), cm[:, 0].float(), h0.float())
            y = y[:, None]
            tail = h[:, None] if keep else None
        else:
            # a prompt, or a speculative verify (n <= keep: all by the recurrence, every per-position state kept)
            y, h, tail = ssd_scan(xh, dt, A, bm.float(), cm.float(), h0.float(), keep=keep)
        if ctx is not None:
            ctx.mamba_commit(self.layer, xcat.transpose(1, 2), tail if tail is not None else h[:, None])
        y = y + self.D.float()[:, None] * xh
        out: torch.Tensor = self.norm(y.reshape(b, n, self.d_inner).to(zxbcdt.dtype), z)
        return out

    def _short_kernel(self, sg: ops.SmallGemm, zxbcdt: torch.Tensor, ctx: CacheContext) -> torch.Tensor | None:
        """A decode step's, a verify's or (a small state: RECURRENCE_MAX_STATE) a prompt's conv, scan and gated
        norm in one call of the small-row kernel's `mamba_short`, committed to the cache, with the states a
        rollback can reach; the input of out_proj. None where the cache keeps no pools for the kernel (nothing
        committed then): the torch form runs.

        Why: at batch 8 this mixer was the costliest layer of a step, ~45 small torch ops of a few
        microseconds each (582 us per decode step, 1053 per 4-position verify here), and a verify kept its
        per-position states by one torch op per position."""
        pools = ctx.mamba_pools(self.layer)
        if pools is None:
            return None
        y, xcat, states = sg.mamba_short(zxbcdt, *pools, self._short_consts(), keep=ctx.mamba_keep_rows)
        ctx.mamba_keep(self.layer, xcat, states)
        return y

    @property
    def conv_bias(self) -> torch.Tensor:
        """The conv's bias (built with one: `nn.Conv1d(..., bias=True)`)."""
        bias = self.conv1d.bias
        assert bias is not None
        return bias

    def _short_consts(self) -> ops.MambaConsts:
        """The weights `mamba_short` takes, in its layouts; rebuilt when a parameter changes in place."""
        cached = self._consts
        params: tuple[torch.Tensor, ...] = cached[0] if cached is not None else (
            self.conv1d.weight, self.conv_bias, self.dt_bias, self.A_log, self.D, self.norm.weight)
        version = tuple(t._version for t in params)
        if cached is None or cached[1] != version:
            with torch.no_grad():
                consts = ops.MambaConsts(
                    d_inner=self.d_inner, conv_dim=self.conv_dim, heads=self.heads, head_dim=self.head_dim,
                    d_state=self.d_state, d_conv=self.d_conv, eps=self.norm.eps,
                    conv_wt=self.conv1d.weight.detach()[:, 0, :].t().float().contiguous(),
                    conv_b=self.conv_bias.detach().float().contiguous(),
                    dt_bias=self.dt_bias.detach().float().contiguous(),
                    A=(-torch.exp(self.A_log.detach().float())).contiguous(),
                    D=self.D.detach().float().contiguous(), norm=self.norm.weight.detach().float().contiguous())
            self._consts = (params, version, consts)
            return consts
        return cached[2]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: torch.Tensor | None = None  # set by fuse()
        self.gate_up_packed: PackedLinear | None = None  # set by pack()

    def fuse(self) -> None:
        """One matmul for gate and up (their weights become views into the fused tensor)."""
        w = torch.cat((self.gate_proj.weight.data, self.up_proj.weight.data))
        n = self.gate_proj.out_features
        self.gate_proj.weight.data, self.up_proj.weight.data = w[:n], w[n:]
        self.gate_up = w

    def pack(self) -> None:
        if self.gate_up is not None:
            self.gate_up_packed = PackedLinear(self.gate_up, None)
        self.down_proj.packed = PackedLinear(self.down_proj.weight, None)  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gu = self.gate_up_packed(x) if self.gate_up_packed is not None else F.linear(x, self.gate_up)
            gate, up = gu.chunk(2, dim=-1)
            return apply_linear(F.silu(gate) * up, self.down_proj)
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.kind = cfg.layer_kinds[layer]
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if self.kind == "mamba":
            self.mixer = Mamba(cfg, layer)
        else:
            window = cfg.sliding_window if self.kind == "swa" else None
            self.self_attn = Attention(cfg, layer, window)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        # Serving binds the submodules' forwards once (`bind_serving`): a Module attribute lookup and call
        # cost about a microsecond each, and a tiny model's step makes dozens of them.
        self.serving: tuple[Callable[..., torch.Tensor], ...] | None = None

    def bind_serving(self) -> None:
        mixer = self.mixer if self.kind == "mamba" else self.self_attn
        self.serving = (self.input_layernorm.forward, mixer.forward, self.post_attention_layernorm.forward,
                        self.mlp.forward)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rope: Rope, ctx: CacheContext | None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [b, n, hidden] -> [b, n, hidden]. With `rows` (flat indices into b * n; the last layer of a
        forward whose caller reads only those positions, as a prompt's last): [len(rows), hidden], every
        position cached but the output projection, residual and MLP only for those rows (a prompt's
        other rows would go through them only to be dropped)."""
        if self.serving is not None:
            norm1, mix, norm2, mlp = self.serving
        else:
            norm1, norm2, mlp = self.input_layernorm, self.post_attention_layernorm, self.mlp
            mix = self.mixer if self.kind == "mamba" else self.self_attn
        if rows is not None:
            h = mix(norm1(x), ctx, rows) if self.kind == "mamba" else mix(norm1(x), positions, rope, ctx, rows)
            x = x.reshape(-1, x.shape[-1]).index_select(0, rows) + h
            return x + mlp(norm2(x))
        h = mix(norm1(x), ctx) if self.kind == "mamba" else mix(norm1(x), positions, rope, ctx)
        x = x + h
        rows = ctx.valid_rows if ctx is not None else None
        if rows is None:
            return x + mlp(norm2(x))
        # A padded group (a verify whose requests drafted unequally: n-gram misses and short matches,
        # max_tokens caps): the norm and the MLP, two thirds of a layer's multiply-adds, work row by row, so
        # only the real tokens go through them, and each gets the same bits it gets unpadded. A padding row
        # keeps x without them; nothing reads it (attention never sees it as a key, the mamba scan leaves the
        # state as it was, the runner drops its logits). x is this add's own tensor: adding in place is safe.
        flat = x.view(-1, x.shape[-1])
        flat.index_add_(0, rows, mlp(norm2(flat.index_select(0, rows))))
        return x


def _causal_mask(n: int, start: int, dev: torch.device) -> torch.Tensor:
    """[n, start + n] bool: query i (position start + i) sees keys 0 .. start + i."""
    return torch.ones(n, start + n, dtype=torch.bool, device=dev).tril(start)


class _LonePlan:
    """Index plan of one multi-request `forward_lone`, built once and shared by its layers.

    Short spans (at most LONE_SHORT tokens: draft steps and catch-ups) attend in one padded batch: their
    queries gathered into [b, nmax], their keys gathered from each request's slice of the pool into
    [b, kmax], masked past each query's position. Longer spans (a new request's prompt) attend alone on a
    view of their slice, so one prompt never pads the others. Every row's key and value are written with
    one index_copy_ per pool before anything reads."""

    def __init__(self, spans: Sequence[tuple[int, int]], bases: Sequence[int], dev: torch.device, slots: int) -> None:
        self.long: list[tuple[int, int, int, int]] = []
        self.n_short = len(spans)
        if all(n == 1 for _, n in spans):
            # every request one query (each draft step after the first): rows are the requests, in order
            self.uniform = self.all_short = True
            self.nmax = 1
            self.t = len(spans)
            self.pos = torch.tensor([s for s, _ in spans], dtype=torch.long, device=dev)
            base_t = torch.tensor(bases, dtype=torch.long, device=dev)
            self.dst = base_t + self.pos
            self.last: torch.Tensor | None = None
            ar = torch.arange(max(s for s, _ in spans) + 1, device=dev)
            # keys past a request's end are masked; clamped so a request near the pool's end reads inside it
            self.src = (base_t[:, None] + ar[None, :]).reshape(-1).clamp_(max=slots - 1)
            self.mask = (ar[None, :] <= self.pos[:, None])[:, None, None, :]  # [b, 1, 1, kmax]
            return
        flat_pos: list[int] = []
        dst: list[int] = []
        offsets: list[int] = []
        for (s, n), base in zip(spans, bases, strict=True):
            offsets.append(len(flat_pos))
            flat_pos.extend(range(s, s + n))
            dst.extend(range(base + s, base + s + n))
        self.t = len(flat_pos)
        self.pos = torch.tensor(flat_pos, dtype=torch.long, device=dev)
        self.dst = torch.tensor(dst, dtype=torch.long, device=dev)
        self.last = torch.tensor(
            [o + n - 1 for o, (_, n) in zip(offsets, spans, strict=True)], device=dev)
        short = [r for r, (_, n) in enumerate(spans) if n <= LONE_SHORT]
        self.long = [(offsets[r], *spans[r], bases[r]) for r, (_, n) in enumerate(spans) if n > LONE_SHORT]
        self.short_rows: torch.Tensor | None = None
        self.n_short = len(short)
        if short:
            nmax = max(spans[r][1] for r in short)
            kmax = max(spans[r][0] + spans[r][1] for r in short)
            self.uniform = False  # (all one-token spans took the fast path above)
            qidx, qpos, keep = [], [], []
            for j, r in enumerate(short):
                s, n = spans[r]
                for i in range(nmax):
                    qidx.append(offsets[r] + min(i, n - 1))  # padding repeats the last real query
                    qpos.append(s + min(i, n - 1))
                    if i < n:
                        keep.append(j * nmax + i)
            self.nmax = nmax
            self.qidx = torch.tensor(qidx, dtype=torch.long, device=dev)
            self.keep = torch.tensor(keep, dtype=torch.long, device=dev)
            self.short_rows = torch.tensor([offsets[r] + i for r in short for i in range(spans[r][1])],
                                           dtype=torch.long, device=dev)
            ar = torch.arange(kmax, device=dev)
            base_t = torch.tensor([bases[r] for r in short], dtype=torch.long, device=dev)
            # keys past a request's end are masked; clamped so a request near the pool's end reads inside it
            self.src = (base_t[:, None] + ar[None, :]).reshape(-1).clamp_(max=slots - 1)
            qp = torch.tensor(qpos, dtype=torch.long, device=dev).view(len(short), nmax)
            self.mask = (ar[None, None, :] <= qp[:, :, None])[:, None]  # [b, 1, nmax, kmax]
            # no prompt among them: the kept rows are every row, in order (short spans are consecutive rows)
            self.all_short = not self.long

    def write(self, k: torch.Tensor, v: torch.Tensor, kpool: torch.Tensor, vpool: torch.Tensor) -> None:
        """Cache k/v [T, KV, d] of the flat rows at their slots."""
        kpool.index_copy_(0, self.dst, k)
        vpool.index_copy_(0, self.dst, v)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kpool: torch.Tensor,
                  vpool: torch.Tensor) -> torch.Tensor:
        """q [T, H, d], k/v [T, KV, d] of the flat rows -> attention output [T, H, d]."""
        self.write(k, v, kpool, vpool)
        hq, d = q.shape[1], q.shape[2]
        out: torch.Tensor | None = None
        if self.n_short:
            b, kvh = self.n_short, k.shape[1]
            keys = kpool.index_select(0, self.src).view(b, -1, kvh, d)
            vals = vpool.index_select(0, self.src).view(b, -1, kvh, d)
            qs = q.view(b, 1, hq, d) if self.uniform else q.index_select(0, self.qidx).view(b, self.nmax, hq, d)
            o = sdpa(qs, keys, vals, self.mask)
            o = o.reshape(b, hq, d) if self.uniform else o.reshape(-1, hq, d).index_select(0, self.keep)
            if self.all_short:
                return o
            out = q.new_empty(self.t, hq, d)
            assert self.short_rows is not None
            out.index_copy_(0, self.short_rows, o)
        if out is None:
            out = q.new_empty(self.t, hq, d)
        for off, s, n, base in self.long:
            keys, vals = kpool.narrow(0, base, s + n), vpool.narrow(0, base, s + n)
            mask = _causal_mask(n, s, q.device)
            out[off : off + n] = sdpa(q[None, off : off + n], keys[None], vals[None], mask)[0]
        return out


class HybridModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @property
    def decoder_layers(self) -> Sequence[DecoderLayer]:
        """`layers` as what they are (a ModuleList is typed as holding any Module)."""
        return cast("Sequence[DecoderLayer]", self.layers)


class HybridForCausalLM(nn.Module):
    """The whole model. `forward` is the cache-free reference; `forward_hidden` is the serving path."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = HybridModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # a plain attribute, not a buffer: it must survive meta-device construction in the loader
        self.inv_freq = rope_inv_freq(cfg)
        self._rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None  # rope_table rows, built on use
        self._serving_layers: tuple[Callable[..., torch.Tensor], ...] = ()  # bound by fuse_for_inference
        # per layer (norm1, qkv, o, norm2, gate_up, down), the four matmuls as callables (PackedLinear where
        # packed), for forward_lone: set by fuse_for_inference when every layer is full attention (float32:
        # rms_norm's one-op form)
        self._lone_layers: tuple[tuple[Any, ...], ...] = ()
        # _kernel_model's last result and what it was built from (pools, rope tables, weight versions)
        self._kernel_cache: tuple[tuple[Any, ...], tuple[ops.LoneModel, list[ops.LoneLayer]]] | None = None

    @torch.no_grad()
    def init_weights(self, seed: int = 0, std: float = 0.02) -> None:
        """Deterministic small-normal init (GPT-2 style: residual projections scaled by depth)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".D") or name.endswith("A_log") or "dt_bias" in name:
                continue
            if p.dim() == 1:  # biases
                p.zero_()
                continue
            s = std
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight") or name.endswith("out_proj.weight"):
                s = std / math.sqrt(2 * self.config.num_layers)
            p.copy_(torch.randn(p.shape, generator=g) * s)
        for layer in self.model.decoder_layers:
            if layer.kind == "mamba":
                layer.mixer.init_ssm(g)

    def fuse_for_inference(self) -> HybridForCausalLM:
        """Fuse q/k/v and gate/up projections for serving (fewer, larger matmuls). Call after loading
        weights and moving to the final device/dtype; training never fuses."""
        for layer in self.model.decoder_layers:
            if layer.kind != "mamba":
                layer.self_attn.fuse()
            layer.mlp.fuse()
            layer.bind_serving()
        self._pack()
        self._serving_layers = tuple(layer.forward for layer in self.model.decoder_layers)
        fp32 = all(p.dtype == torch.float32 for p in self.parameters())
        if fp32 and all(layer.kind == "full" for layer in self.model.decoder_layers):
            self._lone_layers = tuple(
                (layer.input_layernorm.weight,
                 _linear(layer.self_attn.qkv_packed, *(layer.self_attn.qkv or (None, None))),
                 _linear(getattr(layer.self_attn.o_proj, "packed", None), layer.self_attn.o_proj.weight, None),
                 layer.post_attention_layernorm.weight,
                 _linear(layer.mlp.gate_up_packed, layer.mlp.gate_up, None),
                 _linear(getattr(layer.mlp.down_proj, "packed", None), layer.mlp.down_proj.weight, None))
                for layer in self.model.decoder_layers)
        return self

    def _pack(self) -> None:
        """Prepack every serving matmul for oneDNN (CPU float32 only; see PackedLinear)."""
        nbytes = sum(p.numel() * p.element_size() for p in self.parameters())
        if nbytes > PACKED_MAX_BYTES or not ops.can_pack(self.lm_head.weight):
            return
        try:
            for layer in self.model.decoder_layers:
                if layer.kind == "mamba":
                    layer.mixer.in_proj.packed = PackedLinear(layer.mixer.in_proj.weight, None)  # type: ignore[assignment]
                    layer.mixer.out_proj.packed = PackedLinear(layer.mixer.out_proj.weight, None)  # type: ignore[assignment]
                else:
                    layer.self_attn.pack()
                layer.mlp.pack()
            self.lm_head.packed = PackedLinear(self.lm_head.weight, None)  # type: ignore[assignment]
        except RuntimeError:
            # A torch build whose oneDNN refuses to pack: the default kernels serve everything.
            self._unpack()

    def _unpack(self) -> None:
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                mod.packed = None  # type: ignore[assignment]
            elif isinstance(mod, Attention):
                mod.qkv_packed = None
            elif isinstance(mod, MLP):
                mod.gate_up_packed = None

    def forward_lone(
        self,
        input_ids: torch.Tensor,
        spans: Sequence[tuple[int, int]],
        pools: Sequence[tuple[torch.Tensor, torch.Tensor]],
        bases: Sequence[int],
    ) -> torch.Tensor:
        """The serving forward of a full-attention-only model (a draft model's step), lean: request r feeds
        spans[r] = (start, n) tokens, its rows of the flat `input_ids` [sum n] in request order, and keeps
        its positions on one slice of the cache: slot bases[r] + p of every layer's (keys, values) pool
        [slots, kv_heads, head_dim] holds its position p (`HybridCache.lone_base`, `kv_pools`). Writes
        this forward's keys and values there and returns the final hidden state of each request's last
        position [len(spans), hidden].

        The same kernels as `forward_hidden` (rms_norm, one fused q/k/v matmul through the same
        `PackedLinear`, the rotate-half rope from the same tables, sdpa, the fused gate/up), so the same
        values up to the matmuls' row blocking;
        what it drops is the plumbing of a general padded batch (item checks, page tables, per-kind slot
        and mask building): a tiny model's step is mostly that. One request reads its keys as a view;
        one token per request (every draft step after the first) reads them with one gather per layer."""
        hidden = self._lone(input_ids, spans, pools, bases, keys_only=False)
        assert hidden is not None
        return hidden

    def cache_lone(
        self,
        input_ids: torch.Tensor,
        spans: Sequence[tuple[int, int]],
        pools: Sequence[tuple[torch.Tensor, torch.Tensor]],
        bases: Sequence[int],
    ) -> None:
        """`forward_lone` for a caller that only needs the tokens cached (a prompt, before a draft chain
        starts from its last token): the last layer stops once it has written its keys and values, since
        its attention, output projection and MLP feed only the hidden states such a caller drops. For a
        one-layer draft that is most of the pass. The cached keys and values are those `forward_lone`
        writes."""
        self._lone(input_ids, spans, pools, bases, keys_only=True)

    def _lone(
        self,
        input_ids: torch.Tensor,
        spans: Sequence[tuple[int, int]],
        pools: Sequence[tuple[torch.Tensor, torch.Tensor]],
        bases: Sequence[int],
        keys_only: bool,
    ) -> torch.Tensor | None:
        assert self._lone_layers, "forward_lone needs fuse_for_inference on a full-attention-only model"
        cfg = self.config
        dev = input_ids.device
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        nq, nk = hq * d, hkv * d
        ends = [s + n for s, n in spans]
        cos_t, sin_t = self._rope(max(ends), dev)
        b = len(spans)
        if b == 1:
            start, n = spans[0]
            cos, sin = cos_t[start : start + n, None], sin_t[start : start + n, None]  # [n, 1, d]
            mask = None if n == 1 else _causal_mask(n, start, dev)
        else:
            plan = _LonePlan(spans, bases, dev, pools[0][0].shape[0])
            cos, sin = cos_t[plan.pos, None], sin_t[plan.pos, None]
        x = F.embedding(input_ids, self.model.embed_tokens.weight)  # [T, hidden]
        t = x.shape[0]
        eps, dims = cfg.rms_norm_eps, (cfg.hidden_size,)
        last = len(self._lone_layers) - 1
        for i, ((w1, qkv_proj, o_proj, w2, gate_up, down), (kpool, vpool)) in enumerate(
                zip(self._lone_layers, pools, strict=True)):
            qkv = qkv_proj(F.rms_norm(x, dims, w1, eps))
            qk = qkv[:, : nq + nk].view(t, hq + hkv, d)
            qk = rotary(qk, (cos, sin))
            v = qkv[:, nq + nk :].view(t, hkv, d)
            if keys_only and i == last:
                if b == 1:
                    kpool.narrow(0, bases[0] + spans[0][0], t).copy_(qk[:, hq:])
                    vpool.narrow(0, bases[0] + spans[0][0], t).copy_(v)
                else:
                    plan.write(qk[:, hq:], v, kpool, vpool)
                return None
            if b == 1:
                keys, vals = kpool.narrow(0, bases[0], ends[0]), vpool.narrow(0, bases[0], ends[0])
                keys[spans[0][0] :].copy_(qk[:, hq:])
                vals[spans[0][0] :].copy_(v)
                o = sdpa(qk[None, :, :hq], keys[None], vals[None], mask).reshape(t, nq)
            else:
                o = plan.attention(qk[:, :hq], qk[:, hq:], v, kpool, vpool).reshape(t, nq)
            x = x + o_proj(o)
            gate, up = gate_up(F.rms_norm(x, dims, w2, eps)).chunk(2, dim=-1)
            x = x + down(F.silu(gate) * up)
        if b == 1:
            x = x[-1:]
        elif plan.last is not None:
            x = x[plan.last]
        return F.rms_norm(x, dims, self.model.norm.weight, eps)

    def _kernel_model(self, pools: Sequence[tuple[torch.Tensor, torch.Tensor]], bound: int
                      ) -> tuple[ops.LoneModel, list[ops.LoneLayer]] | None:
        """This full-attention model's weights as the small-row kernel's fused loops take them (`lone_chains`,
        `full_layers`), with per layer the (keys, values) pools of `pools` and rope tables covering positions
        < bound; None where they do not apply (a model with swa or mamba layers, a weight without the
        kernel's copy, pools not contiguous float32 on the CPU). Built once and kept while the pools, the
        rope tables and the weights' versions stay the same (a decode step calls it once: ~15-30 us to
        build here, against a batch-1 step of about a millisecond)."""
        lm = getattr(self.lm_head, "packed", None)
        if not self._lone_layers or not isinstance(lm, PackedLinear):
            return None
        table = self._rope(bound, torch.device("cpu"))
        key = (id(table), tuple(t.data_ptr() for kv in pools for t in kv),
               tuple(f.weight._version if isinstance(f, PackedLinear) else -1
                     for layer in self._lone_layers for f in (layer[1], layer[2], layer[4], layer[5])),
               lm.weight._version)
        if self._kernel_cache is not None and self._kernel_cache[0] == key:
            return self._kernel_cache[1]
        lm_w = lm.small_weight()
        if lm_w is None:
            return None
        cfg = self.config
        layers: list[ops.LoneLayer] = []
        for (w1, qkv, o, w2, gu, down), (keys, values) in zip(self._lone_layers, pools, strict=True):
            lins = (qkv, o, gu, down)
            if not all(isinstance(f, PackedLinear) for f in lins):
                return None
            packed = [f.small_weight() for f in lins]
            if any(w is None for w in packed) or not all(
                    t.is_cpu and t.dtype == torch.float32 and t.is_contiguous() for t in (keys, values)):
                return None
            wq, wo, wgu, wd = packed
            assert wq is not None and wo is not None and wgu is not None and wd is not None
            layers.append(ops.LoneLayer(w1.detach(), wq, qkv.bias, wo, w2.detach(), wgu, wd, keys, values))
        cos_t, sin_t = table
        model = ops.LoneModel(
            hidden=cfg.hidden_size, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            intermediate=cfg.intermediate_size, vocab=cfg.vocab_size, eps=cfg.rms_norm_eps,
            embed=self.model.embed_tokens.weight.detach(), final_norm=self.model.norm.weight.detach(),
            lm_head=lm_w, cos=cos_t, sin=sin_t)
        self._kernel_cache = (key, (model, layers))
        return model, layers

    def _fused_layers(self, input_ids: torch.Tensor, ctx: CacheContext) -> torch.Tensor | None:
        """A decode step's or a verify's layers in one call of the small-row kernel (`ops.full_layers`) for a
        full-attention model: the output of its last layer [b, L, hidden], the cache written as the
        layer-by-layer path writes it; None where it does not apply (see `ops.full_layers`; also not float32,
        swa or mamba layers), and nothing is written then. The same function as the layer-by-layer path (its
        matmuls, norms and attention are these kernels), to float32 rounding: rope and silu round as C does."""
        b, n = input_ids.shape
        if not self._lone_layers:
            return None
        return ops.full_layers(b * n, n, self.config.head_dim, input_ids.is_cpu,
                               lambda sg: self._full_layers_call(sg, input_ids, ctx))

    def _full_layers_call(self, sg: ops.SmallGemm, input_ids: torch.Tensor, ctx: CacheContext) -> torch.Tensor | None:
        """`_fused_layers`' kernel call, or None (nothing written) where the cache or the weights do not fit it."""
        plan = ctx.full_plan()
        if plan is None:
            return None
        pools, dst, slots, kpos = plan
        bound = ctx.max_position + 1
        kernel_model = self._kernel_model(pools, bound)
        if kernel_model is None:
            return None
        model, layers = kernel_model
        valid = None if ctx.all_valid else ctx.valid
        pos = ctx.positions if valid is None else torch.where(valid, ctx.positions, 0)  # padding: any table row
        flat = pos.reshape(-1)
        x = F.embedding(input_ids, self.model.embed_tokens.weight).contiguous()
        sg.full_layers(model, layers, x, model.cos.index_select(0, flat), model.sin.index_select(0, flat), dst,
                       slots, kpos, ctx.positions, valid)
        return x

    def lone_chain(
        self,
        pools: Sequence[tuple[torch.Tensor, torch.Tensor]],
        bases: Sequence[int],
        starts: Sequence[int],
        feeds: Sequence[Sequence[int]],
        steps: Sequence[int],
        logits_out: torch.Tensor | None = None,
        sampling: ops.ChainSampling | None = None,
    ) -> list[list[int]] | None:
        """Draft chains, all the requests in one call of the small-row kernel's fused loop
        (`ops.lone_chains`, their positions side by side): request i feeds `feeds[i]`
        from position `starts[i]` (slot bases[i] + p of `pools`, as `forward_lone`), then `steps[i]`
        argmax tokens (drawn ones with `sampling`), each but the last fed; `logits_out` [requests, max
        steps, vocab], when given, gets every chosen position's logits. None, with nothing written, where
        it does not apply (no kernel here, a weight without the kernel's copy, pools not contiguous float32
        on the CPU); then `forward_lone` per step. The same function as that loop, to float32 rounding.
        The fused loop feeds token by token, so a feed longer than LONE_SHORT tokens (a new request's
        prompt) is cached by one batched `cache_lone` first, all of it but its last token."""
        if not all(feeds) or min(steps) < 1:
            return None
        return ops.lone_chains(lambda sg: self._lone_chains_call(sg, pools, bases, starts, feeds, steps, logits_out,
                                                                 sampling))

    def _lone_chains_call(
        self,
        sg: ops.SmallGemm,
        pools: Sequence[tuple[torch.Tensor, torch.Tensor]],
        bases: Sequence[int],
        starts: Sequence[int],
        feeds: Sequence[Sequence[int]],
        steps: Sequence[int],
        logits_out: torch.Tensor | None,
        sampling: ops.ChainSampling | None,
    ) -> list[list[int]] | None:
        """`lone_chain`'s kernel call, or None (nothing written) where the pools or the weights do not fit it."""
        ends = [s + len(f) + k for s, f, k in zip(starts, feeds, steps, strict=True)]
        kernel_model = self._kernel_model(pools, max(ends))
        if kernel_model is None:
            return None
        model, layers = kernel_model
        long = [i for i, f in enumerate(feeds) if len(f) > LONE_SHORT]
        if long:
            prefix = torch.tensor([t for i in long for t in feeds[i][:-1]], dtype=torch.long)
            with torch.no_grad():
                self.cache_lone(prefix, [(starts[i], len(feeds[i]) - 1) for i in long], pools,
                                [bases[i] for i in long])
            starts = [s + len(f) - 1 if len(f) > LONE_SHORT else s for s, f in zip(starts, feeds, strict=True)]
            feeds = [f[-1:] if len(f) > LONE_SHORT else f for f in feeds]
        return sg.lone_chains(model, layers, bases, starts, feeds, steps, logits_out, sampling)

    def forward_hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: CacheContext | None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids/positions [b, L] -> final hidden states [b, L, hidden] (after the last norm); with `rows`
        (flat indices into b * L) those rows' only, [len(rows), hidden]: every position is still cached,
        but the last layer's output projection and MLP run for those rows alone (`DecoderLayer.forward`)."""
        fused = self._fused_layers(input_ids, ctx) if ctx is not None and self._lone_layers else None
        if fused is not None:
            x = fused if rows is None else fused.reshape(-1, fused.shape[-1]).index_select(0, rows)
            out: torch.Tensor = self.model.norm(x)
            return out
        x = F.embedding(input_ids, self.model.embed_tokens.weight)
        bound = ctx.max_position + 1 if ctx is not None else input_ids.shape[1]
        rope = rope_cos_sin(positions, self._rope(bound, positions.device))
        layers = self._serving_layers or tuple(self.model.decoder_layers)
        for layer in layers[:-1] if rows is not None else layers:
            x = layer(x, positions, rope, ctx)
        if rows is not None:
            x = layers[-1](x, positions, rope, ctx, rows)
        normed: torch.Tensor = self.model.norm(x)
        return normed

    def _rope(self, bound: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The rope tables covering positions < bound (grown by doubling, rebuilt on a device change)."""
        table = self._rope_tables
        if table is None or table[0].shape[0] < bound or table[0].device != device:
            if self.inv_freq.device != device:
                self.inv_freq = self.inv_freq.to(device)
            n = max(bound, 2 * table[0].shape[0] if table is not None else 512)
            table = self._rope_tables = rope_table(self.inv_freq, n)
        return table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Cache-free forward over whole sequences starting at position 0: [b, L] -> logits [b, L, vocab]."""
        b, n = input_ids.shape
        positions = torch.arange(n, device=input_ids.device).expand(b, n)
        logits: torch.Tensor = self.lm_head(self.forward_hidden(input_ids, positions, None))
        return logits
