/* Claim: Adam's and AdamW's steps give the bits of PyTorch's rule written
 * with true divisions,
 *   denom = sqrt(v) / sqrt(bc2) + eps,   p += (-lr / bc1) · m / denom,
 * although the library takes sqrt(v) / sqrt(bc2) as a product with the
 * rounded reciprocal and one fma correction (src/optim/optim.c, "Markstein's
 * correction").  Every parameter, m and v is compared bit for bit after
 * each of 30 steps of three runs (Adam with β2 0.999 and with 0.95 and L2,
 * AdamW: 60 different divisors sqrt(bc2)), over 2^18 elements whose gradients span 2^-60 .. 2^60, with zeros, and with
 * one gradient so large that v overflows to infinity (the division leaves
 * that parameter as it was).  If this fails, the fast path rounds
 * differently from the division: training would drift from PyTorch's and
 * from the GPU's Adam (which divides). */
#include "px_test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

enum { N = 1 << 18, STEPS = 30 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}

/* A gradient of random sign and magnitude 2^-60 .. 2^60 (one in 64 zero). */
static float next_grad(void) {
  const uint32_t r = next_u32();
  if ((r & 63u) == 0) return 0.0f;
  const float mant = 1.0f + (float)(next_u32() & 0xffffu) / 65536.0f;
  const float g = ldexpf(mant, (int)(r >> 8) % 121 - 60);
  return (r & 64u) ? -g : g;
}

static int run(const char *label, px_optim_opts opts) {
  const int before = px_test_failures;
  float *p = malloc(N * sizeof *p), *g = malloc(N * sizeof *g);
  float *rp = malloc(N * sizeof *rp), *rm = calloc(N, sizeof *rm), *rv = calloc(N, sizeof *rv);
  for (size_t i = 0; i < N; i++) p[i] = rp[i] = next_grad();
  px_optim *o = NULL;
  CHECK_OK(px_optim_create(&o, p, g, N, &opts));
  const bool decoupled = opts.kind == PX_OPTIM_ADAMW;
  size_t wrong = 0;
  for (int step = 0; step < STEPS && wrong == 0; step++) {
    for (size_t i = 0; i < N; i++) g[i] = next_grad();
    g[7] = 3e30f; /* d·d overflows: v = inf, denom = inf, p unchanged */
    CHECK_OK(px_optim_step(o));
    // The reference: the rule with true divisions, constants as PyTorch's.
    const double t = (double)(step + 1);
    const double bc1 = 1.0 - pow((double)opts.beta1, t), bc2 = 1.0 - pow((double)opts.beta2, t);
    const float decay = decoupled ? (float)(1.0 - (double)opts.lr * opts.weight_decay) : 1.0f;
    const float l2 = decoupled ? 0.0f : opts.weight_decay;
    const float c1 = (float)(1.0 - (double)opts.beta1), c2 = (float)(1.0 - (double)opts.beta2);
    const float nss = (float)(-(double)opts.lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    for (size_t i = 0; i < N; i++) {
      const float pi = rp[i] * decay, d = g[i] + l2 * pi;
      const float mi = rm[i] * opts.beta1 + c1 * d, vi = rv[i] * opts.beta2 + c2 * d * d;
      rm[i] = mi;
      rv[i] = vi;
      const float denom = sqrtf(vi) / bc2_sqrt + opts.eps;
      rp[i] = pi + nss * mi / denom;
    }
    const float *m = px_optim_state_slot(o, 0, NULL), *v = px_optim_state_slot(o, 1, NULL);
    for (size_t i = 0; i < N; i++)
      if (memcmp(&p[i], &rp[i], sizeof(float)) || memcmp(&m[i], &rm[i], sizeof(float)) ||
          memcmp(&v[i], &rv[i], sizeof(float))) {
        if (wrong++ < 5)
          fprintf(stderr, "%s step %d element %zu: p %a (expected %a), m %a (%a), v %a (%a)\n", label, step + 1, i,
                  p[i], rp[i], m[i], rm[i], v[i], rv[i]);
      }
    CHECK(wrong == 0, "%s: step %d (sqrt(bc2) = %.9g): %zu elements differ from the rule with divisions", label,
          step + 1, (double)bc2_sqrt, wrong);
  }
  CHECK(isinf(rv[7]) && p[7] == rp[7], "%s: the overflowing element: v %g, p %g (expected %g)", label, (double)rv[7],
        (double)p[7], (double)rp[7]);
  px_optim_free(o);
  free(p);
  free(g);
  free(rp);
  free(rm);
  free(rv);
  return px_test_failures == before;
}

int main(void) {
  px_optim_opts adam = px_adam_defaults(1e-3f);
  run("Adam (beta2 0.999)", adam);
  adam.beta2 = 0.95f;
  adam.weight_decay = 0.01f;
  run("Adam (beta2 0.95, L2 0.01)", adam);
  px_optim_opts adamw = px_adamw_defaults(3e-4f);
  run("AdamW (beta2 0.999)", adamw);
  return px_test_finish("test_optim_adam_reciprocal_division_is_exact");
}
