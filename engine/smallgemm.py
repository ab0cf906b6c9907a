"""A float32 matmul for the few rows of a CPU decode step or speculative verify, as a small C kernel.

Why: a verify of k + 1 positions should cost close to one decode step, and with torch's CPU kernels it
does not. torch's CPU kernels for x W^T at 2-8 rows grow almost linearly with the rows (MKL
on the builtin hybrid's weights), and oneDNN's packed kernel is flat but costs more per call. Reading each
weight once and multiplying it into every row while it is in registers (smallgemm.c) makes the weights'
bytes, not the rows, set the time until about 8 rows; AVX-512 and AVX2 paths keep that on CPUs with either
(figures: benchmarks/RESULTS.md).

The kernel also computes every row of y the same way whatever the number of rows (the products added in k
order), so these matmuls give a request's row the same bits in a decode step and in a verify.

The same library holds what else a step of a tiny model spends its time on in small torch ops:
`attention` (a step's few queries over the paged key/value pools, without gathering them), `mamba_short`
(a Mamba-2 mixer's conv, recurrence and gated norm over a step's positions, or a small model's prompt,
with the states a rollback can reach kept and the final ones stored in the cache) and `lone_chains` (a
draft model's chains, greedy or drawn at a temperature, all requests advancing together). Each computes a
query's or a position's result the same way whatever else is in the batch, so a verify's rows in those
layers are its decode steps' bits too.

How: `kernel()` compiles smallgemm.c once per machine with the system C compiler (`$CC`, else `cc`) at
-O3 -march=native into the user cache (`$SPECCTL_CACHE_DIR`, else `$XDG_CACHE_HOME/specctl`, else
~/.cache/specctl), named by a hash of the source, the compiler and this CPU's feature flags (a cache shared
between machines never loads a build for another CPU), and loads it with ctypes. ctypes releases the GIL
for the call. With no compiler, a failed build, `SPECCTL_SMALL_GEMM=0`, or a platform other than Linux or
macOS, `kernel()` is None and callers keep torch's kernels (the same function up to rounding). The ctypes
bindings are made from one table (SIGNATURES); a library whose `lone_layer` differs in size from this
module's mirror is refused at load (one log line; torch's kernels then). The engine calls this module
through `engine/ops.py` alone, which chooses kernel or torch per operation.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("smallgemm.c")
_BUILD_TIMEOUT_S = 60.0
_INT = ctypes.c_int
_LONG = ctypes.c_long
_PTR = ctypes.c_void_p


# The C entry points of smallgemm.c as Python passes their arguments: name -> "return (type name, ...)". Types:
# int, long, float (scalars); ptr (an address: a tensor's data_ptr(), or None for NULL); int[], long[], float[]
# (a ctypes array, or None); layers (a `lone_layer` array). The argtypes and restypes are made from this table
# alone, and tests/test_smallgemm.py checks it against the prototypes in smallgemm.c.
SIGNATURES: dict[str, str] = {
    "sgemm_isa": "int ()",
    "sgemm_panel": "int ()",
    "sizeof_lone_layer": "long ()",
    "sgemm": "void (int M, int N, int K, ptr x, long ldx, ptr wp, ptr bias, ptr y)",
    "argmax": "int (int rows, int n, ptr x, ptr out)",
    "rmsnorm": "void (int rows, int n, ptr x, ptr w, float eps, ptr out)",
    "lone_chains": "int (int n_layers, layers layers, int hidden, int hq, int hkv, int d, int inter, int vocab, "
                   "float eps, ptr embed, ptr final_norm, ptr lm_head, ptr cos_t, ptr sin_t, int n_req, long[] base, "
                   "int[] start, long[] feed, int[] feed_off, int[] steps, long[] out, int stride, ptr logits_out, "
                   "float[] temps, float[] unif, ptr probs_out)",
    "mamba_short": "int (int b, int n, int d_inner, int conv_dim, int H, int P, int N, int dconv, ptr zxbcdt, "
                   "ptr conv_pool, ptr ssm_pool, long[] slots, int[] lens, ptr conv_wt, ptr conv_b, ptr dt_bias, "
                   "ptr A, ptr D, ptr norm_w, float eps, ptr y_out, ptr xcat, ptr states, int nkeep)",
    "paged_attention": "int (int b, int L, int H, int KV, int d, int kmax, ptr q, ptr kstore, ptr vstore, ptr slots, "
                       "ptr kpos, ptr qpos, ptr qvalid, long window, float scale, ptr out)",
    "full_layers": "int (int n_layers, layers layers, int hidden, int hq, int hkv, int d, int inter, float eps, int b, "
                   "int L, ptr x, ptr cos_rows, ptr sin_rows, ptr dst, int kmax, ptr slots, ptr kpos, ptr qpos, "
                   "ptr qvalid)",
    "rejection": "int (int b, int k1, int vocab, ptr logits, float[] temps, long[] drafts, int[] nd, ptr q, "
                 "float[] unif, ptr scratch, int[] accepted, long[] tokens)",
    "sample": "int (int rows, int vocab, ptr logits, float[] temps, float[] unif, ptr scratch, ptr out)",
}
PREFIX = "specctl_"  # every entry point's C name is PREFIX + its key in SIGNATURES


def parse_signature(text: str) -> tuple[str, list[tuple[str, str]]]:
    """A SIGNATURES entry as (return type, [(argument type, argument name), ...])."""
    ret, _, rest = text.partition(" (")
    args = rest.rstrip(")").strip()
    return ret, [(kind, name) for kind, _, name in (a.strip().rpartition(" ") for a in args.split(",") if args)]


class KernelMismatch(RuntimeError):
    """The loaded library does not match this module's mirror of it (a struct's size differs)."""


def _bind(lib: ctypes.CDLL) -> dict[str, Any]:
    """Every SIGNATURES entry of `lib`, its argtypes and restype set from the table."""
    kinds: dict[str, Any] = {
        "int": _INT, "long": _LONG, "float": ctypes.c_float, "ptr": _PTR, "void": None,
        "int[]": ctypes.POINTER(_INT), "long[]": ctypes.POINTER(_LONG), "float[]": ctypes.POINTER(ctypes.c_float),
        "layers": ctypes.POINTER(_LoneLayer),
    }
    fns: dict[str, Any] = {}
    for name, text in SIGNATURES.items():
        ret, args = parse_signature(text)
        fn = getattr(lib, PREFIX + name)
        fn.argtypes = [kinds[kind] for kind, _ in args]
        fn.restype = kinds[ret]
        fns[name] = fn
    return fns


def check_structs(lib: ctypes.CDLL, structs: dict[str, type[ctypes.Structure]]) -> None:
    """Raise KernelMismatch unless each mirrored struct has the size the library reports
    (`specctl_sizeof_<name>`): a mirror that drifted from the C would pass every pointer one field off."""
    for name, mirror in structs.items():
        fn = getattr(lib, f"{PREFIX}sizeof_{name}")
        fn.argtypes, fn.restype = [], _LONG
        c_size, py_size = int(fn()), ctypes.sizeof(mirror)
        if c_size != py_size:
            raise KernelMismatch(f"struct {name} is {c_size} bytes in C but its ctypes mirror {mirror.__name__} "
                                 f"is {py_size}")


class SmallGemm:
    """The loaded kernel: `linear(x, pack(W), N, b)` = x W^T + b for float32 CPU tensors, and the other entry
    points of smallgemm.c. Raises KernelMismatch when a mirrored struct's size differs from the library's."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        check_structs(lib, STRUCTS)
        self._c = _bind(lib)
        self.isa = int(self._c["sgemm_isa"]())  # 512: AVX-512 intrinsics; 256: AVX2 and FMA; 0: compiler-vectorised
        self.panel = int(self._c["sgemm_panel"]())

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """W [N, K] (float32) as the kernel reads it: W^T cut into panels of `panel` columns,
        [ceil(N / panel), K, panel], the last panel zero-padded (a copy; W is untouched)."""
        n, k = weight.shape
        p = self.panel
        wt = torch.zeros(k, -(-n // p) * p, dtype=torch.float32)
        wt[:, :n] = weight.detach().t()
        return wt.view(k, -1, p).transpose(0, 1).contiguous()

    def linear(self, x: torch.Tensor, wp: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., K] times the weight `pack` made of W [n, K], plus bias [n] or None: [..., n].

        float32 on the CPU; x is made contiguous if it is not, and bias must be contiguous. Per call
        this checks what a caller's input can change: x's features, dtype and device."""
        k = wp.shape[1]
        if x.shape[-1] != k or x.dtype != torch.float32 or not x.is_cpu:
            raise ValueError(f"smallgemm: x must be float32 on the CPU with {k} features, got {x.dtype} "
                             f"{tuple(x.shape)} on {x.device}")
        if not x.is_contiguous():
            x = x.contiguous()
        shape = list(x.shape)
        shape[-1] = n
        y = torch.empty(shape, dtype=torch.float32)
        rows = x.numel() // k if k else 0
        if rows and n:
            self._c["sgemm"](
                rows, n, k, x.data_ptr(), k, wp.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr())
        return y

    def lone_chains(self, model: LoneModel, layers: Sequence[LoneLayer], bases: Sequence[int],
                    starts: Sequence[int], feeds: Sequence[Sequence[int]], steps: Sequence[int],
                    logits_out: torch.Tensor | None = None, sampling: ChainSampling | None = None
                    ) -> list[list[int]]:
        """Draft chains, all in one call: request i feeds `feeds[i]` at positions starts[i].. (slot
        bases[i] + p of every layer's pools), then chooses `steps[i]` tokens, each but the last fed (the lean
        chain of `ModelRunner.draft_chain`, without its ~35 dispatched ops per token). The requests advance
        a position at a time together, so each matmul multiplies all their rows in one pass over the
        weights. `logits_out` [requests, max steps, vocab] (contiguous float32), when given, receives each
        chosen position's logits. Tokens are argmaxes, or with `sampling` drawn in the loop as
        `ChainSampling` says. The caller checks shapes, that the pools hold each request's slots up to its
        last fed position and the rope tables those positions; each chain writes the keys and values of every
        position it feeds."""
        n, width = len(feeds), max(steps)
        shape = (n, width, model.vocab)
        if logits_out is not None and (logits_out.dtype != torch.float32 or not logits_out.is_contiguous()
                                       or tuple(logits_out.shape) != shape):
            raise ValueError(f"smallgemm: logits_out must be contiguous float32 [{n}, {width}, {model.vocab}]")
        temps = unif = probs = None
        if sampling is not None:
            sampling.check(shape, steps)
            temps = (ctypes.c_float * n)(*sampling.temperatures)
            unif = (ctypes.c_float * (n * width))(*_padded(sampling.uniforms, width, 0.0))
            probs = sampling.probs_out.data_ptr()
        arr = _layer_array(layers)
        offsets = [0]
        for feed in feeds:
            offsets.append(offsets[-1] + len(feed))
        toks = (ctypes.c_long * (n * width))()
        rc = self._c["lone_chains"](
            len(layers), arr, model.hidden, model.heads, model.kv_heads, model.head_dim, model.intermediate,
            model.vocab, model.eps, model.embed.data_ptr(), model.final_norm.data_ptr(), model.lm_head.data_ptr(),
            model.cos.data_ptr(), model.sin.data_ptr(), n, (ctypes.c_long * n)(*bases), (_INT * n)(*starts),
            (ctypes.c_long * offsets[-1])(*(t for feed in feeds for t in feed)), (_INT * (n + 1))(*offsets),
            (_INT * n)(*steps), toks, width, None if logits_out is None else logits_out.data_ptr(), temps, unif, probs)
        if rc != 0:
            raise RuntimeError("smallgemm: the lone chain could not run (scratch allocation or head size)")
        return [list(toks[i * width:i * width + k]) for i, k in enumerate(steps)]

    def full_layers(self, model: LoneModel, layers: Sequence[LoneLayer], x: torch.Tensor, cos_rows: torch.Tensor,
                    sin_rows: torch.Tensor, dst: torch.Tensor, slots: torch.Tensor, kpos: torch.Tensor,
                    qpos: torch.Tensor, qvalid: torch.Tensor | None) -> None:
        """Every layer of a full-attention model over a decode step's or a verify's rows, in one call (the
        layers of `lone_chains`, with the cache's paged pools): x [b, L, hidden] (float32, contiguous) goes
        in as the embeddings and comes out, in place, as the last layer's output (before the final norm).
        Row j of the b * L writes its key and value at slot dst[j] of every layer's pools (-1: padding, no
        write), then attends as `attention` does: item i's keys at slots[i] [K], positions kpos[i], its
        queries at qpos [b, L], qvalid [b, L] False at padding (None: all real). cos_rows / sin_rows [b * L,
        head_dim] are the rope tables' rows at the rows' positions."""
        b, n, hidden = x.shape
        d = model.head_dim
        ok = (x.dtype == torch.float32 and x.is_contiguous() and hidden == model.hidden
              and tuple(cos_rows.shape) == tuple(sin_rows.shape) == (b * n, d) and tuple(dst.shape) == (b * n,)
              and slots.dim() == 2 and slots.shape == kpos.shape and slots.shape[0] == b
              and tuple(qpos.shape) == (b, n) and (qvalid is None or tuple(qvalid.shape) == (b, n))
              and all(t.dtype == torch.long for t in (dst, slots, kpos, qpos)))
        if not ok:
            raise ValueError(f"smallgemm: full_layers got x {tuple(x.shape)}, rope rows {tuple(cos_rows.shape)}, "
                             f"dst {tuple(dst.shape)}, slots {tuple(slots.shape)}, positions {tuple(qpos.shape)}: "
                             "they do not fit")
        arr = _layer_array(layers)
        cos_rows, sin_rows = cos_rows.contiguous(), sin_rows.contiguous()
        dst, slots, kpos, qpos = dst.contiguous(), slots.contiguous(), kpos.contiguous(), qpos.contiguous()
        valid = None if qvalid is None else qvalid.to(torch.uint8).contiguous()
        rc = self._c["full_layers"](
            len(layers), arr, hidden, model.heads, model.kv_heads, d, model.intermediate, model.eps, b, n,
            x.data_ptr(), cos_rows.data_ptr(), sin_rows.data_ptr(), dst.data_ptr(), slots.shape[1], slots.data_ptr(),
            kpos.data_ptr(), qpos.data_ptr(), None if valid is None else valid.data_ptr())
        if rc != 0:
            raise RuntimeError("smallgemm: full_layers could not run (scratch allocation or shapes)")

    def mamba_short(self, zxbcdt: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor,
                    slots: Sequence[int], lens: Sequence[int], k: MambaConsts, keep: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A Mamba-2 mixer over the few positions of a decode step or a verify, after in_proj: zxbcdt
        [b, n, d_inner + conv_dim + heads]; request i's conv and ssm states at slot slots[i] of conv_pool
        [slots, conv_dim, d_conv - 1] and ssm_pool [slots, heads, head_dim, d_state], its real positions the
        first lens[i] (the rest padding, which leaves the state as it is). Returns (y [b, n, d_inner], the
        input of out_proj; the conv inputs [b, d_conv - 1 + n, conv_dim]; the states [b, n + 1, heads,
        head_dim, d_state], the entering one first), and leaves in the pools each request's states after
        its last real position. float32, CPU; the pools contiguous.

        `keep` (1 .. n + 1, default n + 1) keeps only each request's last `keep` states: request i's row j
        is the state after its position off_i + j - 1, off_i = max(0, lens[i] + 1 - keep). A prompt's
        forward keeps the few its rollback can reach, not a state per position."""
        b, n, width = zxbcdt.shape
        keep = n + 1 if keep is None else keep
        if not 1 <= keep <= n + 1:
            raise ValueError(f"smallgemm: mamba_short keeps 1 .. {n + 1} states per request, not {keep}")
        hpn = (k.heads, k.head_dim, k.d_state)
        if (width != k.d_inner + k.conv_dim + k.heads or tuple(conv_pool.shape[1:]) != (k.conv_dim, k.d_conv - 1)
                or tuple(ssm_pool.shape[1:]) != hpn or len(slots) != b or len(lens) != b
                or not (conv_pool.is_contiguous() and ssm_pool.is_contiguous())
                or not all(0 <= s < min(conv_pool.shape[0], ssm_pool.shape[0]) for s in slots)):
            raise ValueError(f"smallgemm: mamba_short got zxbcdt {tuple(zxbcdt.shape)}, pools "
                             f"{tuple(conv_pool.shape)} / {tuple(ssm_pool.shape)}, slots {list(slots)}: "
                             "not this layer's")
        zxbcdt = zxbcdt.contiguous()
        y = torch.empty(b, n, k.d_inner, dtype=torch.float32)
        xcat = torch.empty(b, k.d_conv - 1 + n, k.conv_dim, dtype=torch.float32)
        states = torch.empty(b, keep, *hpn, dtype=torch.float32)
        rc = self._c["mamba_short"](
            b, n, k.d_inner, k.conv_dim, k.heads, k.head_dim, k.d_state, k.d_conv, zxbcdt.data_ptr(),
            conv_pool.data_ptr(), ssm_pool.data_ptr(), (ctypes.c_long * b)(*slots), (_INT * b)(*lens),
            k.conv_wt.data_ptr(), k.conv_b.data_ptr(), k.dt_bias.data_ptr(), k.A.data_ptr(), k.D.data_ptr(),
            k.norm.data_ptr(), k.eps, y.data_ptr(), xcat.data_ptr(), states.data_ptr(), keep)
        if rc != 0:
            raise RuntimeError("smallgemm: mamba_short could not run (scratch allocation or shapes)")
        return y, xcat, states

    def argmax(self, x: torch.Tensor) -> torch.Tensor | None:
        """x.argmax(dim=-1) for a float32 CPU tensor (the first index of each row's largest value, as torch),
        or None when x holds a NaN (torch ranks NaN highest: ask it then)."""
        if x.dtype != torch.float32 or not x.is_cpu or x.dim() < 1:
            raise ValueError(f"smallgemm: argmax of {x.dtype} {tuple(x.shape)} on {x.device}: not a float32 CPU tensor")
        n = x.shape[-1]
        x = x.contiguous()
        out = torch.empty(x.shape[:-1], dtype=torch.long)
        rows = out.numel()
        if n == 0:
            raise ValueError("smallgemm: argmax over an empty last dimension")
        if rows and self._c["argmax"](rows, n, x.data_ptr(), out.data_ptr()) != 0:
            return None
        return out

    def rejection(self, logits: torch.Tensor, temperatures: Sequence[float], drafts: Sequence[Sequence[int]],
                  num_drafts: Sequence[int], draft_probs: torch.Tensor | None, uniforms: Sequence[Sequence[float]]
                  ) -> tuple[list[int], list[int]]:
        """Speculative sampling of temperature-only rows from the target's logits [b, k + 1, V] (float32, CPU):
        per request the accepted drafts and the one token drawn after them, as `verify.rejection_accept` at
        p = softmax(logits / temperature) (see smallgemm.c `specctl_rejection`). draft_probs [b, k, V] (q),
        or None for a deterministic drafter; uniforms: request i's num_drafts[i] + 1 draws."""
        b, k1, vocab = logits.shape
        nd = list(num_drafts)
        ok = (logits.dtype == torch.float32 and logits.is_cpu and len(temperatures) == len(drafts) == len(nd) == b
              and all(t > 0 for t in temperatures) and len(uniforms) == b
              and all(0 <= n < k1 and len(d) >= n and len(u) == n + 1 and all(0 <= t < vocab for t in d[:n])
                      for d, n, u in zip(drafts, nd, uniforms, strict=True))
              and (draft_probs is None or (draft_probs.dtype == torch.float32 and draft_probs.is_cpu
                                           and tuple(draft_probs.shape) == (b, k1 - 1, vocab))))
        if not ok:
            raise ValueError(f"smallgemm: rejection of logits {tuple(logits.shape)} with {len(drafts)} requests: "
                             "shapes, temperatures, drafts or uniforms do not fit")
        logits = logits.contiguous()
        q = None if draft_probs is None else draft_probs.contiguous()
        k = k1 - 1
        flat = (ctypes.c_long * max(1, b * k))(*_padded([d[:n] for d, n in zip(drafts, nd, strict=True)], k, 0))
        unif = (ctypes.c_float * (b * k1))(*_padded(uniforms, k1, 0.0))
        scratch = torch.empty(2 * vocab, dtype=torch.float32)
        accepted = (_INT * b)()
        tokens = (ctypes.c_long * b)()
        self._c["rejection"](
            b, k1, vocab, logits.data_ptr(), (ctypes.c_float * b)(*temperatures), flat, (_INT * b)(*nd),
            None if q is None else q.data_ptr(), unif, scratch.data_ptr(), accepted, tokens)
        return list(accepted), list(tokens)

    def sample(self, logits: torch.Tensor, temperatures: Sequence[float], uniforms: Sequence[float]
               ) -> torch.Tensor | None:
        """One token per row of logits [n, V] (float32, CPU): drawn from softmax(row / temperature) with the row's
        uniform (inverse CDF, as `sampling.sample_from_probs`), or the argmax where the temperature is 0; None
        when a greedy row holds a NaN (torch ranks NaN highest: ask it then, as `argmax`)."""
        n, vocab = logits.shape
        if logits.dtype != torch.float32 or not logits.is_cpu or len(temperatures) != n or len(uniforms) != n:
            raise ValueError(f"smallgemm: sample of {logits.dtype} {tuple(logits.shape)} with {len(temperatures)} "
                             f"temperatures and {len(uniforms)} uniforms")
        logits = logits.contiguous()
        out = torch.empty(n, dtype=torch.long)
        scratch = torch.empty(vocab, dtype=torch.float32)
        rc = self._c["sample"](
            n, vocab, logits.data_ptr(), (ctypes.c_float * n)(*temperatures), (ctypes.c_float * n)(*uniforms),
            scratch.data_ptr(), out.data_ptr())
        return out if rc == 0 else None

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over the last dimension of x (float32, CPU): x / sqrt(mean(x^2) + eps) * weight, weight
        [features] contiguous float32. One call of 5-9 us where torch's rms_norm took 14-23 us on a decode step's
        few rows (measured here), and a step of the builtin hybrid makes nine."""
        n = weight.numel()
        if x.shape[-1] != n or x.dtype != torch.float32 or not x.is_cpu or not weight.is_contiguous():
            raise ValueError(f"smallgemm: rms_norm of {x.dtype} {tuple(x.shape)} on {x.device} with a weight of "
                             f"{n}: not a float32 CPU tensor of that many features")
        x = x.contiguous()
        out = torch.empty_like(x)
        rows = x.numel() // n if n else 0
        if rows:
            self._c["rmsnorm"](rows, n, x.data_ptr(), weight.data_ptr(), eps, out.data_ptr())
        return out

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                  kpos: torch.Tensor, qpos: torch.Tensor, qvalid: torch.Tensor | None, window: int) -> torch.Tensor:
        """Grouped-query attention of a few queries per item over keys in the pools: q [b, L, H, d] at
        positions qpos [b, L] (qvalid [b, L] False at padding, which gets zeros; None: all real); item i's
        keys and values at slots slots[i] of keys / values [slots, KV, d], at positions kpos[i] (a key is
        seen by the queries at or after its position, and within the last `window` positions when window
        > 0). Softmax scaled by 1 / sqrt(d), as torch's sdpa. Returns [b, L, H, d]. float32, CPU."""
        b, n, heads, d = q.shape
        if (keys.dim() != 3 or keys.shape != values.shape or keys.shape[2] != d or heads % keys.shape[1]
                or slots.shape != kpos.shape or slots.shape[0] != b or tuple(qpos.shape) != (b, n)
                or (qvalid is not None and tuple(qvalid.shape) != (b, n))
                or not (keys.is_contiguous() and values.is_contiguous())):
            raise ValueError(f"smallgemm: attention got q {tuple(q.shape)}, pools {tuple(keys.shape)}, slots "
                             f"{tuple(slots.shape)}, positions {tuple(qpos.shape)}: they do not fit")
        q = q.contiguous()
        slots, kpos = slots.contiguous(), kpos.contiguous()
        qpos = qpos.contiguous()
        ok = None if qvalid is None else qvalid.to(torch.uint8).contiguous()
        out = torch.empty_like(q)
        rc = self._c["paged_attention"](
            b, n, heads, keys.shape[1], d, slots.shape[1], q.data_ptr(), keys.data_ptr(), values.data_ptr(),
            slots.data_ptr(), kpos.data_ptr(), qpos.data_ptr(), None if ok is None else ok.data_ptr(), window,
            1.0 / math.sqrt(d), out.data_ptr())
        if rc != 0:
            raise RuntimeError("smallgemm: attention could not run (scratch allocation or shapes)")
        return out


_T = TypeVar("_T")


def _padded(rows: Sequence[Sequence[_T]], width: int, fill: _T) -> Iterator[_T]:
    """The rows one after another, each filled out to `width` with `fill`: a [rows, width] C array's items."""
    for row in rows:
        yield from row
        yield from itertools.repeat(fill, width - len(row))


@dataclass(frozen=True)
class ChainSampling:
    """How `lone_chains` draws a chain's tokens in its loop instead of taking argmaxes: request i at
    temperature `temperatures[i]` (0: greedy, its argmax) draws its j-th token with `uniforms[i][j]` (from
    the request's own generator, in draw order) by the inverse CDF of softmax(logits / temperature), the
    draw `sampling.sample_from_probs` makes of a temperature-only row; `probs_out` [requests, max steps,
    vocab] (contiguous float32) receives each chosen position's distribution (one-hot for a greedy
    request), which speculative verification needs as q. Top-k and top-p rows are not this: their callers
    draw in Python (`ModelRunner.draft_chain`'s `choose`)."""

    temperatures: Sequence[float]
    uniforms: Sequence[Sequence[float]]
    probs_out: torch.Tensor

    def check(self, shape: tuple[int, int, int], steps: Sequence[int]) -> None:
        """Raise ValueError unless this fits chains of `steps` tokens with q of `shape` [requests, width, V]:
        a temperature per request, and a uniform per token a sampled request chooses (at most width)."""
        n, width, _ = shape
        out = self.probs_out
        if out.dtype != torch.float32 or not out.is_contiguous() or not out.is_cpu or tuple(out.shape) != shape:
            raise ValueError(f"smallgemm: probs_out must be contiguous float32 {list(shape)} on the CPU")
        if len(self.temperatures) != n or len(self.uniforms) != n or any(len(u) > width for u in self.uniforms):
            raise ValueError(f"smallgemm: sampling needs {n} temperatures and at most {width} uniforms per request")
        if any(t > 0 and len(u) < k for t, u, k in zip(self.temperatures, self.uniforms, steps, strict=True)):
            raise ValueError("smallgemm: a sampled request needs a uniform per token it chooses")


@dataclass(frozen=True)
class MambaConsts:
    """A Mamba-2 layer's sizes and weights as `SmallGemm.mamba_short` takes them (float32, contiguous): the
    conv's weight transposed [d_conv, conv_dim] and bias; dt_bias, A = -exp(A_log) and D [heads]; the gated
    norm's weight [d_inner] and eps."""

    d_inner: int
    conv_dim: int
    heads: int
    head_dim: int
    d_state: int
    d_conv: int
    eps: float
    conv_wt: torch.Tensor
    conv_b: torch.Tensor
    dt_bias: torch.Tensor
    A: torch.Tensor
    D: torch.Tensor
    norm: torch.Tensor


class _LoneLayer(ctypes.Structure):
    _fields_ = [(name, _PTR) for name in ("norm1", "wqkv", "bqkv", "wo", "norm2", "wgu", "wd", "kpool", "vpool")]


# The C structs this module mirrors, by their C name: `SmallGemm` refuses a library whose `specctl_sizeof_<name>`
# differs from the mirror's ctypes.sizeof.
STRUCTS: dict[str, type[ctypes.Structure]] = {"lone_layer": _LoneLayer}


@dataclass(frozen=True)
class LoneLayer:
    """One full-attention layer for `SmallGemm.lone_chains`: norms [hidden]; the matmuls as `pack` made them
    (qkv [(hq + 2 hkv) d, hidden] with its bias or None, o [hidden, hq d], gate_up [2 inter, hidden],
    down [hidden, inter]); the key and value pools [slots, hkv, d], contiguous."""

    norm1: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    norm2: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor


def _layer_array(layers: Sequence[LoneLayer]) -> ctypes.Array[_LoneLayer]:
    """The layers as the C side's `lone_layer` array (pointers to the tensors' data)."""
    arr = (_LoneLayer * len(layers))()
    for i, layer in enumerate(layers):
        arr[i] = _LoneLayer(*(None if t is None else t.data_ptr() for t in (
            layer.norm1, layer.qkv, layer.qkv_bias, layer.o, layer.norm2, layer.gate_up, layer.down,
            layer.keys, layer.values)))
    return arr


@dataclass(frozen=True)
class LoneModel:
    """What `lone_chains` needs of the model besides its layers (all float32, CPU, contiguous)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    embed: torch.Tensor  # [vocab, hidden]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # packed [vocab, hidden]
    cos: torch.Tensor  # [positions, head_dim]
    sin: torch.Tensor  # [positions, head_dim], sign-folded (model.rope_table)


def _cache_dir() -> Path:
    env = os.environ.get("SPECCTL_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "specctl"


def _cpu_flags() -> str:
    """This CPU's feature flags (what -march=native compiles for)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


_FLAG_SETS = (["-O3", "-march=native"], ["-O3"])  # the second for compilers without -march=native


def _build(cc: str, out: Path, flag_sets: tuple[list[str], ...] = _FLAG_SETS) -> bool:
    """Compile SOURCE to `out` with the first flag set that works (atomically: a temporary file renamed
    into place); False, leaving nothing behind, when none does."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        so = Path(tmp) / out.name
        for flags in flag_sets:
            cmd = [cc, *flags, "-shared", "-fPIC", "-o", str(so), str(SOURCE), "-lm"]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False)
            except (OSError, subprocess.SubprocessError) as exc:
                log.debug("smallgemm: %s failed: %s", cmd, exc)
                continue
            if done.returncode == 0:
                os.replace(so, out)
                return True
            log.debug("smallgemm: %s failed: %s", cmd, done.stderr.strip()[-400:])
    return False


def _load() -> SmallGemm | None:
    if os.environ.get("SPECCTL_SMALL_GEMM", "1") == "0" or sys.platform not in ("linux", "darwin"):
        return None
    cc = _compiler()
    if cc is None or not SOURCE.is_file():
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    key = hashlib.sha256("\0".join((SOURCE.read_text(), cc, version, _cpu_flags())).encode()).hexdigest()[:16]
    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    path = _cache_dir() / "kernels" / f"smallgemm-{key}{suffix}"
    try:
        if not path.is_file() and not _build(cc, path):
            log.info("smallgemm: could not build %s with %s; using torch's matmul kernels", SOURCE.name, cc)
            return None
        return SmallGemm(ctypes.CDLL(str(path)), path)
    except KernelMismatch as exc:
        log.warning("smallgemm: %s does not match engine/smallgemm.py (%s); using torch's kernels", path, exc)
        return None
    except (OSError, AttributeError) as exc:
        log.info("smallgemm: %s unusable (%s); using torch's matmul kernels", path, exc)
        return None


@functools.cache
def kernel() -> SmallGemm | None:
    """The kernel, built and loaded on the first call (None when unavailable; see the module docstring)."""
    return _load()
