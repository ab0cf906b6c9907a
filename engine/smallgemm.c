/* Float32 y = x W^T + b for the few rows of a decode step or a speculative verify (engine/smallgemm.py).
 *
 * The weight comes transposed and cut into panels of PANEL columns, wp [ceil(N / PANEL), K, PANEL]
 * (`pack_weight` in smallgemm.py; the last panel zero-padded), so the kernel streams it front to back. A
 * block of y (up to MR rows, one panel of columns) is a sum over k of the panel's row k scaled by x[m, k]:
 * every panel row is loaded once per block of rows and feeds MR x NB vector multiply-adds, with no
 * horizontal reductions. Each y[m, n] is bias[n] plus the
 * products x[m, k] W[n, k] added in k order, the same sum whatever M is, so a row computes to the same
 * bits alone (a decode step) as inside a verify of several positions.
 *
 * Built by engine/smallgemm.py with the system C compiler and -march=native: AVX-512 intrinsics where the CPU
 * has them, else AVX2 and FMA intrinsics (most x86 CPUs of the last decade), else plain loops that the
 * compiler vectorises; every path adds the products in k order. */
#include <stddef.h>
#include <string.h>

#define PANEL 64 /* columns per panel; smallgemm.py's PANEL */

#if defined(__AVX512F__)
#include <immintrin.h>

#define NB (PANEL / 16) /* vectors of 16 floats per panel */
/* Rows per block: 6, whose 6 x 4 accumulators, 4 weight vectors and a broadcast fit the 32 registers (8 x 4
 * spilled: 20-25% slower at 32-64 rows), a last 7 or 8 rows split 4 + 3 or 4 + 4 (a block of one or two rows
 * loads a weight vector per one or two multiply-adds). But a call of at most 8 rows (a decode step at batch
 * 8) is one block, spills and all: two blocks would read each panel twice, and a weight streamed from memory
 * (a Llama's 4 MB lm_head) pays that second pass in full (20% slower). */
#define MR 6
#define MR_TAIL 8

static inline __attribute__((always_inline)) void block(int mr, int K, int N, const float *x, long ldx,
                                                         const float *wp, const float *bias, float *y,
                                                         long ldy, int n0, int nv, __mmask16 tail) {
    (void)N;
    __m512 acc[MR_TAIL][NB];
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < nv; j++) {
            __mmask16 mk = (j == nv - 1) ? tail : (__mmask16)0xFFFF;
            acc[m][j] = bias ? _mm512_maskz_loadu_ps(mk, bias + n0 + 16 * j) : _mm512_setzero_ps();
        }
    const float *panel = wp + (long)(n0 / PANEL) * K * PANEL;
    for (int k = 0; k < K; k++) {
        const float *w = panel + (long)k * PANEL;
        __m512 wv[NB];
        for (int j = 0; j < nv; j++) wv[j] = _mm512_loadu_ps(w + 16 * j); /* padded: no mask needed */
        for (int m = 0; m < mr; m++) {
            __m512 xb = _mm512_set1_ps(x[m * ldx + k]);
            for (int j = 0; j < nv; j++) acc[m][j] = _mm512_fmadd_ps(xb, wv[j], acc[m][j]);
        }
    }
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < nv; j++)
            _mm512_mask_storeu_ps(y + m * ldy + n0 + 16 * j, (j == nv - 1) ? tail : (__mmask16)0xFFFF, acc[m][j]);
}

/* Rows in chunks of up to MC, and within a chunk each panel of the weight passes over all of the chunk's
 * blocks of MR rows before the next panel: a panel (K x 64 floats, 48-160 KB here) stays in cache while the
 * chunk's rows (MC x K floats) do too, so the weight streams in once per chunk, not once per MR rows (a
 * 32-row verify read a model's weights four times; a Llama's 4 MB lm_head does not fit a core's L2). Each
 * y element is still its own sum in k order, whatever the blocking. */
#define MC 64
static void rows(int M, int K, int N, const float *x, long ldx, const float *wp, const float *bias, float *y,
                 long ldy) {
    for (int c0 = 0; c0 < M; c0 += MC) {
        const int cm = M - c0 < MC ? M - c0 : MC;
        for (int n0 = 0; n0 < N; n0 += PANEL) {
            int rem = N - n0;
            int nv = rem >= 16 * NB ? NB : (rem + 15) / 16;
            int last = rem - 16 * (nv - 1);
            __mmask16 tail = last >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << last) - 1);
            for (int m0 = c0, mr; m0 < c0 + cm; m0 += mr) {
                const int left = c0 + cm - m0;
                mr = cm <= MR_TAIL ? cm : left <= MR ? left : left < MR + 3 ? (left + 1) / 2 : MR;
                const float *xm = x + (long)m0 * ldx;
                float *ym = y + (long)m0 * ldy;
                /* constant row and vector counts let the compiler keep the accumulators in registers */
#define BLOCKS(NV)                                                                     \
    switch (mr) {                                                                      \
        case 8: block(8, K, N, xm, ldx, wp, bias, ym, ldy, n0, NV, tail); break;       \
        case 7: block(7, K, N, xm, ldx, wp, bias, ym, ldy, n0, NV, tail); break;       \
        case 6: block(6, K, N, xm, ldx, wp, bias, ym, ldy, n0, NV, tail); break;       \
        case 5: block(5, K, N, xm, ldx, wp, bias, ym, ldy, n0, NV, tail); break;       \
        case 4: block(4, K, N, xm, ldx, wp, bias, ym, ldy, n0, NV, tail); break;       \
        case 3: block(3, K, N, xm, ldx, wp, bias, ym, ldy, n0, NV, tail); break;       \
        case 2: block(2, K, N, xm, ldx, wp, bias, ym, ldy, n0, NV, tail); break;       \
        default: block(1, K, N, xm, ldx, wp, bias, ym, ldy, n0, NV, tail); break;      \
    }
                if (nv == NB) {
                    BLOCKS(NB)
                } else {
                    BLOCKS(nv)
                }
#undef BLOCKS
            }
        }
    }
}
#define ISA 512
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* AVX2 + FMA (16 vector registers of 8 floats): a block is at most 12 accumulators, 3 rows x half a panel
 * (4 vectors) or 1 row x the whole panel (8 vectors), so each panel row loaded feeds 8-12 multiply-adds.
 * Every row block of a call passes over one half panel before the next (MR is large): half a panel of the
 * builtin models' weights (K x 32 floats, 24-64 KB) stays in L1/L2 across the row blocks, and the weight
 * is read from memory once per call, not once per 8 rows. */
#define MR 48

static inline __attribute__((always_inline)) void tile(int mr, int nv, int K, const float *x, long ldx,
                                                        const float *w0, const float *bias, float *y, long ldy) {
    __m256 acc[3][8];
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < nv; j++) acc[m][j] = bias ? _mm256_loadu_ps(bias + 8 * j) : _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *w = w0 + (long)k * PANEL;
        __m256 wv[8];
        for (int j = 0; j < nv; j++) wv[j] = _mm256_loadu_ps(w + 8 * j);
        for (int m = 0; m < mr; m++) {
            const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
            for (int j = 0; j < nv; j++) acc[m][j] = _mm256_fmadd_ps(xb, wv[j], acc[m][j]);
        }
    }
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < nv; j++) _mm256_storeu_ps(y + m * ldy + 8 * j, acc[m][j]);
}

