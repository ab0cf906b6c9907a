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
 * Built by engine/smallgemm.py with the system C compiler and -march=native; without AVX-512 the plain
 * loops below are what the compiler vectorises (the same k order). */
#include <stddef.h>

#define PANEL 64 /* columns per panel; smallgemm.py's PANEL */

#if defined(__AVX512F__)
#include <immintrin.h>

#define NB (PANEL / 16) /* vectors of 16 floats per panel */
#define MR 8 /* rows per block: 8 x 4 accumulators (some spill; still the fastest of 4-12 rows x 2-4 vectors) */

static inline __attribute__((always_inline)) void block(int mr, int K, int N, const float *x, long ldx,
                                                         const float *wp, const float *bias, float *y,
                                                         long ldy, int n0, int nv, __mmask16 tail) {
    (void)N;
    __m512 acc[MR][NB];
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

static void rows(int mr, int K, int N, const float *x, long ldx, const float *wp, const float *bias, float *y,
                 long ldy) {
    for (int n0 = 0; n0 < N; n0 += PANEL) {
        int rem = N - n0;
        int nv = rem >= 16 * NB ? NB : (rem + 15) / 16;
        int last = rem - 16 * (nv - 1);
        __mmask16 tail = last >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << last) - 1);
        /* constant row and vector counts let the compiler keep the accumulators in registers */
#define BLOCKS(NV)                                                                   \
    switch (mr) {                                                                    \
        case 8: block(8, K, N, x, ldx, wp, bias, y, ldy, n0, NV, tail); break;       \
        case 7: block(7, K, N, x, ldx, wp, bias, y, ldy, n0, NV, tail); break;       \
        case 6: block(6, K, N, x, ldx, wp, bias, y, ldy, n0, NV, tail); break;       \
        case 5: block(5, K, N, x, ldx, wp, bias, y, ldy, n0, NV, tail); break;       \
        case 4: block(4, K, N, x, ldx, wp, bias, y, ldy, n0, NV, tail); break;       \
        case 3: block(3, K, N, x, ldx, wp, bias, y, ldy, n0, NV, tail); break;       \
        case 2: block(2, K, N, x, ldx, wp, bias, y, ldy, n0, NV, tail); break;       \
        default: block(1, K, N, x, ldx, wp, bias, y, ldy, n0, NV, tail); break;      \
    }
        if (nv == NB) {
            BLOCKS(NB)
        } else {
            BLOCKS(nv)
        }
#undef BLOCKS
    }
}
#define ISA 512
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

/* Which path this build took: 512 (AVX-512 intrinsics) or 0 (compiler-vectorised loops). */
int specctl_sgemm_isa(void) { return ISA; }

/* y [M, N] = x [M, K] (row stride ldx) times the packed weight wp, plus bias [N] when not NULL. */
int specctl_sgemm_panel(void) { return PANEL; }

void specctl_sgemm(int M, int N, int K, const float *x, long ldx, const float *wp, const float *bias, float *y) {
    for (int m0 = 0; m0 < M; m0 += MR) {
        int mr = M - m0 < MR ? M - m0 : MR;
        rows(mr, K, N, x + (long)m0 * ldx, ldx, wp, bias, y + (long)m0 * N, N);
    }
}

/* ---- a draft model's greedy chain at batch 1, in one call (engine/smallgemm.py `LoneChain`) ----------
 *
 * A full-attention Llama-family model (the builtin drafter) decoding one request token by token: per
 * token, per layer, RMSNorm -> fused q/k/v (+ bias) -> rotate-half rope (cos and sign-folded sin tables)
 * -> write k, v at the request's slot -> grouped-query attention over its positions 0..p -> o_proj and
 * residual -> RMSNorm -> fused gate/up -> silu(gate) * up -> down and residual; then the final RMSNorm and
 * the lm_head, and the argmax (the lowest id among equal maxima, as torch's argmax). The same function as
 * HybridForCausalLM.forward_lone at one token (to float32 rounding): what it saves is the ~35 dispatched
 * ops per draft token, most of a tiny model's step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const float *norm1, *wqkv, *bqkv, *wo, *norm2, *wgu, *wd; /* w*: packed panels (specctl_sgemm) */
    float *kpool, *vpool;                                       /* [slots, hkv, d] */
} lone_layer;

static void rmsnorm(int n, const float *x, const float *w, float eps, float *out) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

static void rope(int heads, int d, float *x, const float *cos_p, const float *sin_p) {
    const int half = d / 2;
    float tmp[1024];
    for (int h = 0; h < heads; h++) {
        float *v = x + h * d;
        for (int i = 0; i < d; i++) tmp[i] = v[i] * cos_p[i] + v[(i + half) % d] * sin_p[i];
        memcpy(v, tmp, (size_t)d * sizeof(float));
    }
}

