"""The engine's operations that the small-row kernel can run, each choosing here between the kernel and torch.

Contract: the model, the cache, sampling and speculative verification call these for every operation the
kernel (engine/smallgemm.py) has an entry point for; none of them asks whether the kernel is built. Each
operation runs the kernel where it is built, switched on (`paths`) and applicable to the tensors it gets
(float32 on the CPU, within the kernel's sizes), and torch's form elsewhere: the same function up to float32
rounding. Where torch's form belongs to the caller (attention over gathered keys, the chunked Mamba scan, the
probabilities plain sampling draws from), the caller hands it in as `torch_form`; the kernel's plumbing that
only the caller can build (the cache's slot plan, the model's packed weights) comes in as `kernel_form`, which
may decline with None (torch's form then runs).

The kernel computes a row's result the same way whatever else is in the batch (its matmuls add products in
k order, its attention and mixer work query by query); the exactness oracles rely on that, so which form
runs must depend on the batch only through `row_cap`, as here.

The whole-layer (`full_layers`) and whole-chain (`lone_chains`) paths replace many kernel calls by one: they
return None where they do not apply, and their callers run the per-operation path (the forward layer by
layer, the draft chain a forward per token), which calls these operations in turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F

from specctl.engine import smallgemm
from specctl.engine.smallgemm import ChainSampling, LoneLayer, LoneModel, MambaConsts, SmallGemm

__all__ = [
    "ATTENTION_MAX_LEN", "ChainSampling", "LoneLayer", "LoneModel", "MambaConsts", "PackedLinear", "SmallGemm",
    "argmax", "attention", "can_pack", "full_layers", "kernel", "lone_chains", "mamba_mixer", "paths",
    "rejection", "rms_norm", "row_cap", "sample", "small_max_rows",
]

_T = TypeVar("_T")

# The kernel's attention (and the whole-layer path, which holds it) up to this many positions per request in
# one forward (a decode step, a verify); longer forwards (prompts) take torch's sdpa over gathered keys.
ATTENTION_MAX_LEN = 16
# oneDNN's prepacked fp32 linear has a larger fixed cost a call but grows slowly with the rows; the
# default kernel costs little for one row and grows linearly. Inside a whole forward (weights no longer hot
# in cache) the packed kernel only wins from about 16 rows (benchmarks/RESULTS.md).
PACKED_MIN_ROWS = 16
# A larger weight (a Llama's lm_head or MLP) pays the packed kernel's fixed cost back sooner, from 8 rows,
# while the builtin hybrid's smaller matrices gain nothing there, so they keep 16 (benchmarks/RESULTS.md).
PACKED_MIN_ROWS_LARGE = 8
PACKED_LARGE_ELEMENTS = 1 << 18
# The small-row kernel up to this many rows, with one torch thread, where it is ahead of oneDNN on the
# builtin models' weights (benchmarks/RESULTS.md). With more threads, torch's kernels spread larger products
# over the cores: the single-threaded kernel keeps <= 8. The AVX2 path keeps 32 so that a verify of up to 32
# rows gets its rows' decode-step bits; the AVX-512 path keeps 64 (SMALL_MAX_ROWS_AVX512), where it stays
# ahead of oneDNN for a batch-8 verify of 5-8 positions (verify_bench.py), so that verify gets them too.
SMALL_MAX_ROWS = 32
SMALL_MAX_ROWS_AVX512 = 64
SMALL_MAX_ROWS_THREADED = 8
# torch >= 2.4 has rms_norm as one op (pyproject allows torch 2.1)
_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
_FUSED_RMS_NORM = _TORCH >= (2, 4)
_HEAD_DIM_MAX = 1024  # the fused paths' rope scratch in smallgemm.c


@dataclass
class _Paths:
    kernel: bool = True
    fused: bool = True


_ON = _Paths()


@contextmanager
def paths(*, kernel: bool = True, fused: bool = True) -> Iterator[None]:
    """Within the block every operation runs torch's form (kernel=False), or the kernel operation by operation
    without the whole-layer and whole-chain paths (fused=False); restored on exit. For benchmarks and tests
    that compare the paths side by side in one process; process-wide, so not for a serving engine's threads."""
    before = _Paths(_ON.kernel, _ON.fused)
    _ON.kernel, _ON.fused = kernel, fused
    try:
        yield
    finally:
        _ON.kernel, _ON.fused = before.kernel, before.fused