static void rows(int mr, int K, int N, const float *x, long ldx, const float *wp, const float *bias, float *y,
                 long ldy) {
    float ypad[MR * PANEL], bpad[PANEL]; /* a zero-padded last panel's results, all rows */
    const int pairs = mr % 3 == 1 ? mr - 1 : mr; /* rows in blocks of 3 (and one of 2); a lone last row
                                                    takes the whole panel */
    for (int n0 = 0; n0 < N; n0 += PANEL) {
        const int nn = N - n0 < PANEL ? N - n0 : PANEL;
        const float *panel = wp + (long)(n0 / PANEL) * K * PANEL;
        const float *b = bias ? bias + n0 : NULL;
        if (b && nn < PANEL) { /* the last panel is zero-padded; its bias and results go through buffers */
            memcpy(bpad, b, sizeof(float) * (size_t)nn);
            memset(bpad + nn, 0, sizeof(float) * (size_t)(PANEL - nn));
            b = bpad;
        }
        const int full = nn == PANEL;
        for (int h = 0; h < PANEL; h += 32) {
            for (int m0 = 0; m0 < pairs; m0 += 3) {
                const int g = pairs - m0 >= 3 ? 3 : 2;
                const float *xm = x + (long)m0 * ldx;
                float *ym = full ? y + (long)m0 * ldy + n0 + h : ypad + m0 * PANEL + h;
                const long ld = full ? ldy : PANEL;
                if (g == 3) tile(3, 4, K, xm, ldx, panel + h, b ? b + h : NULL, ym, ld);
                else tile(2, 4, K, xm, ldx, panel + h, b ? b + h : NULL, ym, ld);
            }
        }
        if (pairs < mr)
            tile(1, 8, K, x + (long)pairs * ldx, ldx, panel, b, full ? y + (long)pairs * ldy + n0 : ypad + pairs * PANEL,
                 full ? ldy : PANEL);
        if (!full)
            for (int m = 0; m < mr; m++)
                memcpy(y + (long)m * ldy + n0, ypad + m * PANEL, sizeof(float) * (size_t)nn);
    }
}
#define ISA 256
#else
#define MR 8
static void rows(int mr, int K, int N, const float *x, long ldx, const float *wp, const float *bias, float *y,
                 long ldy) {
    for (int m = 0; m < mr; m++) {
        float *ym = y + m * ldy;
        for (int n0 = 0; n0 < N; n0 += PANEL) {
            const int nn = N - n0 < PANEL ? N - n0 : PANEL;
            const float *panel = wp + (long)(n0 / PANEL) * K * PANEL;
            float acc[PANEL];
            for (int j = 0; j < PANEL; j++) acc[j] = bias && j < nn ? bias[n0 + j] : 0.0f;
            for (int k = 0; k < K; k++) {
                const float xv = x[m * ldx + k];
                const float *w = panel + (long)k * PANEL;
                for (int j = 0; j < PANEL; j++) acc[j] += xv * w[j];
            }
            for (int j = 0; j < nn; j++) ym[n0 + j] = acc[j];
        }
    }
}
#define ISA 0
#endif

/* Which path this build took: 512 (AVX-512 intrinsics), 256 (AVX2 and FMA intrinsics) or 0 (compiler-vectorised
 * loops). */
int specctl_sgemm_isa(void) { return ISA; }

/* The columns of one panel of a packed weight (smallgemm.py `pack`). */
int specctl_sgemm_panel(void) { return PANEL; }

/* y [M, N] = x [M, K] (row stride ldx) times the packed weight wp, plus bias [N] when not NULL. */

void specctl_sgemm(int M, int N, int K, const float *x, long ldx, const float *wp, const float *bias, float *y) {
#if ISA == 512
    rows(M, K, N, x, ldx, wp, bias, y, N); /* all rows: it blocks them itself */
    return;
#endif
    for (int m0 = 0; m0 < M; m0 += MR) {
        int mr = M - m0 < MR ? M - m0 : MR;
        rows(mr, K, N, x + (long)m0 * ldx, ldx, wp, bias, y + (long)m0 * N, N);
    }
}

/* ---- a draft model's chains, greedy or sampled, a batch of requests in one call (smallgemm.py `lone_chains`) --
 *
 * A full-attention Llama-family model (the builtin drafter) decoding requests token by token: per
 * token, per layer, RMSNorm -> fused q/k/v (+ bias) -> rotate-half rope (cos and sign-folded sin tables)
 * -> write k, v at the request's slot -> grouped-query attention over its positions 0..p -> o_proj and
 * residual -> RMSNorm -> fused gate/up -> silu(gate) * up -> down and residual; then the final RMSNorm and
 * the lm_head, and the argmax (the lowest id among equal maxima, as torch's argmax). The same function as
 * HybridForCausalLM.forward_lone at one token (to float32 rounding): what it saves is the ~35 dispatched
 * ops per draft token, most of a tiny model's step. */
#include <math.h>
#include <stdlib.h>

typedef struct {
    const float *norm1, *wqkv, *bqkv, *wo, *norm2, *wgu, *wd; /* w*: packed panels (specctl_sgemm) */
    float *kpool, *vpool;                                       /* [slots, hkv, d] */
} lone_layer;

/* sizeof(lone_layer), which smallgemm.py checks its ctypes mirror against before any call passes one. */
long specctl_sizeof_lone_layer(void) { return (long)sizeof(lone_layer); }

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* the sum of a vector's 8 lanes */
static inline float hsum8(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

/* The few vector operations the width-generic loops below use: 16 lanes with AVX-512, 8 with AVX2 + FMA
 * (VL 0: neither, and those loops are compiled out). */
#if defined(__AVX512F__)
typedef __m512 vec;
#define VL 16
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps
#define VFMA _mm512_fmadd_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VDIV _mm512_div_ps
#define VMIN _mm512_min_ps
#define VMAX _mm512_max_ps
#define VFNMADD _mm512_fnmadd_ps
#define VROUND(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2(y, n) _mm512_scalef_ps((y), (n)) /* y 2^n */
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
#define VL 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VZERO _mm256_setzero_ps
#define VFMA _mm256_fmadd_ps
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VDIV _mm256_div_ps
#define VMIN _mm256_min_ps
#define VMAX _mm256_max_ps
#define VFNMADD _mm256_fnmadd_ps
#define VROUND(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2(y, n) /* y 2^n, 2^n built in the exponent bits */ \
    _mm256_mul_ps((y), _mm256_castsi256_ps(_mm256_slli_epi32(                  \
                           _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)))
#else
#define VL 0
#endif

/* q . k over d features in 16 partial sums (one vector), then added together. A plain running sum is a
 * chain of d dependent adds: most of a chain's time at a few hundred cached positions. */
static inline float dot(const float *a, const float *b, int n) {
#if defined(__AVX512F__)
    if (n % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int e = 0; e < n; e += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + e), _mm512_loadu_ps(b + e), acc);
        return _mm512_reduce_add_ps(acc);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (n % 8 == 0) {
        /* two vectors of partial sums; the plain loop's 16 sums in memory and their scalar tree were most of
         * a head_dim-32 attention's time (a batch-32 decode step of a random Llama: 1.9 ms per layer) */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        int e = 0;
        for (; e + 16 <= n; e += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e + 8), _mm256_loadu_ps(b + e + 8), a1);
        }
        if (e < n) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), a0);
        return hsum8(_mm256_add_ps(a0, a1));
    }
