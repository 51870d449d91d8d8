// plexus's own packed GEMM for AVX-512F + FMA (tensor/gemm.c, px_sgemm,
// says when it is taken), with an output pass that can add a bias and apply
// tanh while the results are still in registers (px_gemm_epi).
//
// Why: on the MLP at batch 1024, OpenBLAS's sgemm was 81% of a training
// step, of which its packing copies were 11 points, and the bias copy before
// each forward GEMM and the separate passes over its output (tanh forward,
// tanh backward) read and wrote 2-4 MB tensors that no longer fit the L2
// (docs/PERFORMANCE.md, "Figures behind code comments").
//
// The method is the usual one (Goto; BLIS): C (M × N) is computed in blocks
// of KC along k.  For each block, op(B)'s KC × NS slices (NS columns, so
// that a packed slice stays in the L2) are packed into panels of NR = 32
// columns, k-major (one k's 32 values side by side), and op(A)'s rows, MC
// at a time, into panels of MR = 12 rows, k-major too.  The micro-kernel
// keeps a 12 × 32 block of C in 24 vector registers; per k it loads one B
// panel row (two vectors), broadcasts the A panel's 12 values and does 24
// FMAs.  The operands' transposes are all taken by the packing (16 × 16
// transposes in registers), so one kernel serves every transpose flag.
//
// Every element's sum has one order, fixed by K alone: within a block of KC
// the k run in turn from 0 in one FMA chain; the first block's sum goes to
// C as beta·C + alpha·Σ (C not read when beta is 0), each later block's as
// C + alpha·Σ.  Neither M, N, the element's place in its panel, the
// threads (each computes its own rectangle of C) nor their count change a
// bit.
#include "tensor/internal.h"

#if (defined(PX_GEMM_ROWS_AVX512) || defined(PX_NATIVE_BUILD)) && defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi"

typedef float vf __attribute__((vector_size(64)));

#define MR 12
#define NR 32
#define KC 256
// Rows of A packed at a time (at most; 8 panels).
#define MC 96
// Columns of B packed at a time (256 k × 1024 columns: 1 MiB, in the L2).
#define NS 1024
// Rows ahead that the k-major packing loops fetch.
#define PREFETCH_ROWS 8

// n floats on a 64-byte boundary (aligned_alloc wants a size that is a
// multiple of the alignment); free() releases them.
static float *floats64(size_t n) { return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64); }

