// GEMM through CBLAS (OpenBLAS, loaded by blas.c), row-major.
#include "plexus/tensor.h"
#include "tensor/blas.h"
#include "tensor/internal.h"

// Only when OpenBLAS could not be loaded: correct and slow.
PX_KERNEL static void sgemm_reference(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                                      const float *B, int ldb, float beta, float *C, int ldc) {
#pragma omp parallel for if ((long)M * N * K > 1000000)
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++)
        s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * C[i * ldc + j]));
    }
}

void px_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc) {
  px_threads_init();
  if (M == 0 || N == 0) return;
  if (!px_blas.sgemm) {
    sgemm_reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  px_blas.sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
                A, lda, B, ldb, beta, C, ldc);
}