#endif
    float acc[16] = {0.0f};
    int e = 0;
    for (; e + 16 <= n; e += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[e + j] * b[e + j];
    for (int j = 0; e < n; e++, j++) acc[j] += a[e] * b[e];
    for (int w = 8; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

static void rmsnorm(int n, const float *x, const float *w, float eps, float *out) {
    const float r = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* Row-wise argmax of x [rows, n] (contiguous) into out [rows]: the first index of each row's largest value,
 * as torch.argmax. Returns 0, or 1 when a row holds a NaN (out is then incomplete: torch ranks NaN above
 * every number, and the caller asks it). A greedy step of a 4,096-token vocabulary at batch 32 took torch
 * ~90 us here. */
int specctl_argmax(int rows, int n, const float *x, long *out) {
    for (int r = 0; r < rows; r++) {
        const float *row = x + (long)r * n;
        int e = 0, best = 0;
        float bv = n > 0 ? row[0] : 0.0f;
#if defined(__AVX512F__)
        if (n >= 16) {
            __m512 vmax = _mm512_set1_ps(-INFINITY);
            __m512i vidx = _mm512_set1_epi32(0), idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            const __m512i step = _mm512_set1_epi32(16);
            __mmask16 nan = 0;
            for (; e + 16 <= n; e += 16) {
                const __m512 v = _mm512_loadu_ps(row + e);
                nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                const __mmask16 gt = _mm512_cmp_ps_mask(v, vmax, _CMP_GT_OQ); /* strictly: a lane keeps its first */
                vmax = _mm512_mask_mov_ps(vmax, gt, v);
                vidx = _mm512_mask_mov_epi32(vidx, gt, idx);
                idx = _mm512_add_epi32(idx, step);
            }
            if (nan) return 1;
            bv = _mm512_reduce_max_ps(vmax);
            const __mmask16 at = _mm512_cmp_ps_mask(vmax, _mm512_set1_ps(bv), _CMP_EQ_OQ);
            best = _mm512_mask_reduce_min_epi32(at, vidx); /* the lowest index among the lanes holding it */
            if (bv == -INFINITY) { /* every value so far is -inf: the first one */
                best = 0;
            }
        }
#endif
        for (; e < n; e++) {
            const float v = row[e];
            if (v != v) return 1;
            if (v > bv) {
                bv = v;
                best = e;
            }
        }
        out[r] = best;
    }
    return 0;
}

/* RMSNorm of `rows` rows of n features (x and out [rows, n], contiguous; w [n]): the models' norms on the
 * serving path (smallgemm.py `rms_norm`). A row's result does not depend on the others. */
void specctl_rmsnorm(int rows, int n, const float *x, const float *w, float eps, float *out) {
    for (int r = 0; r < rows; r++) rmsnorm(n, x + (long)r * n, w, eps, out + (long)r * n);
}

#if VL
/* e^x, VL lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes' expf polynomial, times 2^n. Within 2 ulp
 * of expf for |x| <= 87; x is clamped there (e^-87 is as good as 0 next to 1, e^87 as inf; 2^n, |n| <= 126,
 * stays a normal float where it is built in the exponent bits). */
static inline vec vexp(vec x) {
    x = VMIN(VMAX(x, VSET1(-87.0f)), VSET1(87.0f));
    const vec n = VROUND(VMUL(x, VSET1(1.44269504088896341f)));
    vec r = VFNMADD(n, VSET1(0.693359375f), x);
    r = VFNMADD(n, VSET1(-2.12194440e-4f), r);
    vec q = VSET1(1.9875691500e-4f);
    q = VFMA(q, r, VSET1(1.3981999507e-3f));
    q = VFMA(q, r, VSET1(8.3334519073e-3f));
    q = VFMA(q, r, VSET1(4.1665795894e-2f));
    q = VFMA(q, r, VSET1(1.6666665459e-1f));
    q = VFMA(q, r, VSET1(5.0000001201e-1f));
    return VPOW2(VADD(VFMA(VMUL(q, r), r, r), VSET1(1.0f)), n);
}
#endif

/* scores[s] = e^(scores[s] - mx) for s < n; returns their sum (the softmax's denominator). */
static float exp_shifted(int n, float *scores, float mx) {
    float sum = 0.0f;
    int s = 0;
#if defined(__AVX512F__)
    const __m512 m = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (; s < n; s += 16) {
        const __mmask16 k = n - s >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - s)) - 1);
        const __m512 e = vexp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, scores + s), m));
        _mm512_mask_storeu_ps(scores + s, k, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    }
    sum = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 m = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    for (; s + 8 <= n; s += 8) {
        const __m256 e = vexp(_mm256_sub_ps(_mm256_loadu_ps(scores + s), m));
        _mm256_storeu_ps(scores + s, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = hsum8(acc);
#endif
    for (; s < n; s++) {
        scores[s] = expf(scores[s] - mx);
        sum += scores[s];
    }
    return sum;
}

/* out[e] = silu(g[e]) u[e] = g[e] / (1 + e^-g[e]) u[e] (the gated MLP's activation), or silu(g[e]) when u
 * is NULL; out may be g or u. */
static void silu_mul(int n, const float *g, const float *u, float *out) {
    int e = 0;
#if VL
    const vec one = VSET1(1.0f);
    for (; e + VL <= n; e += VL) {
        const vec gv = VLOAD(g + e);
        const vec sv = VDIV(gv, VADD(one, vexp(VSUB(VZERO(), gv))));
        VSTORE(out + e, u ? VMUL(sv, VLOAD(u + e)) : sv);
    }
#endif
    for (; e < n; e++) {
        const float sv = g[e] / (1.0f + expf(-g[e]));
        out[e] = u ? sv * u[e] : sv;
    }
}

/* out [d] = sum over s < n of w[s] v[row s ..], row s at v + rows[s], or at v + s * ldv when rows is NULL:
 * the attention output of one head. The sums stay in registers across the positions (4 vectors of
 * features at a time), not in memory. */
static void weighted_sum(int n, int d, const float *w, const float *v, long ldv, const long *rows, float *out) {
#if VL
    if (d % VL == 0) {
        /* chunks of 4 vectors of features, the last 1-3 when d is not a multiple (head_dim 32 with AVX-512:
         * the plain loop below kept its sums in memory, a load and a store per feature and key) */
        for (int e0 = 0; e0 < d; e0 += 4 * VL) {
            const int c = d - e0 >= 4 * VL ? 4 : (d - e0) / VL;
            vec a0 = VZERO(), a1 = a0, a2 = a0, a3 = a0;
            for (int s = 0; s < n; s++) {
                const vec ws = VSET1(w[s]);
                const float *vs = v + (rows ? rows[s] : (long)s * ldv) + e0;
                a0 = VFMA(ws, VLOAD(vs), a0);
                if (c > 1) a1 = VFMA(ws, VLOAD(vs + VL), a1);
                if (c > 2) a2 = VFMA(ws, VLOAD(vs + 2 * VL), a2);
                if (c > 3) a3 = VFMA(ws, VLOAD(vs + 3 * VL), a3);
            }
            VSTORE(out + e0, a0);
            if (c > 1) VSTORE(out + e0 + VL, a1);
            if (c > 2) VSTORE(out + e0 + 2 * VL, a2);
            if (c > 3) VSTORE(out + e0 + 3 * VL, a3);
        }
        return;
    }
#endif
    for (int e = 0; e < d; e++) out[e] = 0.0f;
    for (int s = 0; s < n; s++) {
        const float ws = w[s];
        const float *vs = v + (rows ? rows[s] : (long)s * ldv);
        for (int e = 0; e < d; e++) out[e] += ws * vs[e];
    }
}

/* One query head over n keys: out [d] = softmax(q . k_s * scale) weighted sum of v_s, key and value s at
 * k + off_s and v + off_s, off_s = rows[s], or s * ld when rows is NULL. scores: scratch of n floats. */
static void attend_head(int n, int d, const float *q, const float *k, const float *v, long ld, const long *rows,
                        float scale, float *scores, float *out) {
    float mx = -INFINITY;
    for (int s = 0; s < n; s++) {
        scores[s] = dot(q, k + (rows ? rows[s] : (long)s * ld), d) * scale;
        if (scores[s] > mx) mx = scores[s];
    }
    const float inv = 1.0f / exp_shifted(n, scores, mx);
    for (int s = 0; s < n; s++) scores[s] *= inv;
    weighted_sum(n, d, scores, v, ld, rows, out);
}

static void rope(int heads, int d, float *x, const float *cos_p, const float *sin_p) {
    const int half = d / 2;
    float tmp[1024];
    for (int h = 0; h < heads; h++) {
        float *v = x + h * d;
        for (int i = 0; i < half; i++) tmp[i] = v[i] * cos_p[i] + v[i + half] * sin_p[i];
        for (int i = half; i < d; i++) tmp[i] = v[i] * cos_p[i] + v[i - half] * sin_p[i];
        memcpy(v, tmp, (size_t)d * sizeof(float));
    }
}

/* A batch of chains, advanced together: request r feeds its n_feed[r] = feed_off[r + 1] - feed_off[r] tokens
 * (feed + feed_off[r]) at positions start[r].. (slot base[r] + position), then chooses steps[r] tokens by
 * argmax, feeding each but the last. Position i of every request still going runs in one pass, so each
 * matmul multiplies all of their rows at once (a draft batch of 8 costs about 2x one request, not 8x);
 * attention, rope and the k/v writes stay per row. Request r's tokens go to out + r * stride, and each
 * chosen position's logits to logits_out + (r * stride + j) * vocab unless it is NULL. With temps (per
 * request; NULL: every request greedy), a request with temps[r] > 0 samples instead of taking the argmax
 * (`draw`): its position j draws with the uniform unif[r * stride + j], and the distribution it drew from
 * goes to probs_out + (r * stride + j) * vocab (a greedy request's there is one-hot at its argmax), so
 * the verify's rejection sampling gets q without a host round trip per draft token. A row's results are
 * the bits it gets alone: the kernel's sums do not depend on the row count. Returns 0, or -1 if the
 * scratch allocation fails or a head is wider than 1024. */
#if defined(__AVX512F__)
static void attend_group16(int n, int d, int rep, const float *q, const float *k, const float *v, const long *rows,
                           float scale, float *sc, long ldw, float *out);
#endif

/* q = softmax(logits / temp) over vocab entries, as sampling.py's probs_from_logits for a temperature-only
 * row (the exponentials vectorised, as attention's). */
static void softmax_t(int vocab, const float *logits, float temp, float *q) {
    float mx = -INFINITY;
    for (int v = 0; v < vocab; v++) {
        q[v] = logits[v] / temp;
        if (q[v] > mx) mx = q[v];
    }
    const float total = exp_shifted(vocab, q, mx);
    for (int v = 0; v < vocab; v++) q[v] = q[v] / total;
}

/* The id the uniform u picks from q (non-negative, any positive total), as sampling.py's inverse_cdf: the
 * running sum c (accumulated in double, compared in float, as torch's cumsum on the CPU), the first id
 * whose c exceeds u * c[vocab - 1] (searchsorted, right), at most vocab - 1. */
static long pick(int vocab, const float *q, float u) {
    double run = 0.0;
    for (int v = 0; v < vocab; v++) run += q[v];
    const float target = u * (float)run;
    run = 0.0;
    for (int v = 0; v < vocab; v++) {
        run += q[v];
        if ((float)run > target) return v;
    }
    return vocab - 1;
}

/* One token drawn from softmax(logits / temp) with the uniform u, its distribution left in q. */
static long draw(int vocab, const float *logits, float temp, float u, float *q) {
    softmax_t(vocab, logits, temp, q);
    return pick(vocab, q, u);
}

int specctl_lone_chains(int n_layers, const lone_layer *layers, int hidden, int hq, int hkv, int d, int inter,
                        int vocab, float eps, const float *embed, const float *final_norm, const float *lm_head,
                        const float *cos_t, const float *sin_t, int n_req, const long *base, const int *start,
                        const long *feed, const int *feed_off, const int *steps, long *out, int stride,
                        float *logits_out, const float *temps, const float *unif, float *probs_out) {
    if (d > 1024 || hq % hkv || n_req < 1) return -1;
    const int nq = hq * d, nk = hkv * d, nqkv = nq + 2 * nk;
    int maxlen = 0, iters = 0;
    for (int r = 0; r < n_req; r++) {
        const int n_feed = feed_off[r + 1] - feed_off[r];
        if (start[r] + n_feed + steps[r] > maxlen) maxlen = start[r] + n_feed + steps[r];
        if (n_feed + steps[r] - 1 > iters) iters = n_feed + steps[r] - 1;
    }
    const size_t R = (size_t)n_req;
    const int rep = hq / hkv;
    /* scores: attention's per key, and `draw`'s q when no probs_out takes it */
    const size_t n_scores = (size_t)maxlen * (size_t)rep > (size_t)vocab ? (size_t)maxlen * (size_t)rep : (size_t)vocab;
    float *buf = malloc(sizeof(float) * (R * (size_t)(4 * hidden + nqkv + nq + 3 * inter + vocab) + n_scores));
    int *idx = malloc(sizeof(int) * 3 * R);
    long *krows = malloc(sizeof(long) * (size_t)(maxlen > 0 ? maxlen : 1)); /* key s of a request: s * nk */
    if (!buf || !idx || !krows) {
        free(buf);
        free(idx);
        free(krows);
        return -1;
    }
    for (int s = 0; s < maxlen; s++) krows[s] = (long)s * nk;
    float *x = buf, *h = x + R * hidden, *t = h + R * hidden, *xn = t + R * hidden, *qkv = xn + R * hidden;
    float *o = qkv + R * nqkv, *gu = o + R * nq, *act = gu + R * 2 * inter, *logits = act + R * inter;
    float *scores = logits + R * vocab;
    int *rows_of = idx, *chosen = idx + R, *pos = idx + 2 * R; /* active row -> request; per request */
    const float scale = 1.0f / sqrtf((float)d);
    for (int r = 0; r < n_req; r++) chosen[r] = 0;
    for (int i = 0; i < iters; i++) {
        int m = 0; /* the requests still going at step i, as rows 0..m-1 */
        for (int r = 0; r < n_req; r++) {
            const int n_feed = feed_off[r + 1] - feed_off[r];
            if (i >= n_feed + steps[r] - 1) continue;
            const long tok = i < n_feed ? feed[feed_off[r] + i] : out[(long)r * stride + chosen[r] - 1];
            memcpy(x + (long)m * hidden, embed + tok * (long)hidden, sizeof(float) * (size_t)hidden);
            pos[m] = start[r] + i;
            rows_of[m++] = r;
        }
        for (int l = 0; l < n_layers; l++) {
            const lone_layer *L = layers + l;
            for (int j = 0; j < m; j++) rmsnorm(hidden, x + (long)j * hidden, L->norm1, eps, h + (long)j * hidden);
            specctl_sgemm(m, nqkv, hidden, h, hidden, L->wqkv, L->bqkv, qkv);
            for (int j = 0; j < m; j++) {
                const int p = pos[j];
                const long b = base[rows_of[j]];
                float *row = qkv + (long)j * nqkv, *oj = o + (long)j * nq;
                rope(hq + hkv, d, row, cos_t + (long)p * d, sin_t + (long)p * d); /* q and k side by side */
                memcpy(L->kpool + (b + p) * nk, row + nq, sizeof(float) * (size_t)nk);
                memcpy(L->vpool + (b + p) * nk, row + nq + nk, sizeof(float) * (size_t)nk);
#if defined(__AVX512F__)
                if (d % 16 == 0 && d <= 256) { /* a key/value head's query heads together, as the paged one */
                    for (int g = 0; g < hkv; g++)
                        attend_group16(p + 1, d, rep, row + (long)g * rep * d, L->kpool + b * nk + (long)g * d,
                                       L->vpool + b * nk + (long)g * d, krows, scale, scores, maxlen,
                                       oj + (long)g * rep * d);
                    continue;
                }
#endif
                for (int hh = 0; hh < hq; hh++) {
                    const long g = b * nk + (long)(hh / rep) * d;
                    attend_head(p + 1, d, row + hh * d, L->kpool + g, L->vpool + g, nk, NULL, scale, scores,
                                oj + hh * d);
                }
            }
            specctl_sgemm(m, hidden, nq, o, nq, L->wo, NULL, t);
            for (long e = 0; e < (long)m * hidden; e++) x[e] += t[e];
            for (int j = 0; j < m; j++) rmsnorm(hidden, x + (long)j * hidden, L->norm2, eps, h + (long)j * hidden);
            specctl_sgemm(m, 2 * inter, hidden, h, hidden, L->wgu, NULL, gu);
            for (int j = 0; j < m; j++) {
                const float *gj = gu + (long)j * 2 * inter;
                silu_mul(inter, gj, gj + inter, act + (long)j * inter);
            }
            specctl_sgemm(m, hidden, inter, act, inter, L->wd, NULL, t);
            for (long e = 0; e < (long)m * hidden; e++) x[e] += t[e];
        }
        /* logits only after a request's last fed token and after each chosen one: gather those rows */
        int nl = 0;
        for (int j = 0; j < m; j++) {
            const int r = rows_of[j];
            if (i + 1 < feed_off[r + 1] - feed_off[r]) continue;
            rmsnorm(hidden, x + (long)j * hidden, final_norm, eps, xn + (long)nl * hidden);
            rows_of[nl++] = r; /* nl <= j: overwrites only rows already read */
        }
        if (nl == 0) continue;
        specctl_sgemm(nl, vocab, hidden, xn, hidden, lm_head, NULL, logits);
        for (int j = 0; j < nl; j++) {
            const int r = rows_of[j];
            const float *lj = logits + (long)j * vocab;
            const long at = (long)r * stride + chosen[r];
            if (logits_out) memcpy(logits_out + at * vocab, lj, sizeof(float) * (size_t)vocab);
            if (temps && temps[r] > 0.0f) {
                out[at] = draw(vocab, lj, temps[r], unif[at], probs_out ? probs_out + at * vocab : scores);
            } else {
                int best = 0;
                for (int v = 1; v < vocab; v++)
                    if (lj[v] > lj[best]) best = v;
                out[at] = best;
                if (probs_out) {
                    float *q = probs_out + at * vocab;
                    for (int v = 0; v < vocab; v++) q[v] = 0.0f;
                    q[best] = 1.0f;
                }
            }
            chosen[r]++;
        }
    }
    free(buf);
    free(idx);
    free(krows);
    return 0;
}

/* ---- a Mamba-2 mixer's few positions: a decode step or a speculative verify (smallgemm.py `mamba_short`) --
 *
 * After in_proj, for each request r (its states at slot slots[r] of the cache's pools) and position t <
 * n (padding from lens[r] on: dt = 0 there, so the state passes through unchanged): the causal depthwise
 * conv over the previous d_conv - 1 inputs and this forward's, silu; dt = softplus(dt + dt_bias) (x itself
 * above 20, as torch); the recurrence
 *
 *     h_t = exp(dt A) h_{t-1} + (dt x_t) B_t,    y_t = h_t . C_t + D x_t
 *
 * per head and head channel, keeping the last nkeep h_t of each request (the cache's rollback states); then
 * Mamba-2's gated norm RMSNorm(y silu(z)). Writes y_out [b, n, d_inner] (what out_proj takes), xcat [b, d_conv
 * - 1 + n, conv_dim] (the conv inputs) and states [b, nkeep, H, P, N]: request r's row j is h_(off + j), h_0
 * the entering state, off = max(0, lens[r] + 1 - nkeep) (nkeep = n + 1: every state, h_0 first; a prompt
 * keeps only the few a rollback can reach, the others pass through two rows of scratch); then stores each
 * request's state after its last real position, and the conv inputs up to it, in the pools (conv_pool
 * [slots, conv_dim, d_conv - 1], ssm_pool [slots, H, P, N]). Each position is the same arithmetic whatever n
 * is, so a verify's states and outputs are a decode step's, bit for bit. conv_wt is the conv's weight
 * transposed, [d_conv, conv_dim]. */
int specctl_mamba_short(int b, int n, int d_inner, int conv_dim, int H, int P, int N, int dconv,
                        const float *zxbcdt, float *conv_pool, float *ssm_pool, const long *slots, const int *lens,
                        const float *conv_wt, const float *conv_b, const float *dt_bias, const float *A,
                        const float *D, const float *norm_w, float eps, float *y_out, float *xcat, float *states,
                        int nkeep) {
    if (d_inner != H * P || b < 1 || n < 1 || dconv < 1 || nkeep < 1 || nkeep > n + 1) return -1;
    const int width = d_inner + conv_dim + H, hist = dconv - 1;
    const long hpn = (long)H * P * N;
    float *xa = malloc(sizeof(float) * (size_t)(conv_dim + d_inner + 2 * hpn));
    if (!xa) return -1;
    float *y = xa + conv_dim, *ring = y + d_inner; /* the states no row keeps, alternately */
    for (int r = 0; r < b; r++) {
        float *xc = xcat + (long)r * (hist + n) * conv_dim;
        float *cs = conv_pool + slots[r] * conv_dim * hist;
        float *hs = ssm_pool + slots[r] * hpn;
        for (int c = 0; c < conv_dim; c++)
            for (int j = 0; j < hist; j++) xc[(long)j * conv_dim + c] = cs[(long)c * hist + j];
        for (int t = 0; t < n; t++)
            memcpy(xc + (long)(hist + t) * conv_dim, zxbcdt + ((long)r * n + t) * width + d_inner,
                   sizeof(float) * (size_t)conv_dim);
        const int len = lens[r] < n ? lens[r] : n, off = len + 1 - nkeep > 0 ? len + 1 - nkeep : 0;
        float *st = states + (long)r * nkeep * hpn;
#define STATE(f) ((f) - off < nkeep && (f) >= off ? st + (long)((f) - off) * hpn : ring + (long)((f) & 1) * hpn)
        memcpy(STATE(0), hs, sizeof(float) * (size_t)hpn);
        for (int t = 0; t < n; t++) {
            const float *row = zxbcdt + ((long)r * n + t) * width;
            memcpy(xa, conv_b, sizeof(float) * (size_t)conv_dim);
            for (int j = 0; j < dconv; j++) {
                const float *wj = conv_wt + (long)j * conv_dim, *in = xc + (long)(t + j) * conv_dim;
                for (int c = 0; c < conv_dim; c++) xa[c] += wj[c] * in[c];
            }
            silu_mul(conv_dim, xa, NULL, xa);
            const float *x = xa, *B = xa + d_inner, *Cm = xa + d_inner + N;
            const int ok = t < lens[r];
            const float *prev = STATE(t);
            float *cur = STATE(t + 1);
            for (int h = 0; h < H; h++) {
                const float raw = row[d_inner + conv_dim + h] + dt_bias[h];
                const float dtv = ok ? (raw > 20.0f ? raw : log1pf(expf(raw))) : 0.0f;
                const float da = expf(dtv * A[h]);
                for (int p = 0; p < P; p++) {
                    const long at = ((long)h * P + p) * N;
                    const float xv = x[h * P + p], dx = dtv * xv;
                    float yv;
#if defined(__AVX512F__)
                    if (N == 16) {
                        const __m512 hv = _mm512_fmadd_ps(_mm512_set1_ps(da), _mm512_loadu_ps(prev + at),
                                                          _mm512_mul_ps(_mm512_set1_ps(dx), _mm512_loadu_ps(B)));
                        _mm512_storeu_ps(cur + at, hv);
                        yv = _mm512_reduce_add_ps(_mm512_mul_ps(hv, _mm512_loadu_ps(Cm)));
                    } else
#elif defined(__AVX2__) && defined(__FMA__)
                    if (N == 16) {
                        const __m256 dav = _mm256_set1_ps(da), dxv = _mm256_set1_ps(dx);
                        const __m256 h0 = _mm256_fmadd_ps(dav, _mm256_loadu_ps(prev + at),
                                                          _mm256_mul_ps(dxv, _mm256_loadu_ps(B)));
                        const __m256 h1 = _mm256_fmadd_ps(dav, _mm256_loadu_ps(prev + at + 8),
                                                          _mm256_mul_ps(dxv, _mm256_loadu_ps(B + 8)));
                        _mm256_storeu_ps(cur + at, h0);
                        _mm256_storeu_ps(cur + at + 8, h1);
                        yv = hsum8(_mm256_fmadd_ps(h1, _mm256_loadu_ps(Cm + 8), _mm256_mul_ps(h0, _mm256_loadu_ps(Cm))));
                    } else
#endif
                    {
                        for (int k = 0; k < N; k++) cur[at + k] = da * prev[at + k] + dx * B[k];
                        yv = dot(cur + at, Cm, N);
                    }
                    y[h * P + p] = yv + D[h] * xv;
                }
            }
            /* gated norm: g = y silu(z), g / rms(g) times the weight */
            silu_mul(d_inner, row, y, y);
            const float rs = 1.0f / sqrtf(dot(y, y, d_inner) / (float)d_inner + eps);
            float *out = y_out + ((long)r * n + t) * d_inner;
            for (int i = 0; i < d_inner; i++) out[i] = norm_w[i] * (y[i] * rs);
        }
        /* the cache keeps the state after the last real position and the conv inputs ending there */
        memcpy(hs, STATE(len), sizeof(float) * (size_t)hpn); /* off <= len < off + nkeep: a kept row */
#undef STATE
        for (int c = 0; c < conv_dim; c++)
            for (int j = 0; j < hist; j++) cs[(long)c * hist + j] = xc[(long)(len + j) * conv_dim + c];
    }
    free(xa);
    return 0;
}

/* The AVX-512 path of the paged attention below: a key/value head's query heads together, sixteen keys at a
 * time. */
#if defined(__AVX512F__)
/* Lane s of the result = the sum of v[s]'s 16 lanes: sixteen dot products' partial sums reduced together
 * (45 shuffles and adds where sixteen separate reductions take ~130, each waiting on the last). */
static inline __m512 sum16x16(const __m512 *v) {
    __m512 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[2 * i]), c = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, c)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, c)));
    }
    for (int i = 0; i < 2; i++)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
}

