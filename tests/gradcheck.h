/* gradcheck.h — analytic gradients against central finite differences.
 *
 * The loss is a fixed random projection of the output, L = Σ y ⊙ r, summed
 * in double.  For input and parameter entries e we compare the analytic
 * ∂L/∂e (one backward) with (L(e + h) - L(e - h)) / 2h.
 *
 * Why a float32 tolerance is sound here: plexus computes in float32, so each
 * y carries a relative rounding error near 6e-8; with h = 1e-2 and O(1)
 * values the difference quotient's rounding noise is ~1e-5·√n and its
 * truncation error h²·f'''/6 ~ 2e-5, both far below the 1e-2 relative
 * tolerance used, while a wrong formula (a missing term, a transposed
 * index, a factor of two) shows errors of order 1. */
#ifndef PX_GRADCHECK_H
#define PX_GRADCHECK_H

#include "px_test.h"

#include <string.h>

typedef struct gc_opts {
  double h;        /* finite-difference step (default 1e-2) */
  double rtol;     /* default 1e-2 */
  double atol;     /* default 1e-3 */
  int max_checks;  /* entries checked per tensor (default 64, chosen at random) */
  bool train;      /* training mode (default true) */
  bool skip_input; /* module has no input gradient (e.g. takes ids) */
} gc_opts;

static void gc_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi) {
  px_rng r = px_rng_make(seed, 12345);
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * px_rng_uniform(&r);
}

/* Distinct values for max-pool checks: a shuffle of a grid 0.1 apart, so
 * every window has one maximum, 0.1 apart from the runner-up, and a probe
 * of ±h = ±0.01 never changes which element wins: the finite difference is
 * exact. */
static inline void fill_distinct(float *x, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) x[i] = 0.1f * (float)i - 0.05f * (float)n;
  px_rng r = px_rng_make(seed, 1);
  for (size_t i = n - 1; i > 0; i--) {
    size_t j = (size_t)px_rng_below(&r, i + 1);
    float tmp = x[i];
    x[i] = x[j];
    x[j] = tmp;
  }
}

static double gc_loss(px_model *md, const px_tensor *x, const float *r, uint64_t step, size_t *ny) {
  md->ctx.step = step - 1; /* same step → same dropout mask in every forward */
  px_tensor y;
  CHECK_OK(px_model_forward(md, x, &y));
  *ny = (size_t)px_tensor_numel(&y);
  double L = 0;
  for (size_t i = 0; i < *ny; i++) L += (double)px_f32(&y)[i] * r[i];
  return L;
}

static int gc_compare(const char *label, const char *what, size_t idx, double analytic, double numeric,
                      const gc_opts *o) {
  double err = fabs(analytic - numeric);
  if (err > o->atol + o->rtol * fmax(fabs(analytic), fabs(numeric))) {
    fprintf(stderr, "gradcheck %s: d%s[%zu] analytic %.6g numeric %.6g\n", label, what, idx, analytic, numeric);
    return 1;
  }
  return 0;
}

/* Takes ownership of `m`.  x: the input (its data is perturbed and restored).
 * Returns the number of mismatches (also counted into px_test_failures). */
static int gradcheck(const char *label, px_module *m, px_tensor *x, gc_opts o) {
  if (o.h == 0) o.h = 1e-2;
  if (o.rtol == 0) o.rtol = 1e-2;
  if (o.atol == 0) o.atol = 1e-3;
  if (o.max_checks == 0) o.max_checks = 64;
  px_model *md;
  CHECK_OK(px_model_create(&md, m, 7));
  px_model_train(md, o.train);
  const uint64_t step = 1;
  px_tensor y, dx;
  CHECK_OK(px_model_forward(md, x, &y));
  size_t ny = (size_t)px_tensor_numel(&y);
  float *r = malloc(ny * sizeof *r);
  gc_fill_uniform(r, ny, 99, -1.0f, 1.0f);
  // Analytic: one forward + backward with dy = r.
  md->ctx.step = step - 1;
  CHECK_OK(px_model_forward(md, x, &y));
  px_tensor dy = y;
  dy.data = px_model_scratch(md, ny);
  memcpy(dy.data, r, ny * sizeof *r);
  px_model_zero_grad(md);
  CHECK_OK(px_model_backward(md, &dy, o.skip_input ? NULL : &dx));
  size_t nx = (size_t)px_tensor_numel(x);
  float *dxa = NULL;
  if (!o.skip_input) {
    dxa = malloc(nx * sizeof *dxa);
    memcpy(dxa, dx.data, nx * sizeof *dxa);
  }
  float *dpa = malloc((md->n_param_elems + 1) * sizeof *dpa);
  memcpy(dpa, md->grad_data, md->n_param_elems * sizeof *dpa);
  // Buffers (running statistics) must not drift between the probes.
  float *buf0 = malloc((md->n_buffer_elems + 1) * sizeof *buf0);
  memcpy(buf0, md->buffer_data, md->n_buffer_elems * sizeof *buf0);

  int bad = 0;
  px_rng pick = px_rng_make(5, 6);
  // Input entries.
  if (!o.skip_input && x->dtype == PX_F32) {
    float *X = px_f32(x);
    for (int k = 0; k < o.max_checks && k < (int)nx * 4; k++) {
      size_t i = (nx <= (size_t)o.max_checks) ? (size_t)k : (size_t)px_rng_below(&pick, nx);
      if (i >= nx) break;
      float keep = X[i];
      X[i] = keep + (float)o.h;
      double lp = gc_loss(md, x, r, step, &ny);
      X[i] = keep - (float)o.h;
      double lm = gc_loss(md, x, r, step, &ny);
      X[i] = keep;
      memcpy(md->buffer_data, buf0, md->n_buffer_elems * sizeof *buf0);
      bad += gc_compare(label, "x", i, dxa[i], (lp - lm) / (2 * o.h), &o);
    }
  }
  // Parameter entries.
  size_t np = md->n_param_elems;
  for (int k = 0; k < o.max_checks * 2 && np; k++) {
    size_t i = (np <= (size_t)o.max_checks * 2) ? (size_t)k : (size_t)px_rng_below(&pick, np);
    if (i >= np) break;
    float keep = md->param_data[i];
    md->param_data[i] = keep + (float)o.h;
    double lp = gc_loss(md, x, r, step, &ny);
    md->param_data[i] = keep - (float)o.h;
    double lm = gc_loss(md, x, r, step, &ny);
    md->param_data[i] = keep;
    memcpy(md->buffer_data, buf0, md->n_buffer_elems * sizeof *buf0);
    bad += gc_compare(label, "theta", i, dpa[i], (lp - lm) / (2 * o.h), &o);
  }
  px_test_failures += bad;
  free(r);
  free(dxa);
  free(dpa);
  free(buf0);
  px_model_free(md);
  return bad;
}

#endif
