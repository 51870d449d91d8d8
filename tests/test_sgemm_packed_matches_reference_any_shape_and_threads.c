/* Claim: plexus's packed GEMM (px_sgemm for large shapes, px_sgemm_epi with
 * its output pass) computes C = alpha·op(A)·op(B) + beta·C for all four
 * transpose combinations, with leading dimensions larger than the matrix
 * and shapes that fill no block evenly (rows not a multiple of the 12-row
 * panels, columns not of the 32-column ones, K not of the 16-wide packing
 * transposes, K over the 256-long blocks of k), against a double-precision
 * loop; leaves the padding columns alone; gives the same bits at 1 and 2
 * threads; and its output pass (bias first, then tanh, or the product with
 * 1 - S²) gives the bits of the same expressions applied after it.  If this
 * fails, every layer on an AVX-512 CPU computes something else than it
 * claims, or depends on the thread count.
 *
 * On a CPU without AVX-512F (or with PX_GEMM_PACKED=0) the packed GEMM does
 * not run: px_sgemm is still checked against the reference (OpenBLAS, not
 * for thread invariance, which it does not promise), px_sgemm_epi must say
 * false. */
#include "plexus/plexus.h"
#include "px_test.h"
#include "tensor/internal.h"

#include <stdlib.h>
#include <string.h>

static double ref_at(bool t, const float *M, int ld, int r, int c) { return t ? M[c * ld + r] : M[r * ld + c]; }

static float *randoms(size_t n, uint64_t seed) {
  float *v = malloc(n * sizeof *v);
  px_rng r = px_rng_make(seed, 5);
  for (size_t i = 0; i < n; i++) v[i] = 2 * px_rng_uniform(&r) - 1;
  return v;
}

typedef struct shape {
  int M, N, K;
} shape;

static void check_shape(shape s, int ta, int tb, float alpha, float beta) {
  const int M = s.M, N = s.N, K = s.K, pad = 5;
  const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  float *A = randoms((size_t)a_rows * lda, 1 + (uint64_t)M), *B = randoms((size_t)b_rows * ldb, 2 + (uint64_t)K);
  float *C0 = randoms((size_t)M * ldc, 3 + (uint64_t)N), *C1 = malloc(sizeof(float) * (size_t)M * ldc);
  float *C2 = malloc(sizeof(float) * (size_t)M * ldc);
  memcpy(C1, C0, sizeof(float) * (size_t)M * ldc);
  memcpy(C2, C0, sizeof(float) * (size_t)M * ldc);
  px_set_num_threads(1);
  px_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C1, ldc);
  px_set_num_threads(2);
  px_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C2, ldc);
  double worst = 0;
  bool pad_kept = true;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < ldc; j++) {
      const float got = C1[i * ldc + j];
      if (j >= N) {
        pad_kept = pad_kept && got == C0[i * ldc + j];
        continue;
      }
      double sum = 0;
      for (int k = 0; k < K; k++) sum += ref_at(ta, A, lda, i, k) * ref_at(tb, B, ldb, k, j);
      const double want = alpha * sum + (beta == 0.0f ? 0.0 : beta * C0[i * ldc + j]);
      const double e = fabs(got - want) / (1.0 + fabs(want));
      if (e > worst) worst = e;
    }
  CHECK(worst < 2e-6 * (1 + K / 64), "%dx%dx%d ta=%d tb=%d alpha=%g beta=%g: worst relative error %g", M, N, K, ta, tb,
        alpha, beta, worst);
  CHECK(pad_kept, "%dx%dx%d ta=%d tb=%d: the columns past N are untouched", M, N, K, ta, tb);
  // OpenBLAS's threaded sgemm takes other kernels than its one-thread path:
  // the same bits are the packed GEMM's claim only.
  if (px_sgemm_takes_packed(M, N, K))
    CHECK(memcmp(C1, C2, sizeof(float) * (size_t)M * ldc) == 0, "%dx%dx%d ta=%d tb=%d: 1 and 2 threads, same bits", M,
          N, K, ta, tb);
  free(A);
  free(B);
  free(C0);
  free(C1);
  free(C2);
}

// px_sgemm_epi's output pass against px_sgemm (beta 1 on a C holding the
// bias, as the unfused Linear does) followed by the same expressions.
static void check_epi(shape s, int ta, int tb) {
  const int M = s.M, N = s.N, K = s.K;
  const int lda = ta ? M : K, ldb = tb ? K : N;
  float *A = randoms((size_t)M * K, 7), *B = randoms((size_t)K * N, 8), *bias = randoms((size_t)N, 9);
  float *S = randoms((size_t)M * N, 10);
  float *want = malloc(sizeof(float) * (size_t)M * N), *got = malloc(sizeof(float) * (size_t)M * N);
  for (int i = 0; i < M * K; i++) A[i] *= 3.0f;  // sums out to where tanh saturates
  for (int act = PX_GEMM_NONE; act <= PX_GEMM_DTANH; act++)
    for (int with_bias = 0; with_bias < 2; with_bias++)
      for (int threads = 1; threads <= 2; threads++) {
        px_set_num_threads(threads);
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) want[i * N + j] = with_bias ? bias[j] : 0.0f;
        px_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, want, N);
        for (int i = 0; i < M * N; i++) {
          if (act == PX_GEMM_TANH) want[i] = px_tanhf(want[i]);
          if (act == PX_GEMM_DTANH) want[i] = want[i] * (1.0f - S[i] * S[i]);
        }
        const px_gemm_epi epi = {.bias = with_bias ? bias : NULL, .act = (px_gemm_act)act, .S = S, .lds = N};
        memset(got, 0xff, sizeof(float) * (size_t)M * N);  // NaNs: C is not read
        const bool ran = px_sgemm_epi(ta, tb, M, N, K, A, lda, B, ldb, got, N, &epi);
        CHECK(ran == px_sgemm_packed_on(), "px_sgemm_epi runs exactly where the packed GEMM is on");
        if (!ran) continue;
        CHECK(memcmp(got, want, sizeof(float) * (size_t)M * N) == 0,
              "%dx%dx%d ta=%d tb=%d act=%d bias=%d, %d threads: the output pass has the bits of the separate one", M, N,
              K, ta, tb, act, with_bias, threads);
      }
  free(A);
  free(B);
  free(bias);
  free(S);
  free(want);
  free(got);
}

int main(void) {
  const int threads0 = px_get_num_threads();
  const shape shapes[] = {{100, 70, 153}, {97, 33, 300}, {64, 512, 257}, {130, 17, 600}, {37, 129, 1024}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        check_shape(shapes[i], ta, tb, 1.0f, i % 2 ? 1.0f : 0.0f);
        if (i == 1) check_shape(shapes[i], ta, tb, 0.75f, -0.5f);
      }
  const shape epi_shapes[] = {{100, 70, 131}, {77, 40, 513}};
  for (size_t i = 0; i < sizeof epi_shapes / sizeof *epi_shapes; i++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) check_epi(epi_shapes[i], ta, tb);
  px_set_num_threads(threads0);
  printf("packed GEMM: %s\n", px_sgemm_packed_on() ? "on (checked)" : "not on this CPU (OpenBLAS checked)");
  return px_test_finish("test_sgemm_packed_matches_reference_any_shape_and_threads");
}