/* Scores of one head over n keys (key s at k + rows[s]), scaled, into sc [n]; returns their maximum. Keys go
 * sixteen at a time: their products with q in sixteen independent vectors, then `sum16x16`. */
static inline __attribute__((always_inline)) float scores16(int n, int dv, const float *q, const float *k,
                                                            const long *rows, float scale, float *sc) {
    __m512 qv[16];
    for (int e = 0; e < dv; e++) qv[e] = _mm512_loadu_ps(q + 16 * e);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    const __m512 sv = _mm512_set1_ps(scale);
    for (int s0 = 0; s0 < n; s0 += 16) {
        const int m = n - s0 < 16 ? n - s0 : 16;
        __m512 acc[16];
        for (int t = 0; t < 16; t++) {
            if (t < m) {
                const float *kr = k + rows[s0 + t];
                __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
                for (int e = 1; e < dv; e++) a = _mm512_fmadd_ps(qv[e], _mm512_loadu_ps(kr + 16 * e), a);
                acc[t] = a;
            } else {
                acc[t] = _mm512_setzero_ps();
            }
        }
        const __mmask16 mk = m == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << m) - 1);
        const __m512 x = _mm512_mul_ps(sum16x16(acc), sv);
        _mm512_mask_storeu_ps(sc + s0, mk, x);
        mx = _mm512_mask_max_ps(mx, mk, mx, x);
    }
    return _mm512_reduce_max_ps(mx);
}

