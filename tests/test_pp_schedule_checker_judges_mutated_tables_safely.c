/* Random damage to generated tables (a field set to any value, in range or
 * not; two neighbouring actions swapped; an action dropped or repeated) is
 * either refused by px_pp_schedule_check with a message naming a rank, or
 * accepted — never a crash or an out-of-bounds read (run it under
 * -fsanitize=address) — and every table the checker accepts also runs to
 * its end in the executor's non-blocking model (px_pp_schedule_simulate)
 * with every forward and backward done once: accepting a table that blocks
 * would hang a job.  Swapping two neighbouring transfers is often harmless,
 * so both outcomes occur; the test asserts that each occurs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) { /* xorshift64*: a fixed sequence, so a failure reproduces */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static int below(int n) { return (int)(next_u32() % (uint32_t)n); }

/* A deep copy with room for one more action a rank. */
static px_pp_schedule *copy(const px_pp_schedule *s) {
  px_pp_schedule *c = calloc(1, sizeof *c);
  *c = *s;
  c->n_actions = malloc((size_t)s->p * sizeof *c->n_actions);
  c->actions = malloc((size_t)s->p * sizeof *c->actions);
  for (int r = 0; r < s->p; r++) {
    c->n_actions[r] = s->n_actions[r];
    c->actions[r] = malloc(((size_t)s->n_actions[r] + 1) * sizeof **c->actions);
    memcpy(c->actions[r], s->actions[r], (size_t)s->n_actions[r] * sizeof **c->actions);
  }
  return c;
}

static void mutate(px_pp_schedule *c) {
  int r = below(c->p), n = c->n_actions[r];
  if (n < 2) return;
  int k = below(n - 1);
  px_pp_action *a = &c->actions[r][k];
  switch (below(7)) {
  case 0: a->op = (px_pp_op)(below(9) - 1); break; /* -1 … 7: two are no op at all */
  case 1: a->stage = below(c->p * c->v + 2) - 1; break;
  case 2: a->micro = below(c->m + 2) - 1; break;
  case 3: a->peer = below(c->p + 2) - 1; break;
  case 4: { /* swap with the next action */
    px_pp_action t = a[0];
    a[0] = a[1];
    a[1] = t;
    break;
  }
  case 5: /* drop */
    memmove(a, a + 1, (size_t)(n - k - 1) * sizeof *a);
    c->n_actions[r]--;
    break;
  default: /* repeat */
    memmove(a + 1, a, (size_t)(n - k) * sizeof *a);
    c->n_actions[r]++;
    break;
  }
}

int main(void) {
  int accepted = 0, refused = 0;
  const int shapes[][4] = {{PX_PP_1F1B, 2, 4, 1},        {PX_PP_1F1B, 4, 3, 1},        {PX_PP_GPIPE, 3, 5, 1},
                           {PX_PP_INTERLEAVED, 2, 4, 2}, {PX_PP_INTERLEAVED, 3, 6, 3}, {PX_PP_1F1B, 1, 3, 1}};
  for (unsigned sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
    px_pp_schedule *s = NULL;
    CHECK_OK(px_pp_schedule_make((px_pp_kind)shapes[sh][0], shapes[sh][1], shapes[sh][2], shapes[sh][3], &s));
    for (int trial = 0; trial < 3000; trial++) {
      px_pp_schedule *c = copy(s);
      mutate(c);
      px_clear_error();
      px_status st = px_pp_schedule_check(c);
      if (st == PX_OK) {
        accepted++;
        double busy[8], span = 0;
        st = px_pp_schedule_simulate(c, 1, 2, busy, &span);
        CHECK(st == PX_OK, "an accepted table does not run: %s", px_last_error());
        /* Complete: each rank computes v·m forwards (1) and backwards (2). */
        for (int r = 0; r < c->p && st == PX_OK; r++)
          CHECK(fabs(busy[r] * span - 3.0 * c->v * c->m) < 1e-9, "rank %d computes %g, expected %g", r, busy[r] * span,
                3.0 * c->v * c->m);
      } else {
        refused++;
        CHECK(st == PX_ERR_INVALID, "refused with %s", px_status_name(st));
        CHECK(strstr(px_last_error(), "rank ") != NULL, "message names no rank: %s", px_last_error());
      }
      for (int r = 0; r < c->p; r++) free(c->actions[r]);
      free(c->actions);
      free(c->n_actions);
      free(c);
    }
    px_pp_schedule_free(s);
  }
  printf("%d mutated tables accepted, %d refused\n", accepted, refused);
  CHECK(accepted > 0 && refused > 0, "expected both outcomes, got %d accepted, %d refused", accepted, refused);
  return px_test_finish("test_pp_schedule_checker_judges_mutated_tables_safely");
}
