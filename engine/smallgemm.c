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