/* out[r] [d] = sum over s < n of w[r][s] v[rows[s]] for the hc heads r of one key/value head, w[r] at
 * w + r * ldw: every value row is loaded once for all of them, and the hc x dv sums stay in registers. */
static inline __attribute__((always_inline)) void wsum_heads(int n, int hc, int dv, const float *w, long ldw,
                                                             const float *v, const long *rows, float *out,
                                                             long ldo) {
    __m512 acc[16];
    for (int i = 0; i < hc * dv; i++) acc[i] = _mm512_setzero_ps();
    for (int s = 0; s < n; s++) {
        const float *vr = v + rows[s];
        for (int e = 0; e < dv; e++) {
            const __m512 x = _mm512_loadu_ps(vr + 16 * e);
            for (int r = 0; r < hc; r++) acc[r * dv + e] = _mm512_fmadd_ps(_mm512_set1_ps(w[r * ldw + s]), x, acc[r * dv + e]);
        }
    }
    for (int r = 0; r < hc; r++)
        for (int e = 0; e < dv; e++) _mm512_storeu_ps(out + r * ldo + 16 * e, acc[r * dv + e]);
}

/* The `rep` query heads of one key/value head (q and out: rep heads of d, consecutive) over n keys: each
 * head's softmax, then the weighted sums of all of them in one pass over the values. sc: rep * ldw floats
 * of scratch. d a multiple of 16, at most 256. */
