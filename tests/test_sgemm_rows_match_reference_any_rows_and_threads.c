/* Claim: the few-row GEMM kernels (px_sgemm_rows, src/tensor/gemm_rows_avx512.c),
 * which a linear layer's forward (C = A·Bᵀ) and input gradient (C = A·B) take
 * at up to PX_SGEMM_ROWS_MAX rows on an AVX-512 CPU, compute the product to
 * float32 rounding (against a float64 loop, with beta 0 and 1, and leading
 * dimensions wider than the matrices, whose padding stays untouched); give
 * the same bits with 1, 2 and 3 threads; and give a row the same bits
 * whatever the number of rows around it (so a batch split over DDP ranks
 * computes each sample's row as one process does).  Row counts cover the
 * blocks' remainders (1, 3, 5, 17 rows ...), column counts the tails after
 * the blocks of 3 vectors, and the shapes they do not take (too many rows,
 * K or N off their multiple, beta other than 0 or 1) are refused with C
 * untouched.  Where the kernels are not available (no AVX-512F, or
 * PX_GEMM_ROWS=0) the test says so and checks only the refusals. */
#include "px_test.h"
#include "tensor/internal.h"

#include <string.h>

static void fill(float *x, size_t n, uint64_t seed) {
  px_rng r = px_rng_make(seed, 11);
  for (size_t i = 0; i < n; i++) x[i] = 2.0f * px_rng_uniform(&r) - 1.0f;
}

typedef struct shape {
  bool tb;
  int M, N, K;
} shape;

// C (M × N, ldc) = A (M × K, lda) · op(B) + beta·C through px_sgemm_rows
// with the given threads; false where it refused.
static bool run(const shape *s, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                int threads) {
  px_set_num_threads(threads);
  return px_sgemm_rows(s->tb, s->M, s->N, s->K, A, lda, B, ldb, beta, C, ldc);
}

