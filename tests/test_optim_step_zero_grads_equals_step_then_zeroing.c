/* Claim: px_optim_step_zero_grads gives the parameters and state the bits
 * of px_optim_step, and leaves every gradient its segments cover zero and
 * nothing else touched, for SGD (plain, momentum, Nesterov, weight decay),
 * Adam and AdamW, over segments (one above PX_PAR_MIN, so the OpenMP path
 * runs too) and several steps.  If this fails, `plexus train` (which skips
 * zero_grad after such a step) would accumulate one step's gradients into
 * the next, or its update would differ from the plain step's. */
#include "px_test.h"

#include <string.h>

enum { NSEG = 3, STEPS = 4 };
static const size_t count[NSEG] = {5, 70000, 1};

static uint32_t rng_state = 777u;
static float next_value(void) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return (float)((rng_state >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static void run(const char *label, px_optim_opts opts) {
  // Two copies of each segment; grads of segment k live inside a larger
  // buffer with a guard element either side, which must stay as it is.
  float *pa[NSEG], *pb[NSEG], *ga[NSEG], *gb[NSEG];
  px_optim_segment sa[NSEG], sb[NSEG];
  size_t off = 0;
  for (int k = 0; k < NSEG; k++) {
    pa[k] = malloc(count[k] * sizeof(float));
    pb[k] = malloc(count[k] * sizeof(float));
    ga[k] = malloc((count[k] + 2) * sizeof(float));
    gb[k] = malloc((count[k] + 2) * sizeof(float));
    for (size_t i = 0; i < count[k]; i++) pa[k][i] = pb[k][i] = next_value();
    ga[k][0] = gb[k][0] = 7.0f;
    ga[k][count[k] + 1] = gb[k][count[k] + 1] = -7.0f;
    sa[k] = (px_optim_segment){.params = pa[k], .grads = ga[k] + 1, .count = count[k], .offset = off};
    sb[k] = (px_optim_segment){.params = pb[k], .grads = gb[k] + 1, .count = count[k], .offset = off};
    off += count[k] + 2;
  }
  px_optim *a = NULL, *b = NULL;
  CHECK_OK(px_optim_create_segments(&a, sa, NSEG, off, &opts));
  CHECK_OK(px_optim_create_segments(&b, sb, NSEG, off, &opts));
  size_t wrong = 0, not_zero = 0;
  for (int step = 0; step < STEPS; step++) {
    for (int k = 0; k < NSEG; k++)
      for (size_t i = 0; i < count[k]; i++) ga[k][i + 1] = gb[k][i + 1] = next_value() * (float)(step + 1);
    CHECK_OK(px_optim_step(a));
    CHECK_OK(px_optim_step_zero_grads(b));
    for (int k = 0; k < NSEG; k++) {
      wrong += memcmp(pa[k], pb[k], count[k] * sizeof(float)) != 0;
      for (size_t i = 0; i < count[k]; i++) not_zero += gb[k][i + 1] != 0.0f || signbit(gb[k][i + 1]);
      CHECK(gb[k][0] == 7.0f && gb[k][count[k] + 1] == -7.0f, "%s: step %d: segment %d's neighbours were written",
            label, step + 1, k);
    }
    for (int slot = 0; slot < a->n_state; slot++)
      wrong += memcmp(px_optim_state_slot(a, slot, NULL), px_optim_state_slot(b, slot, NULL), off * sizeof(float)) != 0;
  }
  CHECK(wrong == 0, "%s: %zu parameter or state arrays differ from px_optim_step's", label, wrong);
  CHECK(not_zero == 0, "%s: %zu gradients not +0 after px_optim_step_zero_grads", label, not_zero);
  px_optim_free(a);
  px_optim_free(b);
  for (int k = 0; k < NSEG; k++) {
    free(pa[k]);
    free(pb[k]);
    free(ga[k]);
    free(gb[k]);
  }
}

int main(void) {
  px_optim_opts o = px_sgd_defaults(0.1f);
  run("SGD", o);
  o.weight_decay = 0.01f;
  o.momentum = 0.9f;
  run("SGD momentum, weight decay", o);
  o.nesterov = true;
  run("SGD Nesterov", o);
  run("Adam", px_adam_defaults(1e-3f));
  run("AdamW", px_adamw_defaults(1e-3f));
  CHECK(px_optim_step_zero_grads(NULL) != PX_OK, "a NULL optimizer was accepted");
  return px_test_finish("test_optim_step_zero_grads_equals_step_then_zeroing");
}