def kernel() -> SmallGemm | None:
    """The small-row kernel where it is built and switched on (see `paths`), else None."""
    return smallgemm.kernel() if _ON.kernel else None


def small_max_rows(sg: SmallGemm) -> int:
    """Up to how many rows (one torch thread) `sg` multiplies rather than oneDNN (see SMALL_MAX_ROWS)."""
    return SMALL_MAX_ROWS_AVX512 if sg.isa == 512 else SMALL_MAX_ROWS


def row_cap(sg: SmallGemm) -> int:
    """Up to how many rows the kernel's matmuls take now: `small_max_rows` with one torch thread, else
    SMALL_MAX_ROWS_THREADED."""
    return small_max_rows(sg) if torch.get_num_threads() == 1 else SMALL_MAX_ROWS_THREADED


def _f32_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.is_cpu for t in tensors)


def can_pack(weight: torch.Tensor) -> bool:
    """Whether oneDNN can prepack this weight (CPU float32, a torch built with it)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call, unused-ignore]
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class PackedLinear:
    """y = x W^T + b through whichever CPU kernel is fastest for this many rows: up to `row_cap` the
    small-row kernel (when built and switched on), else below `min_rows` (see PACKED_MIN_ROWS) torch's
    default kernel, from there oneDNN's packed one.

    The weight stays the module's parameter (loading and saving use it); the packed copy is oneDNN's
    blocked layout of the same values and `wt` the small-row kernel's (transposed, in panels; made when the
    kernel is there at construction), so every kernel computes the same function (up to rounding)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.out_features, self.in_features = weight.shape
        self.min_rows = PACKED_MIN_ROWS_LARGE if weight.numel() >= PACKED_LARGE_ELEMENTS else PACKED_MIN_ROWS
        self.small = kernel() if weight.dtype == torch.float32 else None
        self._pack()

    def _pack(self) -> None:
        w = self.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        self.wt = None
        if self.small is not None and (self.bias is None or self.bias.is_contiguous()):
            self.wt = self.small.pack(w)
        self.version = self.weight._version  # in-place updates of the weight bump it: repack then

    def small_weight(self) -> torch.Tensor | None:
        """The small-row kernel's copy of the weight, current (repacked after an in-place update), or None."""
        if self.wt is None or not self.weight.is_cpu:
            return None
        if self.weight._version != self.version:
            self._pack()
        return self.wt

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cpu or not self.weight.is_cpu:
            return F.linear(x, self.weight, self.bias)
        if self.weight._version != self.version:
            self._pack()
        rows = x.numel() // self.in_features
        if self.wt is not None and self.small is not None and _ON.kernel and rows <= row_cap(self.small):
            return self.small.linear(x, self.wt, self.out_features, self.bias)
        if rows < self.min_rows:
            return F.linear(x, self.weight, self.bias)
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * weight. Serving on the CPU in float32 (no
    autograd) it is one call of the kernel; training keeps torch's, and other dtypes normalise in float32
    like the reference implementations, so bf16/fp16 runs stay stable."""
    if _f32_cpu(x, weight) and not torch.is_grad_enabled():
        sg = kernel()
        if sg is not None:
            return sg.rms_norm(x, weight, eps)
    if _FUSED_RMS_NORM:
        if x.dtype == torch.float32 and weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)  # one op (same values)
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(dim=-1)`: the kernel's for float32 CPU rows (the same first maximal index, in one pass over a
    step's logits), torch's elsewhere and where a row holds a NaN (torch ranks it highest)."""
    if _f32_cpu(x) and x.dim() >= 1 and x.shape[-1] > 0:
        sg = kernel()
        if sg is not None:
            ids = sg.argmax(x)
            if ids is not None:
                return ids
    return x.argmax(dim=-1)


def sample(logits: torch.Tensor, temperatures: Sequence[float] | None, uniforms: Callable[[], list[float]],
           torch_form: Callable[[list[float] | None], torch.Tensor]) -> torch.Tensor:
    """One token per row of logits [n, V]. The kernel draws where the logits are float32 on the CPU and
    `temperatures` is given (every row temperature-only, 0 for a greedy one, its uniform drawn on the host by
    `uniforms()`): inverse CDF of softmax(row / temperature), without the [n, V] probability tensor.
    Elsewhere `torch_form(u)` draws: u the uniforms already drawn when the kernel declined (a greedy row's
    NaN), None when none were (torch draws them)."""
    if temperatures is not None and _f32_cpu(logits):
        sg = kernel()
        if sg is not None:
            u = uniforms()
            ids = sg.sample(logits, temperatures, u)
            return ids if ids is not None else torch_form(u)
    return torch_form(None)