int main(void) {
  const int threads0 = px_get_num_threads();
  const shape cases[] = {
    // y = x·Wᵀ: N a multiple of 4, K of 16
    {true, 16, 512, 256},
    {true, 16, 256, 512},
    {true, 1, 4, 16},
    {true, 3, 20, 48},
    {true, 5, 68, 32},
    {true, 17, 12, 64},
    {true, 33, 36, 16},
    {true, 64, 64, 64},
    // dx = dy·W: N a multiple of 16
    {false, 16, 256, 512},
    {false, 16, 512, 256},
    {false, 1, 16, 1},
    {false, 3, 48, 7},
    {false, 9, 64, 5},
    {false, 17, 80, 33},
    {false, 33, 112, 16},
    {false, 64, 96, 64},
  };
  const int n_cases = (int)(sizeof cases / sizeof cases[0]), pad = 5;
  bool available = true;
  for (int ci = 0; ci < n_cases && available; ci++) {
    const shape *s = &cases[ci];
    const int lda = s->K + pad, ldb = (s->tb ? s->K : s->N) + pad, ldc = s->N + pad;
    const int b_rows = s->tb ? s->N : s->K;
    float *A = malloc(sizeof(float) * (size_t)s->M * lda), *B = malloc(sizeof(float) * (size_t)b_rows * ldb);
    float *C0 = malloc(sizeof(float) * (size_t)s->M * ldc), *C[3];
    fill(A, (size_t)s->M * lda, 1 + (uint64_t)ci);
    fill(B, (size_t)b_rows * ldb, 100 + (uint64_t)ci);
    fill(C0, (size_t)s->M * ldc, 200 + (uint64_t)ci);
    for (int bi = 0; bi < 2 && available; bi++) {
      const float beta = (float)bi;
      for (int t = 0; t < 3; t++) {
        C[t] = malloc(sizeof(float) * (size_t)s->M * ldc);
        memcpy(C[t], C0, sizeof(float) * (size_t)s->M * ldc);
        if (!run(s, A, lda, B, ldb, beta, C[t], ldc, t + 1)) available = false;
      }
      if (!available) {
        printf("px_sgemm_rows: not available here (no AVX-512F, or PX_GEMM_ROWS=0): only the refusals are checked\n");
      } else {
        double worst = 0;
        bool pad_kept = true;
        for (int i = 0; i < s->M; i++)
          for (int j = 0; j < ldc; j++) {
            const float got = C[0][(size_t)i * ldc + j], old = C0[(size_t)i * ldc + j];
            if (j >= s->N) {
              pad_kept = pad_kept && got == old;
              continue;
            }
            double sum = 0, scale = 0;
            for (int k = 0; k < s->K; k++) {
              const double a = A[(size_t)i * lda + k], b = s->tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
              sum += a * b;
              scale += fabs(a * b);
            }
            const double want = sum + beta * old, e = fabs(got - want) / (scale + fabs(old) + 1e-30);
            if (e > worst) worst = e;
          }
        CHECK(worst < 1e-6, "case %d (%s, M=%d N=%d K=%d, beta %g): worst error %g of the terms' scale", ci,
              s->tb ? "A·Bt" : "A·B", s->M, s->N, s->K, beta, worst);
        CHECK(pad_kept, "case %d beta %g: the columns past N changed", ci, beta);
        for (int t = 1; t < 3; t++)
          CHECK(memcmp(C[0], C[t], sizeof(float) * (size_t)s->M * ldc) == 0,
                "case %d beta %g: same bits, 1 and %d threads", ci, beta, t + 1);
        // Rows r0 .. r0 + m alone (their own call, other row count, other
        // place in the blocks) give the bits they had among all M rows.
        for (int r0 = 0; r0 < s->M; r0 += 3) {
          const int m = s->M - r0 < 2 ? s->M - r0 : 2;
          const shape sub = {s->tb, m, s->N, s->K};
          float *Cs = malloc(sizeof(float) * (size_t)m * ldc);
          memcpy(Cs, C0 + (size_t)r0 * ldc, sizeof(float) * (size_t)m * ldc);
          CHECK(run(&sub, A + (size_t)r0 * lda, lda, B, ldb, beta, Cs, ldc, 1), "case %d rows %d..: taken", ci, r0);
          CHECK(memcmp(Cs, C[0] + (size_t)r0 * ldc, sizeof(float) * (size_t)m * ldc) == 0,
                "case %d beta %g: rows %d..%d alone differ from the same rows among %d", ci, beta, r0, r0 + m - 1,
                s->M);
          free(Cs);
        }
      }
      for (int t = 0; t < 3; t++) free(C[t]);
    }
    free(A);
    free(B);
    free(C0);
  }
  // Refused: C untouched.
  const shape refused[] = {
    {true, PX_SGEMM_ROWS_MAX + 1, 16, 16},  // too many rows
    {true, 4, 16, 20},                      // K not a multiple of 16
    {true, 4, 18, 16},                      // N not a multiple of 4
    {false, 4, 40, 16},                     // N not a multiple of 16
    {false, 0, 16, 16},                     // no rows
  };
  float *A = calloc((size_t)(PX_SGEMM_ROWS_MAX + 1) * 64, sizeof(float)), *B = calloc(64 * 64, sizeof(float));
  float *C = malloc(sizeof(float) * (size_t)(PX_SGEMM_ROWS_MAX + 1) * 64);
  for (int ri = 0; ri < (int)(sizeof refused / sizeof refused[0]); ri++) {
    const shape *s = &refused[ri];
    for (int i = 0; i < (PX_SGEMM_ROWS_MAX + 1) * 64; i++) C[i] = 7.0f;
    CHECK(!run(s, A, 64, B, 64, 0.0f, C, 64, 1), "refused case %d was taken", ri);
    bool kept = true;
    for (int i = 0; i < (PX_SGEMM_ROWS_MAX + 1) * 64; i++) kept = kept && C[i] == 7.0f;
    CHECK(kept, "refused case %d wrote C", ri);
  }
  const shape ok = {true, 4, 16, 16};
  CHECK(!run(&ok, A, 64, B, 64, 0.5f, C, 64, 1), "beta 0.5 was taken");
  free(A);
  free(B);
  free(C);
  px_set_num_threads(threads0);
  return px_test_finish("test_sgemm_rows_match_reference_any_rows_and_threads");
}
