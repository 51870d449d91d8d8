// Elementwise kernels and reductions; OpenMP above PX_PAR_MIN elements.
// Reductions accumulate in double so results do not depend on thread count
// beyond float rounding of the final value.
#include "plexus/tensor.h"
#include "tensor/internal.h"

#include <math.h>
#include <string.h>

void px_fill(float *x, size_t n, float v) {
  #pragma omp parallel for simd if (parallel: PX_PAR(n))
  for (size_t i = 0; i < n; i++) x[i] = v;
}

void px_copy(float *dst, const float *src, size_t n) {
  if (dst != src) memcpy(dst, src, n * sizeof *dst);
}

void px_scale(float *x, size_t n, float a) {
  #pragma omp parallel for simd if (parallel: PX_PAR(n))
  for (size_t i = 0; i < n; i++) x[i] *= a;
}

void px_axpy(float *y, const float *x, size_t n, float a) {
  #pragma omp parallel for simd if (parallel: PX_PAR(n))
  for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

void px_add(float *out, const float *a, const float *b, size_t n) {
  #pragma omp parallel for simd if (parallel: PX_PAR(n))
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void px_mul(float *out, const float *a, const float *b, size_t n) {
  #pragma omp parallel for simd if (parallel: PX_PAR(n))
  for (size_t i = 0; i < n; i++) out[i] = a[i] * b[i];
}

double px_sum(const float *x, size_t n) {
  double s = 0;
  #pragma omp parallel for simd reduction(+ : s) if (parallel: PX_PAR(n))
  for (size_t i = 0; i < n; i++) s += x[i];
  return s;
}

double px_dot(const float *a, const float *b, size_t n) {
  double s = 0;
  #pragma omp parallel for simd reduction(+ : s) if (parallel: PX_PAR(n))
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

double px_sumsq(const float *x, size_t n) {
  double s = 0;
  #pragma omp parallel for simd reduction(+ : s) if (parallel: PX_PAR(n))
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

float px_max_abs(const float *x, size_t n) {
  float m = 0;
  #pragma omp parallel for simd reduction(max : m) if (parallel: PX_PAR(n))
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
