// Internal helpers of the tensor layer shared by kernels in src/.
#ifndef PX_TENSOR_INTERNAL_H
#define PX_TENSOR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

// Read PX_NUM_THREADS once and apply it to OpenMP and OpenBLAS.
void px_threads_init(void);

// PX_KERNEL marks a hot loop for function multiversioning: gcc compiles it
// three times (baseline x86-64, x86-64-v3 = AVX2+FMA, x86-64-v4 = AVX-512
// F/BW/CD/DQ/VL; OpenMP's outlined loop bodies are cloned too) and glibc's
// ifunc picks one from cpuid when the library is loaded.  So a portable
// build (the default) still runs the wide loops where the CPU has them.
// Bits do not depend on the clone except through the vector width of
// `omp simd` reductions, as with -march before: the same CPU always runs
// the same clone.  -ffp-contract stays off (ISO C), so no clone fuses a
// multiply-add that the baseline rounds twice.  Off with PX_NATIVE
// (-march=native: one build for one CPU), in sanitizer builds
// (PX_KERNEL_NO_CLONES: an ifunc resolver can run while the dynamic loader
// relocates the program, before the sanitizer's runtime is up, and its
// instrumented code would crash there), on other architectures, and where
// the compiler lacks target_clones.  px_kernel_info names the choice.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && !defined(PX_NATIVE_BUILD) && \
  !defined(PX_KERNEL_NO_CLONES)
#define PX_KERNEL_CLONES 1
#define PX_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PX_KERNEL_CLONES 0
#define PX_KERNEL
#endif

// C (M × N) = A (M × K) · op(B) + beta·C (beta 0 or 1; op(B) = Bᵀ when
// trans_b) for a GEMM with few rows, without OpenBLAS's packing of B
// (tensor/gemm_rows_avx512.c); false where it does not apply (no AVX-512F
// on this CPU or in this build, more than PX_SGEMM_ROWS_MAX rows, a shape
// its blocks do not fit, PX_GEMM_ROWS=0 in the environment), and the
// caller then calls px_sgemm.  The bits of an element depend on K only.
#define PX_SGEMM_ROWS_MAX 64
bool px_sgemm_rows(bool trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                   float *C, int ldc);
// The row kernels run on this CPU (built, AVX-512F + FMA, not PX_GEMM_ROWS=0).
bool px_sgemm_rows_on(void);
void px_sgemm_rows_avx512(bool trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                          float beta, float *C, int ldc);

// The output pass of px_sgemm_epi, applied to each element of C while its
// block is in registers or L1: C starts from bias[j] (when bias is given)
// instead of 0, and once the sum is complete becomes tanh(C) (PX_GEMM_TANH)
// or C·(1 - S²) with S an M × N matrix (PX_GEMM_DTANH: tanh's derivative
// through its output S).  The same expressions as a separate pass in
// nn/activation.c, so the same bits.
typedef enum px_gemm_act { PX_GEMM_NONE, PX_GEMM_TANH, PX_GEMM_DTANH } px_gemm_act;
typedef struct px_gemm_epi {
  const float *bias;
  px_gemm_act act;
  const float *S;
  int lds;
} px_gemm_epi;

// C (M × N) = epi(op(A) · op(B)) through plexus's packed AVX-512 GEMM
// (tensor/gemm_packed_avx512.c); false where it does not run (not built, no
// AVX-512F + FMA on this CPU, PX_GEMM_PACKED=0, out of memory), and C is
// untouched: the caller then computes the same unfused.  px_sgemm takes the
// same kernel for large shapes, so fused and unfused agree bit for bit.
bool px_sgemm_epi(bool trans_a, bool trans_b, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float *C, int ldc, const px_gemm_epi *epi);
// The packed GEMM runs on this CPU (built, AVX-512F + FMA, not PX_GEMM_PACKED=0).
bool px_sgemm_packed_on(void);
// px_sgemm takes the packed GEMM from these sizes up (M rows, K, M·N·K);
// below K = 128, C's reads and writes weigh more and OpenBLAS was faster.
#define PX_SGEMM_PACKED_MIN_M 16
#define PX_SGEMM_PACKED_MIN_K 128
#define PX_SGEMM_PACKED_MIN_MNK ((size_t)1 << 18)
// px_sgemm takes the packed GEMM for this shape (on, and large enough).
bool px_sgemm_takes_packed(int M, int N, int K);
bool px_sgemm_packed_avx512(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C, int ldc, const px_gemm_epi *epi);

// Below this many elements an OpenMP region costs more than it saves.
#define PX_PAR_MIN 32768

// `#pragma omp parallel for simd if (parallel: PX_PAR(n))`.  The modifier
// matters: since OpenMP 5.0 a bare `if` also applies to `simd`, and gcc then
// compiles every loop below the threshold without vectors.
#define PX_PAR(n) ((n) >= PX_PAR_MIN)

// tanh as a rational function x·P(x²)/Q(x²) on [-7.9, 7.9] (the degree-13/6
// minimax fit that Eigen uses).  Branch-free, so `omp simd` loops vectorize
// it; measured worst error against double tanh: 3.7e-7 relative (3 ulp),
// libm's tanhf: 1.6e-7.  Beyond ±7.9, tanh rounds to ±1 within 3e-7.
static inline float px_tanhf(float x) {
  const float c = 7.90531110763549805f;
  float xc = x > c ? c : (x < -c ? -c : x);
  float x2 = xc * xc;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * xc;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  float r = p / q;
  return (x < 0.0004f && x > -0.0004f) ? x : r;
}

// e^x, branch-free so `omp simd` loops vectorize it: e^x = 2^n · e^r with
// n = round(x·log2 e) and r = x - n·ln 2 (ln 2 in two parts, so r is exact
// to float precision), |r| <= ln2/2, e^r = 1 + r + r²·P(r) with Cephes's
// degree-5 expf polynomial.  Measured against double exp over [-87.3, 88.7]
// in steps of 1e-4: 8.0e-8 relative worst (libm's expf: 6.0e-8).  Below -87.3 it returns 0
// (e^x there is below float's normal range); above 88.7, +inf.  NaN gives
// NaN: it is clamped to lo like any x outside [lo, hi] (a NaN reaching the
// float-to-int conversion below would be undefined behaviour) and passed
// through at the end.
static inline float px_expf(float x) {
  const float hi = 88.72283935546875f, lo = -87.33654022216797f;
  float xc = x >= lo ? (x > hi ? hi : x) : lo;
  // n = round-to-nearest(x·log2 e): adding 1.5·2^23 pushes the fraction out.
  const float shifter = 12582912.0f;
  float n = (xc * 1.44269504088896341f + shifter) - shifter;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float er = p * r2 + r + 1.0f;
  // 2^n from its bits; n in [-126, 128] here, and 2^128 overflows to the
  // inf that e^x rounds to anyway (er·2^127·2 handles n = 128).
  int ni = (int)n;
  int half = ni >> 1;
  union {
    int i;
    float f;
  } s1 = {.i = (half + 127) << 23}, s2 = {.i = (ni - half + 127) << 23};
  float y = er * s1.f * s2.f;
  return x != x ? x : (x < lo ? 0.0f : y);
}

#endif