/* Feed `n_feed` tokens at positions start.. (slot base + position), then choose `steps` tokens by argmax,
 * feeding each but the last. Writes them to out, and each chosen position's logits to logits_out [steps,
 * vocab] unless it is NULL (a sampling caller takes steps = 1 and draws the next token itself). Returns 0,
 * or -1 if the scratch allocation fails or a head is wider than 1024. */
int specctl_lone_chain(int n_layers, const lone_layer *layers, int hidden, int hq, int hkv, int d, int inter,
                       int vocab, float eps, const float *embed, const float *final_norm, const float *lm_head,
                       const float *cos_t, const float *sin_t, long base, int start, const long *feed,
                       int n_feed, int steps, long *out, float *logits_out) {
    if (d > 1024 || hq % hkv) return -1;
    const int nq = hq * d, nk = hkv * d, nqkv = nq + 2 * nk;
    const int maxlen = start + n_feed + steps;
    float *buf = malloc(sizeof(float) * (size_t)(4 * hidden + nqkv + nq + 3 * inter + vocab + maxlen));
    if (!buf) return -1;
    float *x = buf, *h = x + hidden, *t = h + hidden, *xn = t + hidden, *qkv = xn + hidden, *o = qkv + nqkv;
    float *gu = o + nq, *act = gu + 2 * inter, *logits = act + inter, *scores = logits + vocab;
    const float scale = 1.0f / sqrtf((float)d);
    const int rep = hq / hkv;
    long tok = feed[0];
    int chosen = 0;
    for (int i = 0; chosen < steps; i++) {
        const int p = start + i;
        tok = i < n_feed ? feed[i] : out[chosen - 1];
        memcpy(x, embed + tok * (long)hidden, sizeof(float) * (size_t)hidden);
        for (int l = 0; l < n_layers; l++) {
            const lone_layer *L = layers + l;
            rmsnorm(hidden, x, L->norm1, eps, h);
            specctl_sgemm(1, nqkv, hidden, h, hidden, L->wqkv, L->bqkv, qkv);
            rope(hq + hkv, d, qkv, cos_t + (long)p * d, sin_t + (long)p * d); /* q and k sit side by side */
            float *kslot = L->kpool + (base + p) * nk, *vslot = L->vpool + (base + p) * nk;
            memcpy(kslot, qkv + nq, sizeof(float) * (size_t)nk);
            memcpy(vslot, qkv + nq + nk, sizeof(float) * (size_t)nk);
            for (int hh = 0; hh < hq; hh++) {
                const int g = hh / rep;
                const float *q = qkv + hh * d;
                float mx = -INFINITY;
                for (int s = 0; s <= p; s++) {
                    const float *k = L->kpool + (base + s) * nk + g * d;
                    float dot = 0.0f;
                    for (int e = 0; e < d; e++) dot += q[e] * k[e];
                    scores[s] = dot * scale;
                    if (scores[s] > mx) mx = scores[s];
                }
                float sum = 0.0f;
                for (int s = 0; s <= p; s++) {
                    scores[s] = expf(scores[s] - mx);
                    sum += scores[s];
                }
                float *oh = o + hh * d;
                for (int e = 0; e < d; e++) oh[e] = 0.0f;
                for (int s = 0; s <= p; s++) {
                    const float w = scores[s] / sum;
                    const float *v = L->vpool + (base + s) * nk + g * d;
                    for (int e = 0; e < d; e++) oh[e] += w * v[e];
                }
            }
            specctl_sgemm(1, hidden, nq, o, nq, L->wo, NULL, t);
            for (int e = 0; e < hidden; e++) x[e] += t[e];
            rmsnorm(hidden, x, L->norm2, eps, h);
            specctl_sgemm(1, 2 * inter, hidden, h, hidden, L->wgu, NULL, gu);
            for (int e = 0; e < inter; e++) {
                const float g = gu[e];
                act[e] = g / (1.0f + expf(-g)) * gu[inter + e];
            }
            specctl_sgemm(1, hidden, inter, act, inter, L->wd, NULL, t);
            for (int e = 0; e < hidden; e++) x[e] += t[e];
        }
        if (i + 1 < n_feed) continue; /* logits only after the last fed token and after each chosen one */
        rmsnorm(hidden, x, final_norm, eps, xn);
        specctl_sgemm(1, vocab, hidden, xn, hidden, lm_head, NULL, logits);
        if (logits_out) memcpy(logits_out + (long)chosen * vocab, logits, sizeof(float) * (size_t)vocab);
        int best = 0;
        for (int v = 1; v < vocab; v++)
            if (logits[v] > logits[best]) best = v;
        out[chosen++] = best;
    }
    free(buf);
    return 0;
}