static inline vf splat(float s) { return (vf){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }
static inline __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

// r[0..15] transposed in place.  Stage b swaps bit b of the row index with
// bit b of the column index; the four stages together swap them all.
static inline void transpose16(vf r[16]) {
  vf t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  }
  for (int i = 0; i < 16; i += 4)
    for (int h = 0; h < 2; h++) {
      r[i + h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28,
                                         29);
      r[i + h + 2] = __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15,
                                             30, 31);
    }
  for (int i = 0; i < 16; i += 8)
    for (int h = 0; h < 4; h++) {
      t[i + h] = __builtin_shufflevector(r[i + h], r[i + h + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26,
                                         27);
      t[i + h + 4] = __builtin_shufflevector(r[i + h], r[i + h + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29,
                                             30, 31);
    }
  for (int h = 0; h < 8; h++) {
    r[h] = __builtin_shufflevector(t[h], t[h + 8], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    r[h + 8] = __builtin_shufflevector(t[h], t[h + 8], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
}

// Packs n (≤ 16) rows of a row-major matrix, each read at row[i] + k for k
// in [0, kc), k-major into out: out[k·stride + i] for i < width (rows past n
// are zeros).  width ≤ 16 lanes are written per k.
static void pack_rows_kmajor(const float *const *row, int n, int kc, float *out, int stride, int width) {
  const __mmask16 w = lanes(width);
  int k = 0;
  for (; k + 16 <= kc; k += 16) {
    vf r[16];
    for (int i = 0; i < 16; i++) r[i] = i < n ? (vf)_mm512_loadu_ps(row[i] + k) : splat(0.0f);
    transpose16(r);
    for (int t = 0; t < 16; t++) _mm512_mask_storeu_ps(out + (size_t)(k + t) * stride, w, (__m512)r[t]);
  }
  for (; k < kc; k++)
    for (int i = 0; i < width; i++) out[(size_t)k * stride + i] = i < n ? row[i][k] : 0.0f;
}

// op(A)'s rows i0 .. i0 + mc, k0 .. k0 + kc, as panels of MR rows.
static void pack_a(bool ta, const float *A, int lda, int i0, int mc, int k0, int kc, float *Ap) {
  if (ta) {  // A stored k-major: row k's mc floats go to every panel's row k (one pass over each stored row)
    for (int k = 0; k < kc; k++) {
      const float *a = A + (size_t)(k0 + k) * lda + i0;
      if (k + PREFETCH_ROWS < kc)  // rows far apart: the hardware's prefetch does not follow
        for (int p = 0; p < mc; p += 16) _mm_prefetch((const char *)(a + (size_t)PREFETCH_ROWS * lda + p), _MM_HINT_T0);
      for (int p = 0; p < mc; p += MR)
        _mm512_mask_storeu_ps(Ap + (size_t)p * kc + (size_t)k * MR, lanes(MR),
                              _mm512_maskz_loadu_ps(lanes(mc - p < MR ? mc - p : MR), a + p));
    }
    return;
  }
  for (int p = 0; p < mc; p += MR, Ap += (size_t)MR * kc) {
    const int n = mc - p < MR ? mc - p : MR;
    const float *row[16];
    for (int i = 0; i < n; i++) row[i] = A + (size_t)(i0 + p + i) * lda + k0;
    pack_rows_kmajor(row, n, kc, Ap, MR, MR);
  }
}

// op(B)'s columns j0 .. j0 + NR (those below N), k0 .. k0 + kc, as one panel.
static void pack_b(bool tb, const float *B, int ldb, int j0, int N, int k0, int kc, float *Bp) {
  const int n = N - j0 < NR ? N - j0 : NR;
  if (!tb) {  // B stored k-major: a panel row is n consecutive floats
    const __mmask16 m0 = lanes(n), m1 = lanes(n - 16);
    for (int k = 0; k < kc; k++) {
      const float *b = B + (size_t)(k0 + k) * ldb + j0;
      if (k + PREFETCH_ROWS < kc) {
        _mm_prefetch((const char *)(b + (size_t)PREFETCH_ROWS * ldb), _MM_HINT_T0);
        _mm_prefetch((const char *)(b + (size_t)PREFETCH_ROWS * ldb + 16), _MM_HINT_T0);
      }
      _mm512_storeu_ps(Bp + (size_t)k * NR, _mm512_maskz_loadu_ps(m0, b));
      _mm512_storeu_ps(Bp + (size_t)k * NR + 16, _mm512_maskz_loadu_ps(m1, b + 16));
    }
    return;
  }
  for (int h = 0; h < NR; h += 16) {
    const float *row[16];
    const int nh = n - h < 0 ? 0 : n - h > 16 ? 16 : n - h;
    for (int i = 0; i < nh; i++) row[i] = B + (size_t)(j0 + h + i) * ldb + k0;
    pack_rows_kmajor(row, nh, kc, Bp + h, NR, 16);
  }
}

// One MR × NR block of C from an A panel and a B panel, kc long; rows < n
// and columns < ncols are stored.  The first block of k starts from
// bias[j] (bias given) or beta·C (C not read when beta is 0).
__attribute__((optimize("fp-contract=fast"))) static void kernel(int kc, const float *restrict ap,
                                                                 const float *restrict bp, float *C, int ldc, int n,
                                                                 int ncols, float alpha, float beta, bool first,
                                                                 const float *bias) {
  vf acc[MR][2];
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = splat(0.0f);
  if (!(first && (bias || beta == 0.0f)))  // C is read at the end: fetch it while the sums run
    for (int r = 0; r < n; r++) {
      _mm_prefetch((const char *)(C + (size_t)r * ldc), _MM_HINT_T0);
      _mm_prefetch((const char *)(C + (size_t)r * ldc + 16), _MM_HINT_T0);
    }
#pragma GCC unroll 4
  for (int k = 0; k < kc; k++) {
    const vf b0 = (vf)_mm512_load_ps(bp), b1 = (vf)_mm512_load_ps(bp + 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
      const vf a = splat(ap[r]);
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
    ap += MR;
    bp += NR;
  }
  const __mmask16 m0 = lanes(ncols), m1 = lanes(ncols - 16);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  __m512 b0 = _mm512_setzero_ps(), b1 = b0;
  if (first && bias) {
    b0 = _mm512_maskz_loadu_ps(m0, bias);
    b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
  }
  for (int r = 0; r < n; r++) {
    float *c = C + (size_t)r * ldc;
    __m512 c0, c1;
    if (first && bias) {
      c0 = b0;
      c1 = b1;
    } else if (first && beta == 0.0f) {
      c0 = c1 = _mm512_setzero_ps();
    } else {
      c0 = _mm512_maskz_loadu_ps(m0, c);
      c1 = _mm512_maskz_loadu_ps(m1, c + 16);
      if (first && beta != 1.0f) {
        c0 = _mm512_mul_ps(vb, c0);
        c1 = _mm512_mul_ps(vb, c1);
      }
    }
    c0 = _mm512_fmadd_ps(va, (__m512)acc[r][0], c0);
    c1 = _mm512_fmadd_ps(va, (__m512)acc[r][1], c1);
    _mm512_mask_storeu_ps(c, m0, c0);
    _mm512_mask_storeu_ps(c + 16, m1, c1);
  }
}

// The activation of the output pass over a block of C just stored (still
// in L1): the same expressions as nn/activation.c's separate pass, in this
// file's ISO C rounding (no contraction), so the bits are the same.
static void activate(float *C, int ldc, int n, int ncols, const px_gemm_epi *e, const float *S, int lds) {
  for (int r = 0; r < n; r++) {
    float *restrict c = C + (size_t)r * ldc;
    if (e->act == PX_GEMM_TANH) {
#pragma omp simd
      for (int j = 0; j < ncols; j++) c[j] = px_tanhf(c[j]);
    } else {
      const float *restrict s = S + (size_t)r * lds;
#pragma omp simd
      for (int j = 0; j < ncols; j++) c[j] = c[j] * (1.0f - s[j] * s[j]);
    }
  }
}

// One thread's rectangle of C: rows [r0, r1) and columns [c0, c1) (c0 a
// multiple of NR), with its own packed A and B.
static void rectangle(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc, const px_gemm_epi *e, int r0, int r1, int c0, int c1,
                      int mc_even, float *Ap, float *Bp) {
  const float *bias = e ? e->bias : NULL;
  const bool act = e && e->act != PX_GEMM_NONE;
  for (int n0 = c0; n0 < c1; n0 += NS) {  // slices of NS columns: their packed B stays in the L2
    const int ns = c1 - n0 < NS ? c1 - n0 : NS, npanels = (ns + NR - 1) / NR;
    for (int k0 = 0; k0 < K; k0 += KC) {
      const int kc = K - k0 < KC ? K - k0 : KC;
      const bool first = k0 == 0, last = k0 + kc == K;
      for (int q = 0; q < npanels; q++) pack_b(tb, B, ldb, n0 + q * NR, N, k0, kc, Bp + (size_t)q * NR * kc);
      for (int i0 = r0; i0 < r1; i0 += mc_even) {
        const int mc = r1 - i0 < mc_even ? r1 - i0 : mc_even;
        pack_a(ta, A, lda, i0, mc, k0, kc, Ap);
        // Per A panel (in L1) every B panel of the slice (in L2).
        for (int p = 0; p < mc; p += MR)
          for (int j0 = n0; j0 < n0 + ns; j0 += NR) {
            const int n = mc - p < MR ? mc - p : MR, ncols = N - j0 < NR ? N - j0 : NR;
            float *c = C + (size_t)(i0 + p) * ldc + j0;
            kernel(kc, Ap + (size_t)p * kc, Bp + (size_t)(j0 - n0) * kc, c, ldc, n, ncols, alpha, beta, first,
                   bias ? bias + j0 : NULL);
            if (act && last)
              activate(c, ldc, n, ncols, e, e->act == PX_GEMM_DTANH ? e->S + (size_t)(i0 + p) * e->lds + j0 : NULL,
                       e->lds);
          }
      }
    }
  }
}

bool px_sgemm_packed_avx512(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                            int ldb, float beta, float *C, int ldc, const px_gemm_epi *e) {
  const int npanels = (N + NR - 1) / NR, kc_max = K < KC ? K : KC;
  // The threads split the columns (whole panels) where there are two panels a
  // thread or more, else the rows: each packs what its own rectangle reads,
  // and no thread waits for another.  Which thread computes an element
  // changes none of its bits.
  const int T = !omp_in_parallel() && (size_t)M * N * K >= PX_SGEMM_PACKED_MIN_MNK ? omp_get_max_threads() : 1;
  const bool split_cols = npanels >= 2 * T;
  const int rows_each = split_cols ? M : ((M + T - 1) / T + MR - 1) / MR * MR;
  const int mblocks = (rows_each + MC - 1) / MC, mc_even = ((rows_each + mblocks - 1) / mblocks + MR - 1) / MR * MR;
  bool ok = true;
#pragma omp parallel num_threads(T) if (T > 1) shared(ok)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int r0 = 0, r1 = M, c0 = 0, c1 = N;
    if (split_cols) {
      c0 = (int)((long)npanels * t / nt) * NR;
      c1 = (int)((long)npanels * (t + 1) / nt) * NR;
      if (c1 > N) c1 = N;
    } else {
      r0 = t * rows_each < M ? t * rows_each : M;
      r1 = r0 + rows_each < M ? r0 + rows_each : M;
    }
    if (r0 < r1 && c0 < c1) {
      const int cols = c1 - c0 < NS ? c1 - c0 : NS;
      float *Ap = floats64((size_t)mc_even * kc_max);
      float *Bp = floats64((size_t)kc_max * ((cols + NR - 1) / NR) * NR);
      if (Ap && Bp) rectangle(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, e, r0, r1, c0, c1, mc_even, Ap, Bp);
      else {
#pragma omp atomic write
        ok = false;
      }
      free(Ap);
      free(Bp);
    }
  }
  return ok;
}
#else
typedef int px_gemm_packed_avx512_not_built;
#endif