static void attend_group16(int n, int d, int rep, const float *q, const float *k, const float *v, const long *rows,
                           float scale, float *sc, long ldw, float *out) {
    const int dv = d / 16;
    for (int r = 0; r < rep; r++) {
        float *w = sc + r * ldw;
        const float mx = scores16(n, dv, q + (long)r * d, k, rows, scale, w);
        const float inv = 1.0f / exp_shifted(n, w, mx);
        for (int s = 0; s < n; s++) w[s] *= inv;
    }
    const int hmax = 16 / dv;
    for (int r0 = 0; r0 < rep; r0 += hmax) {
        const int hc = rep - r0 < hmax ? rep - r0 : hmax;
        const float *w = sc + r0 * ldw;
        float *o = out + (long)r0 * d;
        /* constant head and vector counts let the compiler keep the sums in registers */
#define WSUM(HC, DV) wsum_heads(n, HC, DV, w, ldw, v, rows, o, d)
        if (dv == 2 && hc == 1) WSUM(1, 2);
        else if (dv == 2 && hc == 2) WSUM(2, 2);
        else if (dv == 2 && hc == 4) WSUM(4, 2);
        else if (dv == 2 && hc == 8) WSUM(8, 2);
        else if (dv == 4 && hc == 1) WSUM(1, 4);
        else if (dv == 4 && hc == 2) WSUM(2, 4);
        else if (dv == 4 && hc == 3) WSUM(3, 4);
        else if (dv == 4 && hc == 4) WSUM(4, 4);
        else if (dv == 8 && hc == 1) WSUM(1, 8);
        else if (dv == 8 && hc == 2) WSUM(2, 8);
        else wsum_heads(n, hc, dv, w, ldw, v, rows, o, d);
#undef WSUM
    }
}
#endif

