// GEMM through CBLAS (OpenBLAS), row-major.
#include "plexus/tensor.h"
#include "tensor/internal.h"

#include <cblas.h>

void px_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta,
              float *C, int ldc) {
  px_threads_init();
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
