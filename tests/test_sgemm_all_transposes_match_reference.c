/* Claim: px_sgemm computes C = alpha·op(A)·op(B) + beta·C for all four
 * transpose combinations, with leading dimensions larger than the matrix
 * (views into bigger buffers), against a double-precision loop.  Every
 * layer's forward and backward rests on it; a wrong transpose flag or
 * leading dimension here would corrupt them all. */
#include "px_test.h"

static double ref_at(bool t, const float *M, int ld, int r, int c) { return t ? M[c * ld + r] : M[r * ld + c]; }

int main(void) {
  const int M = 37, N = 29, K = 53, pad = 3;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      // Stored shapes: A is (M, K) or (K, M); B is (K, N) or (N, K).
      int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
      int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
      float *A = malloc(sizeof(float) * (size_t)a_rows * lda), *B = malloc(sizeof(float) * (size_t)b_rows * ldb);
      float *C = malloc(sizeof(float) * (size_t)M * ldc), *C0 = malloc(sizeof(float) * (size_t)M * ldc);
      px_rng r = px_rng_make(3, (uint64_t)(ta * 2 + tb));
      for (int i = 0; i < a_rows * lda; i++) A[i] = 2 * px_rng_uniform(&r) - 1;
      for (int i = 0; i < b_rows * ldb; i++) B[i] = 2 * px_rng_uniform(&r) - 1;
      for (int i = 0; i < M * ldc; i++) C[i] = C0[i] = 2 * px_rng_uniform(&r) - 1;
      const float alpha = 0.75f, beta = -0.5f;
      px_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      double worst = 0;
      for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
          double want = C0[i * ldc + j];  // the padding columns must be untouched
          if (j < N) {
            double s = 0;
            for (int k = 0; k < K; k++) s += ref_at(ta, A, lda, i, k) * ref_at(tb, B, ldb, k, j);
            want = alpha * s + beta * C0[i * ldc + j];
          }
          double e = fabs(C[i * ldc + j] - want);
          if (e > worst) worst = e;
        }
      CHECK(worst < 1e-4, "trans_a=%d trans_b=%d: worst error %g", ta, tb, worst);
      free(A);
      free(B);
      free(C);
      free(C0);
    }
  printf("blas: %s\n", px_blas_info());
  return px_test_finish("test_sgemm_all_transposes_match_reference");
}