/* ---- attention of a decode step or a verify over the paged key/value pools (smallgemm.py `attention`) ---
 *
 * Query j of item i (position qpos[i, j]; a padding query, qvalid[i, j] == 0, gets zeros) attends, per head
 * h (key/value head h / (H / KV)), to the keys k < kmax of its item with kpos[i, k] <= qpos and, when window
 * > 0, kpos > qpos - window; key k sits at slot slots[i, k] of kstore / vstore [slots, KV, d]. Softmax of
 * q . k * scale, then the weighted sum of the values; out [b, L, H, d]. A query's result does not depend on
 * the others, so a verify's rows are the decode steps' bits. With AVX-512 and head_dim a multiple of 16 (up to
 * 256) the query heads of one key/value head go together (`attend_group16`): scores sixteen keys at a time
 * and one pass over the values for all of them. A batch-32 decode step of a random Llama (head_dim 32, 8 heads
 * over 4 key/value heads, ~100 cached positions) took 565 us per layer that way before, 294-373 us now, its
 * keys and values mostly out of cache (warm: 133-174 -> 93-99 us). Returns 0, or -1 if scratch fails. */
int specctl_paged_attention(int b, int L, int H, int KV, int d, int kmax, const float *q, const float *kstore,
                            const float *vstore, const long *slots, const long *kpos, const long *qpos,
                            const unsigned char *qvalid, long window, float scale, float *out) {
    if (b < 1 || L < 1 || H < 1 || KV < 1 || H % KV || kmax < 0) return -1;
    const int rep = H / KV;
    const long ldw = kmax > 0 ? kmax : 1; /* scores: one row of ldw per query head of a key/value head */
    float *scores = malloc(sizeof(float) * (size_t)(ldw * rep));
    long *rows = malloc(sizeof(long) * (size_t)ldw);
    if (!scores || !rows) {
        free(scores);
        free(rows);
        return -1;
    }
    const long kvd = (long)KV * d;
    for (int i = 0; i < b; i++) {
        for (int j = 0; j < L; j++) {
            const long qi = (long)i * L + j;
            float *o = out + qi * H * d;
            const long p = qpos[qi];
            int m = 0; /* the visible keys, as row offsets into the pools */
            if (!qvalid || qvalid[qi]) {
                for (int k = 0; k < kmax; k++) {
                    const long kp = kpos[(long)i * kmax + k];
                    if (kp <= p && (window <= 0 || kp > p - window)) rows[m++] = slots[(long)i * kmax + k] * kvd;
                }
            }
            if (m == 0) {
                memset(o, 0, sizeof(float) * (size_t)H * d);
                continue;
            }
#if defined(__AVX512F__)
            if (d % 16 == 0 && d <= 256) {
                for (int g = 0; g < KV; g++)
                    attend_group16(m, d, rep, q + qi * H * d + (long)g * rep * d, kstore + (long)g * d,
                                   vstore + (long)g * d, rows, scale, scores, ldw, o + (long)g * rep * d);
                continue;
            }
#endif
            for (int h = 0; h < H; h++) {
                const long g = (long)(h / rep) * d;
                attend_head(m, d, q + qi * H * d + (long)h * d, kstore + g, vstore + g, 0, rows, scale, scores,
                            o + (long)h * d);
            }
        }
    }
    free(scores);
    free(rows);
    return 0;
}

/* ---- every layer of a decode step or a verify of a full-attention model (smallgemm.py `full_layers`) -------
 *
 * The layers of `specctl_lone_chains` (rms norms, fused q/k/v with its bias, rope, o, fused gate/up, silu,
 * down, residual adds) over the b x L rows of x [b * L, hidden], which it updates in place, with the paged
 * pools of the cache: row j writes its key and value at slot dst[j] of each layer's pools (dst[j] < 0: a
 * padding row, which writes nothing), then its queries attend as `specctl_paged_attention` (item i's keys at
 * slots[i, :kmax], positions kpos; queries at qpos [b, L]; qvalid as there). cos_rows / sin_rows [b * L, d]
 * are the rope tables' rows at each row's position. Why: a decode step of a small model spent a quarter of
 * its time in the ~15 torch and ctypes calls per layer around these kernels (a random Llama's batch-32 step:
 * 1.4 of 6.1 ms). Each row's arithmetic is the same whatever b and L are. Returns 0, or -1 if scratch fails
 * or the shapes do not fit. */
