// Elementwise kernels and reductions; OpenMP above PX_PAR_MIN elements.
// Reductions accumulate in double so results do not depend on thread count
// beyond float rounding of the final value.
#include "plexus/tensor.h"
#include "tensor/internal.h"

#include <math.h>
#include <string.h>

PX_KERNEL void px_fill(float *x, size_t n, float v) {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
  for (size_t i = 0; i < n; i++) x[i] = v;
}

void px_copy(float *dst, const float *src, size_t n) {
  if (dst != src) memcpy(dst, src, n * sizeof *dst);
}

PX_KERNEL void px_scale(float *x, size_t n, float a) {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
  for (size_t i = 0; i < n; i++) x[i] *= a;
}

PX_KERNEL void px_axpy(float *y, const float *x, size_t n, float a) {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
  for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

PX_KERNEL void px_add(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

PX_KERNEL void px_mul(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
  for (size_t i = 0; i < n; i++) out[i] = a[i] * b[i];
}

// Sums over fixed blocks of RED_BLOCK elements, added in block order, so the
// result depends on n alone: not on the thread count, and not on which
// thread finishes first (OpenMP's reduction clause adds the threads'
// partials in the order they arrive, which changes the last bits from run
// to run and would break bit-exact resume).  Blocks go in groups of
// RED_GROUP so the partials fit on the stack.
#define RED_BLOCK 4096
#define RED_GROUP 512

#define PX_BLOCK_REDUCE(TERM)                                                                                          \
  double total = 0.0;                                                                                                  \
  const size_t nblocks = (n + RED_BLOCK - 1) / RED_BLOCK;                                                              \
  for (size_t g0 = 0; g0 < nblocks; g0 += RED_GROUP) {                                                                 \
    const size_t g1 = g0 + RED_GROUP < nblocks ? g0 + RED_GROUP : nblocks;                                             \
    double part[RED_GROUP];                                                                                            \
    _Pragma("omp parallel for schedule(static) if (PX_PAR((g1 - g0) * RED_BLOCK))") for (size_t b = g0; b < g1; b++) { \
      const size_t i0 = b * RED_BLOCK, i1 = i0 + RED_BLOCK < n ? i0 + RED_BLOCK : n;                                   \
      double s = 0.0;                                                                                                  \
      _Pragma("omp simd reduction(+ : s)") for (size_t i = i0; i < i1; i++) s += TERM;                                 \
      part[b - g0] = s;                                                                                                \
    }                                                                                                                  \
    for (size_t b = g0; b < g1; b++) total += part[b - g0];                                                            \
  }                                                                                                                    \
  return total

PX_KERNEL double px_sum(const float *x, size_t n) { PX_BLOCK_REDUCE((double)x[i]); }

PX_KERNEL double px_dot(const float *a, const float *b_, size_t n) { PX_BLOCK_REDUCE((double)a[i] * b_[i]); }

PX_KERNEL double px_sumsq(const float *x, size_t n) { PX_BLOCK_REDUCE((double)x[i] * x[i]); }

PX_KERNEL float px_max_abs(const float *x, size_t n) {
  float m = 0;
#pragma omp parallel for simd reduction(max : m) if (parallel : PX_PAR(n))
  for (size_t i = 0; i < n; i++) {
    float v = fabsf(x[i]);
    if (v > m) m = v;
  }
  return m;
}

double px_max_rel_diff(const float *a, const float *b, size_t n, double floor) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    double s = fmax(fmax(fabs((double)a[i]), fabs((double)b[i])), floor);
    if (d / s > worst || isnan(d)) worst = isnan(d) ? INFINITY : d / s;
  }
  return worst;
}
