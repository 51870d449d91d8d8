// GEMMs with few rows (a small batch through a linear layer) without
// OpenBLAS's packing, for AVX-512F + FMA (tensor/gemm.c, px_sgemm_rows,
// says when they are taken).
//
// Why: with 16 rows, a linear layer's forward (y = x·Wᵀ) and input gradient
// (dx = dy·W) are GEMMs whose big operand is the weight matrix W.  OpenBLAS
// packs W on every call, a copy as long as the product itself: on the
// MLP's 256 × 512 layers at batch 16 the packing was a quarter of the
// training step (perf: sgemm_incopy + sgemm_itcopy).  These kernels read W
// in place, once per block of rows, and keep the block's sums in registers
// (docs/PERFORMANCE.md, "Figures behind code comments").
//
//   nn_rows:  C (R × N)  = A (R × K) · B (K × N)      dx = dy · W
//             blocks of 8 rows × 3 vectors of 16 columns (24 accumulators);
//             per k one B row's 3 vectors times 8 broadcast A elements.
//   nt_rows:  C (R × N)  = A (R × K) · B (N × K)ᵀ     y = x · Wᵀ
//             blocks of 4 rows × 4 columns (16 accumulators, each a vector
//             of 16 partial sums along k); per 16 k the 4 A rows' and 4 B
//             rows' vectors, 16 FMAs; then one transposing sum folds the
//             16 vectors into the block's 16 results.
//
// Every element's sum has one order, fixed by K alone: element (r, n) of
// nn_rows sums k = 0, 1, ... in turn; of nt_rows, lane l sums k ≡ l
// (mod 16) in turn, then the lanes fold l + 8, l + 4, l + 2, l + 1, the
// same for every element.  Neither the row count R, nor the element's
// place in its block, nor the threads (which split the columns) change a
// bit.  Rows past R in a block read the block's first row and are not
// written.
// With beta = 1 the sum is added to C's element last (C + Σ), as
// px_sgemm's bias-first forward expects.
#include "tensor/internal.h"

#if (defined(PX_GEMM_ROWS_AVX512) || defined(PX_NATIVE_BUILD)) && defined(__AVX512F__) && defined(__FMA__)
#include <omp.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi"

typedef float vf __attribute__((vector_size(64)));