int specctl_full_layers(int n_layers, const lone_layer *layers, int hidden, int hq, int hkv, int d, int inter,
                        float eps, int b, int L, float *x, const float *cos_rows, const float *sin_rows,
                        const long *dst, int kmax, const long *slots, const long *kpos, const long *qpos,
                        const unsigned char *qvalid) {
    if (d > 1024 || hq % hkv || b < 1 || L < 1 || kmax < 1) return -1;
    const int nq = hq * d, nk = hkv * d, nqkv = nq + 2 * nk;
    const long R = (long)b * L;
    float *buf = malloc(sizeof(float) * (size_t)(R * (2L * hidden + nqkv + 2L * nq + 3L * inter)));
    if (!buf) return -1;
    float *h = buf, *t = h + R * hidden, *qkv = t + R * hidden, *q = qkv + R * nqkv, *o = q + R * nq;
    float *gu = o + R * nq, *act = gu + R * 2 * inter;
    const float scale = 1.0f / sqrtf((float)d);
    int rc = 0;
    for (int l = 0; l < n_layers && rc == 0; l++) {
        const lone_layer *ly = layers + l;
        for (long j = 0; j < R; j++) rmsnorm(hidden, x + j * hidden, ly->norm1, eps, h + j * hidden);
        specctl_sgemm((int)R, nqkv, hidden, h, hidden, ly->wqkv, ly->bqkv, qkv);
        for (long j = 0; j < R; j++) { /* every row's key and value are cached before any query reads */
            float *row = qkv + j * nqkv;
            rope(hq + hkv, d, row, cos_rows + j * d, sin_rows + j * d); /* q and k side by side */
            memcpy(q + j * nq, row, sizeof(float) * (size_t)nq);
            if (dst[j] >= 0) {
                memcpy(ly->kpool + dst[j] * nk, row + nq, sizeof(float) * (size_t)nk);
                memcpy(ly->vpool + dst[j] * nk, row + nq + nk, sizeof(float) * (size_t)nk);
            }
        }
        rc = specctl_paged_attention(b, L, hq, hkv, d, kmax, q, ly->kpool, ly->vpool, slots, kpos, qpos, qvalid, 0,
                                     scale, o);
        specctl_sgemm((int)R, hidden, nq, o, nq, ly->wo, NULL, t);
        for (long e = 0; e < R * hidden; e++) x[e] += t[e];
        for (long j = 0; j < R; j++) rmsnorm(hidden, x + j * hidden, ly->norm2, eps, h + j * hidden);
        specctl_sgemm((int)R, 2 * inter, hidden, h, hidden, ly->wgu, NULL, gu);
        for (long j = 0; j < R; j++) silu_mul(inter, gu + j * 2 * inter, gu + j * 2 * inter + inter, act + j * inter);
        specctl_sgemm((int)R, hidden, inter, act, inter, ly->wd, NULL, t);
        for (long e = 0; e < R * hidden; e++) x[e] += t[e];
    }
    free(buf);
    return rc;
}

/* ---- speculative (rejection) sampling of temperature-only rows (verify.py `rejection_accept_logits`) ------
 *
 * Request r drafted nd[r] <= k1 - 1 tokens drafts[r * (k1 - 1) + j], each drawn from q_j = q + (r * (k1 - 1)
 * + j) * vocab (NULL: a deterministic drafter, q a point mass on the draft); the target scored k1 positions,
 * logits [b, k1, vocab], sampled at temps[r] > 0, p_j = softmax(logits[r, j] / temps[r]). With request r's
 * nd[r] + 1 uniforms unif[r * k1 ..] (from its own generator, in draw order): accept d_j while u_j <
 * min(1, p_j(d_j) / q_j(d_j)); at the first rejection a draw from normalize(max(0, p_a - q_a)) (p_a itself if
 * rounding left that empty), after all nd[r] a draw from p_nd, both with the last uniform u_nd. Writes
 * accepted[r] and the drawn token tokens[r]. Only the positions read are normalised: a rejection at j
 * costs j + 1 softmaxes. scratch: 2 * vocab floats. Returns 0. */
int specctl_rejection(int b, int k1, int vocab, const float *logits, const float *temps, const long *drafts,
                      const int *nd, const float *q, const float *unif, float *scratch, int *accepted,
                      long *tokens) {
    float *p = scratch, *res = scratch + vocab;
    const int k = k1 - 1;
    for (int r = 0; r < b; r++) {
        const int n = nd[r];
        const float *u = unif + (long)r * k1;
        const float *lr = logits + (long)r * k1 * vocab;
        int a = 0;
        for (; a < n; a++) {
            const long d = drafts[(long)r * k + a];
            softmax_t(vocab, lr + (long)a * vocab, temps[r], p);
            float ratio = p[d];
            if (q) {
                const float qd = q[((long)r * k + a) * vocab + d];
                ratio = ratio / (qd > 1e-30f ? qd : 1e-30f);
            }
            if (ratio > 1.0f) ratio = 1.0f;
            if (!(u[a] < ratio)) break;
        }
        accepted[r] = a;
        if (a < n) { /* p = p_a, computed by the test that rejected */
            const long d = drafts[(long)r * k + a];
            double total = 0.0;
            for (int v = 0; v < vocab; v++) {
                const float qv = q ? q[((long)r * k + a) * vocab + v] : (v == d ? 1.0f : 0.0f);
                const float e = p[v] - qv;
                res[v] = e > 0.0f ? e : 0.0f;
                total += res[v];
            }
            if ((float)total > 0.0f) {
                const float t = (float)total;
                for (int v = 0; v < vocab; v++) res[v] = res[v] / t;
                tokens[r] = pick(vocab, res, u[n]);
            } else {
                tokens[r] = pick(vocab, p, u[n]);
            }
        } else {
            softmax_t(vocab, lr + (long)n * vocab, temps[r], p);
            tokens[r] = pick(vocab, p, u[n]);
        }
    }
    return 0;
}

/* One token per row of logits [rows, vocab] into out: at temps[r] > 0 drawn from softmax(logits[r] /
 * temps[r]) with the uniform unif[r] (`draw`), else the argmax (`specctl_argmax`). The plain decode step's
 * sampling of temperature-only rows (sampling.py `sample`). scratch: vocab floats. Returns 0, or 1 when a
 * greedy row holds a NaN (specctl_argmax's case: the caller asks torch). */
int specctl_sample(int rows, int vocab, const float *logits, const float *temps, const float *unif, float *scratch,
                   long *out) {
    for (int r = 0; r < rows; r++) {
        const float *lr = logits + (long)r * vocab;
        if (temps[r] > 0.0f) {
            out[r] = draw(vocab, lr, temps[r], unif[r], scratch);
        } else if (specctl_argmax(1, vocab, lr, out + r) != 0) {
            return 1;
        }
    }
    return 0;
}
