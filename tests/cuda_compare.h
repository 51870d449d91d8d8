/* cuda_compare.h — what the test_cuda_* tests share: skipping without a GPU,
 * device copies of host arrays, a CPU and a device step context, and the
 * comparison of a device result with the CPU's. */
#ifndef PX_TEST_CUDA_COMPARE_H
#define PX_TEST_CUDA_COMPARE_H

#include "px_test.h"
#include "tensor/cuda/px_cuda.h"

#include <string.h>

/* ctest's skip code (the tests are registered with SKIP_RETURN_CODE 77). */
static inline void cc_require_gpu(const char *name) {
  if (px_cuda_device_count() == 0) {
    printf("%s: skipped: no CUDA device\n", name);
    exit(77);
  }
  CHECK_OK(px_cuda_init(0));
  printf("%s: on %s\n", name, px_cuda_device_name());
}

/* A device copy of n floats (or bytes) of host memory. */
static inline void *cc_to_device(const void *host, size_t bytes) {
  void *d = px_cuda_malloc(bytes ? bytes : 1);
  if (!d) {
    fprintf(stderr, "px_cuda_malloc(%zu): %s\n", bytes, px_last_error());
    exit(1);
  }
  if (bytes) CHECK_OK(px_cuda_to_device(d, host, bytes));
  return d;
}

/* A tensor on the device with the shape of `like` and a device copy of its data. */
static inline px_tensor cc_device_tensor(const px_tensor *like) {
  px_tensor t = px_tensor_view(cc_to_device(like->data, px_tensor_nbytes(like)), like->dtype, like->ndim, like->shape);
  t.device = PX_CUDA;
  return t;
}

/* The host copy of a device tensor's floats (malloc'ed). */
static inline float *cc_to_host(const px_tensor *t) {
  const size_t bytes = px_tensor_nbytes(t);
  float *h = malloc(bytes ? bytes : 1);
  if (!h) exit(1);
  CHECK(t->device == PX_CUDA, "expected a device tensor");
  if (bytes) CHECK_OK(px_cuda_to_host(h, t->data, bytes));
  return h;
}

static inline px_ctx cc_ctx(px_device dev, bool training, uint64_t seed, uint64_t step) {
  px_ctx c;
  memset(&c, 0, sizeof c);
  c.arena = dev == PX_CUDA ? px_cuda_arena_create(1 << 20) : px_arena_create(1 << 20);
  if (!c.arena) {
    fprintf(stderr, "arena: %s\n", px_last_error());
    exit(1);
  }
  c.training = training;
  c.seed = seed;
  c.step = step;
  c.device = dev;
  c.compute_dtype = PX_F32;
  return c;
}

/* m and its children in training or eval mode. */
static inline void cc_set_training(px_module *m, bool training) {
  m->training = training;
  for (int i = 0; i < m->n_children; i++) cc_set_training(m->children[i], training);
}

/* The GPU's n floats against the CPU's: max |gpu - cpu| <= tol · max(max
 * |cpu|, floor) (relative to the tensor's largest magnitude, so elements
 * near zero that came out of cancellation do not demand more than f32 can
 * give; `floor` stands in for that magnitude where a whole tensor is zero
 * in exact arithmetic, its value rounding noise of terms as large as the
 * floor).  Returns the measured relative error. */
static inline double cc_compare_floor(const char *what, const float *gpu, const float *cpu, size_t n, double tol,
                                      double floor) {
  double amax = floor, emax = 0.0;
  size_t worst = 0;
  int nonfinite = 0;
  for (size_t i = 0; i < n; i++) {
    const double c = cpu[i], g = gpu[i];
    if (!isfinite(g) && !(g == c)) nonfinite++;
    amax = fabs(c) > amax ? fabs(c) : amax;
    const double e = fabs(g - c);
    if (e > emax || e != e) {
      emax = e;
      worst = i;
    }
  }
  const double rel = amax > 0 ? emax / amax : emax;
  CHECK(nonfinite == 0 && rel <= tol,
        "%s: %zu floats, max |gpu - cpu| / max(max |cpu|, floor %.3g) = %.3g > %.1g (worst [%zu]: gpu %.9g, cpu %.9g), "
        "%d not finite",
        what, n, floor, rel, tol, worst, n ? (double)gpu[worst] : 0.0, n ? (double)cpu[worst] : 0.0, nonfinite);
  return rel;
}

/* cc_compare_floor with no floor: relative to the tensor's largest |cpu|. */
static inline double cc_compare(const char *what, const float *gpu, const float *cpu, size_t n, double tol) {
  return cc_compare_floor(what, gpu, cpu, n, tol, 0.0);
}

#endif
