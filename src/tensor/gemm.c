// GEMM through CBLAS (OpenBLAS, loaded by blas.c), row-major.
#include "plexus/tensor.h"
#include "tensor/blas.h"
#include "tensor/internal.h"

#include <stdlib.h>
#include <string.h>

// The AVX-512 kernels (gemm_rows_avx512.c, gemm_packed_avx512.c) are built.
#if defined(__x86_64__) && defined(__GNUC__) && \
  (defined(PX_GEMM_ROWS_AVX512) || (defined(PX_NATIVE_BUILD) && defined(__AVX512F__) && defined(__FMA__)))
#define ROWS_BUILT 1
#endif

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

static bool packed_available(void);

// Where plexus's packed GEMM replaces OpenBLAS's: shapes big enough that
// packing pays (docs/PERFORMANCE.md, "Figures behind code comments").
static bool packed_shape(int M, int N, int K) {
  return M >= PX_SGEMM_PACKED_MIN_M && N >= 16 && K >= PX_SGEMM_PACKED_MIN_K &&
    (size_t)M * N * K >= PX_SGEMM_PACKED_MIN_MNK;
}

void px_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc) {
  px_threads_init();
  if (M == 0 || N == 0) return;
#ifdef ROWS_BUILT
  if (px_sgemm_takes_packed(M, N, K) &&
      px_sgemm_packed_avx512(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL))
    return;
#endif
  if (!px_blas.sgemm) {
    sgemm_reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  px_blas.sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
                A, lda, B, ldb, beta, C, ldc);
}

// An AVX-512 kernel of this file applies: built (a portable x86-64 build
// compiles gemm_rows_avx512.c and gemm_packed_avx512.c with -mavx512f -mfma,
// a PX_NATIVE one on an AVX-512 machine natively), this CPU has AVX-512F and
// FMA, and the environment variable that turns it off is not "0".  Decided
// once, in *ok.
static bool avx512_kernel_on(_Atomic int *ok, const char *off_var) {
#ifdef ROWS_BUILT
  int v = *ok;
  if (v < 0) {
    __builtin_cpu_init();
    const char *e = getenv(off_var);
    v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") && !(e && strcmp(e, "0") == 0);
    *ok = v;
  }
  return v == 1;
#else
  (void)ok, (void)off_var;
  return false;
#endif
}

static _Atomic int rows_ok = -1, packed_ok = -1;
static bool rows_available(void) { return avx512_kernel_on(&rows_ok, "PX_GEMM_ROWS"); }
static bool packed_available(void) { return avx512_kernel_on(&packed_ok, "PX_GEMM_PACKED"); }

bool px_sgemm_rows_on(void) { return rows_available(); }

bool px_sgemm_packed_on(void) { return packed_available(); }

bool px_sgemm_takes_packed(int M, int N, int K) { return K > 0 && packed_shape(M, N, K) && packed_available(); }

bool px_sgemm_epi(bool trans_a, bool trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float *C, int ldc, const px_gemm_epi *epi) {
  if (M < 1 || N < 16 || K < 1 || !packed_available()) return false;
#ifdef ROWS_BUILT
  px_threads_init();
  return px_sgemm_packed_avx512(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, epi);
#else
  (void)trans_a, (void)trans_b, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc, (void)epi;
  return false;
#endif
}

bool px_sgemm_rows(bool trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                   float *C, int ldc) {
  if (M < 1 || M > PX_SGEMM_ROWS_MAX || N < 1 || K < 1 || (beta != 0.0f && beta != 1.0f)) return false;
  if (trans_b ? K % 16 != 0 || N % 4 != 0 : N % 16 != 0) return false;
  if (!rows_available()) return false;
#ifdef ROWS_BUILT
  px_threads_init();
  px_sgemm_rows_avx512(trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc);
  return true;
#else
  (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc;
  return false;
#endif
}