def rejection(logits: torch.Tensor, temperatures: Sequence[float], drafts: Sequence[Sequence[int]],
              num_drafts: Sequence[int], draft_probs: torch.Tensor | None,
              uniforms: Callable[[], list[list[float]]],
              torch_form: Callable[[], tuple[list[int], list[list[int]]]]) -> tuple[list[int], list[list[int]]]:
    """Speculative sampling of temperature-only rows from the target's logits [b, k + 1, V]: per request the
    accepted count and the emitted tokens (its accepted drafts, then the token drawn after them). The kernel
    normalises only what it reads and draws where the logits (and q, `draft_probs`, when given) are float32 on
    the CPU, with `uniforms()` (request i's num_drafts[i] + 1 draws); elsewhere `torch_form()`."""
    if _f32_cpu(logits) and (draft_probs is None or _f32_cpu(draft_probs)):
        sg = kernel()
        if sg is not None:
            accepted, tokens = sg.rejection(logits, temperatures, drafts, num_drafts, draft_probs, uniforms())
            return accepted, [[*drafts[i][: accepted[i]], tokens[i]] for i in range(len(accepted))]
    return torch_form()


def attention(q: torch.Tensor, store: torch.Tensor, slots: torch.Tensor, kpos: torch.Tensor, qpos: torch.Tensor,
              qvalid: torch.Tensor | None, window: int, torch_form: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A step's or a verify's attention, q [b, L, H, d], over keys and values where the pools `store`
    [2, slots, KV, d] hold them (see `SmallGemm.attention` for slots, kpos, qpos, qvalid, window). The kernel
    reads them in place for up to ATTENTION_MAX_LEN positions of float32 CPU tensors (a contiguous store);
    elsewhere `torch_form()` (sdpa over gathered keys)."""
    if q.shape[1] <= ATTENTION_MAX_LEN and _f32_cpu(q, store) and store.is_contiguous():
        sg = kernel()
        if sg is not None:
            return sg.attention(q, store[0], store[1], slots, kpos, qpos, qvalid, window)
    return torch_form()


def mamba_mixer(zxbcdt: torch.Tensor, kernel_form: Callable[[SmallGemm], torch.Tensor | None],
                torch_form: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A Mamba-2 mixer's conv, scan and gated norm over a forward's positions, after in_proj (zxbcdt): the
    input of out_proj. `kernel_form(sg)` runs it in `SmallGemm.mamba_short` (float32 CPU) and commits the
    states, or declines with None having committed nothing (no pools for the kernel); then `torch_form()`."""
    if _f32_cpu(zxbcdt):
        sg = kernel()
        if sg is not None:
            y = kernel_form(sg)
            if y is not None:
                return y
    return torch_form()


def full_layers(rows: int, length: int, head_dim: int, on_cpu: bool,
                kernel_form: Callable[[SmallGemm], torch.Tensor | None]) -> torch.Tensor | None:
    """Every layer of a full-attention model over a decode step's or a verify's `rows` (b * L, L = `length`
    positions a request), in one kernel call: `kernel_form(sg)` builds the call (`SmallGemm.full_layers`) or
    declines with None. None, and `kernel_form` not called, where the whole-layer path is off, unbuilt or
    does not apply (not on the CPU, more rows than the kernel's matmuls take, a longer forward than its
    attention takes, a head larger than its rope scratch): the caller then runs the layers one by one."""
    sg = kernel() if _ON.fused else None
    if (sg is None or not on_cpu or length > ATTENTION_MAX_LEN or head_dim > _HEAD_DIM_MAX
            or rows > row_cap(sg)):
        return None
    return kernel_form(sg)


def lone_chains(kernel_form: Callable[[SmallGemm], _T | None]) -> _T | None:
    """A draft model's chains, all the requests in one call of the kernel's fused loop: `kernel_form(sg)`
    builds the call (`SmallGemm.lone_chains`) or declines with None. None, and `kernel_form` not called,
    where the whole-chain path is off or unbuilt: the caller then runs a forward per draft token."""
    sg = kernel() if _ON.fused else None
    return None if sg is None else kernel_form(sg)