static inline vf ld(const float *p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void st(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf splat(float s) { return (vf){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }
// Keeps a loaded vector in a register (else gcc folds the load into every FMA).
#define PIN(v) __asm__("" : "+v"(v))

#define NN_ROWS 8
#define NN_VECS 3
#define NT_ROWS 4
#define NT_COLS 4

// One block of NN_ROWS rows (a[r]: row r, K long) and nv vectors of
// columns from j; rows < rows are stored.
static inline __attribute__((always_inline)) void nn_block(const float *const *a, int K, const float *B, int ldb, int j,
                                                           float beta, float *C, int ldc, int rows, const int nv) {
  vf acc[NN_ROWS][NN_VECS];
  for (int r = 0; r < NN_ROWS; r++)
    for (int v = 0; v < nv; v++) acc[r][v] = splat(0.0f);
  for (int k = 0; k < K; k++) {
    vf b[NN_VECS];
    for (int v = 0; v < nv; v++) {
      b[v] = ld(B + (size_t)k * ldb + j + 16 * v);
      PIN(b[v]);
    }
    for (int r = 0; r < NN_ROWS; r++) {
      const vf s = splat(a[r][k]);
      for (int v = 0; v < nv; v++) acc[r][v] += s * b[v];
    }
  }
  for (int r = 0; r < rows; r++)
    for (int v = 0; v < nv; v++) {
      float *c = C + (size_t)r * ldc + j + 16 * v;
      st(c, beta != 0.0f ? ld(c) + acc[r][v] : acc[r][v]);
    }
}

__attribute__((optimize("fp-contract=fast"))) static void nn_rows(const float *const *a, int K, const float *B, int ldb,
                                                                  float beta, float *C, int ldc, int rows, int j0,
                                                                  int j1) {
  int j = j0;
  for (; j + 16 * NN_VECS <= j1; j += 16 * NN_VECS) nn_block(a, K, B, ldb, j, beta, C, ldc, rows, 3);
  for (; j < j1; j += 16) nn_block(a, K, B, ldb, j, beta, C, ldc, rows, 1);
}

// v[i] = the sum of a[i]'s lanes, for the 16 vectors a[0..15]: halves
// folded onto halves, two vectors at a time, so one vector of results
// comes out of 15 adds and 30 shuffles.
static inline vf fold16(const vf *a) {
  vf b[8], c[4], d[2];
  for (int i = 0; i < 8; i++) {
    const vf x = a[2 * i], y = a[2 * i + 1];
    b[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
      __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 4; i++) {
    const vf x = b[2 * i], y = b[2 * i + 1];
    c[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
      __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
  for (int i = 0; i < 2; i++) {
    const vf x = c[2 * i], y = c[2 * i + 1];
    d[i] = __builtin_shufflevector(x, y, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
      __builtin_shufflevector(x, y, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  }
  return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
    __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// Rows a[0 .. NT_ROWS) (K long) against B's rows n0 .. n1 (NT_COLS at a
// time); rows < rows are stored.
__attribute__((optimize("fp-contract=fast"))) static void nt_rows(const float *const *a, int K, const float *B, int ldb,
                                                                  float beta, float *C, int ldc, int rows, int n0,
                                                                  int n1) {
  float out[16];
  for (int n = n0; n < n1; n += NT_COLS) {
    vf acc[NT_ROWS * NT_COLS];
    for (int i = 0; i < NT_ROWS * NT_COLS; i++) acc[i] = splat(0.0f);
    for (int k = 0; k < K; k += 16) {
      vf av[NT_ROWS], bv[NT_COLS];
      for (int i = 0; i < NT_ROWS; i++) {
        av[i] = ld(a[i] + k);
        PIN(av[i]);
      }
      for (int q = 0; q < NT_COLS; q++) {
        bv[q] = ld(B + (size_t)(n + q) * ldb + k);
        PIN(bv[q]);
      }
      for (int i = 0; i < NT_ROWS; i++)
        for (int q = 0; q < NT_COLS; q++) acc[NT_COLS * i + q] += av[i] * bv[q];
    }
    st(out, fold16(acc));
    for (int i = 0; i < rows; i++)
      for (int q = 0; q < NT_COLS; q++) {
        float *c = C + (size_t)i * ldc + n + q;
        *c = beta != 0.0f ? *c + out[NT_COLS * i + q] : out[NT_COLS * i + q];
      }
  }
}

void px_sgemm_rows_avx512(bool trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                          float beta, float *C, int ldc) {
  const int RB = trans_b ? NT_ROWS : NN_ROWS;
  // Column chunks: the unit the threads share; whole blocks, so a chunk's
  // edges never change how an element is computed.
  const int unit = trans_b ? NT_COLS * 4 : 16 * NN_VECS, chunks = (N + unit - 1) / unit;
  const bool par = !omp_in_parallel() && omp_get_max_threads() > 1 && chunks > 1 &&
    (size_t)M * N * K >= ((size_t)1 << 18);
#pragma omp parallel for schedule(static) if (par)
  for (int ch = 0; ch < chunks; ch++) {
    const int j0 = ch * unit, j1 = j0 + unit < N ? j0 + unit : N;
    for (int r0 = 0; r0 < M; r0 += RB) {
      const int rows = M - r0 < RB ? M - r0 : RB;
      // Rows past M read the block's first row (valid memory) and are not stored.
      const float *a[NN_ROWS > NT_ROWS ? NN_ROWS : NT_ROWS];
      for (int r = 0; r < RB; r++) a[r] = A + (size_t)(r0 + (r < rows ? r : 0)) * lda;
      float *c = C + (size_t)r0 * ldc;
      if (trans_b) nt_rows(a, K, B, ldb, beta, c, ldc, rows, j0, j1);
      else nn_rows(a, K, B, ldb, beta, c, ldc, rows, j0, j1);
    }
  }
}
#else
typedef int px_gemm_rows_avx512_not_built;
#endif
