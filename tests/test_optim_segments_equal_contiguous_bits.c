/* Claim: px_optim_create_segments gives, element for element, the bits of
 * px_optim_create over the same values laid out contiguously, for SGD
 * (plain, momentum, Nesterov, with and without weight decay), Adam and
 * AdamW, over several steps; each segment's state sits at its offset of
 * the one (n_state, n) allocation and the gaps between segments (a ZeRO
 * shard's padding) stay zero.  Segments that overlap in the state, end
 * past n or overlap their own params and grads are refused.  One segment
 * is above PX_PAR_MIN, so the OpenMP path is covered too.  If this fails,
 * ZeRO stages 1-2 (which step their pieces in place inside the model's
 * flat buffers) train differently from DDP, or their checkpoints record
 * optimizer state in the wrong place. */
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

enum { NSEG = 4, STEPS = 5 };
/* Segment k: count[k] elements at state offset off[k]; gaps of 0, 3, 1 and
 * 5 elements before them, and 2 after the last (n = 40011). */
static const size_t count[NSEG] = {7, 40000 - 7 - 1000 - 1, 1, 1000};
static size_t off[NSEG], total, n_space;

static uint32_t rng_state = 12345u;
static float next_value(void) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return (float)((rng_state >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static int run(const char *label, px_optim_opts opts) {
  const int before = px_test_failures;
  float *cp = malloc(total * sizeof *cp), *cg = malloc(total * sizeof *cg);
  float *sp[NSEG], *sg[NSEG];
  px_optim_segment seg[NSEG];
  for (size_t i = 0; i < total; i++) cp[i] = next_value();
  for (int k = 0, at = 0; k < NSEG; at += (int)count[k], k++) {
    sp[k] = malloc(count[k] * sizeof(float));
    sg[k] = malloc(count[k] * sizeof(float));
    memcpy(sp[k], cp + at, count[k] * sizeof(float));
    seg[k] = (px_optim_segment){.params = sp[k], .grads = sg[k], .count = count[k], .offset = off[k]};
  }
  px_optim *c = NULL, *s = NULL;
  CHECK_OK(px_optim_create(&c, cp, cg, total, &opts));
  CHECK_OK(px_optim_create_segments(&s, seg, NSEG, n_space, &opts));
  CHECK(s->n == n_space && s->n_state == c->n_state, "%s: state %d x %zu, expected %d x %zu", label, s->n_state, s->n,
        c->n_state, n_space);
  for (int step = 0; step < STEPS; step++) {
    for (size_t i = 0; i < total; i++) cg[i] = next_value() * (float)(step + 1);
    for (int k = 0, at = 0; k < NSEG; at += (int)count[k], k++) memcpy(sg[k], cg + at, count[k] * sizeof(float));
    if (step == 3) {  // a learning-rate change goes through both alike
      px_optim_set_lr(c, opts.lr * 0.5f);
      px_optim_set_lr(s, opts.lr * 0.5f);
    }
    CHECK_OK(px_optim_step(c));
    CHECK_OK(px_optim_step(s));
  }
  size_t wrong = 0, gap_nonzero = 0;
  for (int k = 0, at = 0; k < NSEG; at += (int)count[k], k++) {
    wrong += memcmp(sp[k], cp + at, count[k] * sizeof(float)) != 0;
    for (int slot = 0; slot < c->n_state; slot++)
      wrong += memcmp(px_optim_state_slot(s, slot, NULL) + off[k], px_optim_state_slot(c, slot, NULL) + at,
                      count[k] * sizeof(float)) != 0;
  }
  for (int slot = 0; slot < s->n_state; slot++) {
    const float *st = px_optim_state_slot(s, slot, NULL);
    for (size_t i = 0, k = 0; i < n_space; i++) {
      while (k < NSEG && i >= off[k] + count[k]) k++;
      bool covered = k < NSEG && i >= off[k];
      gap_nonzero += !covered && st[i] != 0.0f;
    }
  }
  CHECK(wrong == 0, "%s: %zu segments differ from the contiguous optimizer (params or state)", label, wrong);
  CHECK(gap_nonzero == 0, "%s: %zu state elements between segments are not zero", label, gap_nonzero);
  CHECK(s->step == STEPS, "%s: %lld steps counted", label, (long long)s->step);
  px_optim_free(c);
  px_optim_free(s);
  for (int k = 0; k < NSEG; k++) {
    free(sp[k]);
    free(sg[k]);
  }
  free(cp);
  free(cg);
  return px_test_failures == before;
}

static void expect_refused(const char *label, const px_optim_segment *seg, int n_seg, size_t n, const char *needle) {
  px_optim *o = NULL;
  px_optim_opts opts = px_adam_defaults(1e-3f);
  px_clear_error();
  px_status st = px_optim_create_segments(&o, seg, n_seg, n, &opts);
  CHECK(st == PX_ERR_INVALID && o == NULL, "%s: returned %s, expected PX_ERR_INVALID", label, px_status_name(st));
  CHECK(strstr(px_last_error(), needle) != NULL, "%s: message \"%s\" does not mention \"%s\"", label, px_last_error(),
        needle);
  if (st == PX_OK) px_optim_free(o);
}

int main(void) {
  const size_t gap[NSEG] = {0, 3, 1, 5};
  for (int k = 0; k < NSEG; k++) {
    off[k] = n_space + gap[k];
    n_space = off[k] + count[k];
    total += count[k];
  }
  n_space += 2;

  px_optim_opts sgd = px_sgd_defaults(0.1f);
  px_optim_opts mom = px_sgd_defaults(0.05f);
  mom.momentum = 0.9f;
  mom.dampening = 0.1f;
  mom.weight_decay = 0.01f;
  px_optim_opts nes = px_sgd_defaults(0.05f);
  nes.momentum = 0.8f;
  nes.nesterov = true;
  nes.weight_decay = 0.001f;
  px_optim_opts adam = px_adam_defaults(1e-2f);
  adam.weight_decay = 0.05f;
  px_optim_opts adamw = px_adamw_defaults(1e-2f);
  adamw.weight_decay = 0.1f;
  int ok = run("sgd", sgd) + run("sgd momentum", mom) + run("sgd nesterov", nes) + run("adam", adam) +
    run("adamw", adamw);
  printf("  %d of 5 optimizers: segments (%zu + %zu + %zu + %zu, state n %zu) equal the contiguous bits\n", ok,
         count[0], count[1], count[2], count[3], n_space);

  float a[8] = {0}, b[8] = {0}, c2[8] = {0}, d[8] = {0};
  px_optim_segment two[2] = {{a, b, 8, 0}, {c2, d, 8, 4}};
  expect_refused("overlapping state", two, 2, 16, "overlaps");
  px_optim_segment past[1] = {{a, b, 8, 4}};
  expect_refused("past n", past, 1, 10, "ends past n");
  px_optim_segment self[1] = {{a, a + 2, 4, 0}};
  expect_refused("params over grads", self, 1, 4, "overlap");
  px_optim_segment nul[1] = {{NULL, b, 4, 0}};
  expect_refused("NULL params", nul, 1, 4, "NULL");
  expect_refused("no array", NULL, 2, 4, "no array");
  return px_test_finish("test_optim_segments_equal_contiguous_bits");
}
