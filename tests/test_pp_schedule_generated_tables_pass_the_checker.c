/* Every table px_pp_schedule_make generates for p <= 8 pipeline ranks,
 * m <= 32 micro-batches and v <= 4 virtual stages (interleaved where
 * m % p == 0) passes px_pp_schedule_check, the simulation where every send
 * blocks until its receive is posted.  If this failed, a generated schedule
 * could hang a training job (crossed sends), lose a transfer, or run a
 * micro-batch twice or never.  Also: each rank's table has the shape the
 * contract promises (RECV_ACT before a forward of a non-first stage, SEND_ACT
 * after a forward of a non-last stage, RECV_GRAD before a backward of a
 * non-last stage, SEND_GRAD after a backward of a non-first stage,
 * OPTIM_STEP last), and the interleaved schedule refuses m % p != 0 naming
 * both numbers. */
#include <stdio.h>
#include <string.h>

#include "px_test.h"

/* Index of the first action of rank r matching (op, stage, micro), or -1. */
static int find(const px_pp_schedule *s, int r, px_pp_op op, int stage, int micro) {
  for (int k = 0; k < s->n_actions[r]; k++) {
    const px_pp_action *a = &s->actions[r][k];
    if (a->op == op && a->stage == stage && a->micro == micro) return k;
  }
  return -1;
}

static int shape_ok(const px_pp_schedule *s) {
  int p = s->p, S = s->p * s->v;
  for (int st = 0; st < S; st++) {
    int r = st % p;
    for (int i = 0; i < s->m; i++) {
      int f = find(s, r, PX_PP_FORWARD, st, i), b = find(s, r, PX_PP_BACKWARD, st, i);
      if (f < 0 || b < 0 || b < f) return 0;
      if (p == 1) continue; /* one rank: neighbouring stages hand over locally */
      if (st > 0) {
        int ra = find(s, r, PX_PP_RECV_ACT, st, i), sg = find(s, r, PX_PP_SEND_GRAD, st, i);
        if (ra < 0 || ra > f || sg < b) return 0;
        if (s->actions[r][ra].peer != (st - 1) % p || s->actions[r][sg].peer != (st - 1) % p) return 0;
      }
      if (st < S - 1) {
        int sa = find(s, r, PX_PP_SEND_ACT, st, i), rg = find(s, r, PX_PP_RECV_GRAD, st, i);
        if (sa < f || rg < 0 || rg > b) return 0;
        if (s->actions[r][sa].peer != (st + 1) % p || s->actions[r][rg].peer != (st + 1) % p) return 0;
      }
    }
  }
  for (int r = 0; r < p; r++)
    if (s->n_actions[r] < 1 || s->actions[r][s->n_actions[r] - 1].op != PX_PP_OPTIM_STEP) return 0;
  return 1;
}

int main(void) {
  int tables = 0;
  for (int kind = PX_PP_GPIPE; kind <= PX_PP_INTERLEAVED; kind++)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 32; m++)
        for (int v = 1; v <= (kind == PX_PP_INTERLEAVED ? 4 : 1); v++) {
          if (kind == PX_PP_INTERLEAVED && m % p != 0) continue;
          px_pp_schedule *s = NULL;
          px_status st = px_pp_schedule_make((px_pp_kind)kind, p, m, v, &s);
          CHECK(st == PX_OK, "%s p %d m %d v %d: %s", px_pp_kind_name((px_pp_kind)kind), p, m, v, px_last_error());
          if (st != PX_OK) continue;
          st = px_pp_schedule_check(s);
          CHECK(st == PX_OK, "check %s p %d m %d v %d: %s", px_pp_kind_name((px_pp_kind)kind), p, m, v,
                px_last_error());
          CHECK(shape_ok(s), "%s p %d m %d v %d: a table without the promised shape", px_pp_kind_name((px_pp_kind)kind),
                p, m, v);
          px_pp_schedule_free(s);
          tables++;
        }
  printf("%d tables checked\n", tables);

  /* Interleaved needs m % p == 0: an error naming both numbers. */
  px_pp_schedule *s = NULL;
  px_status st = px_pp_schedule_make(PX_PP_INTERLEAVED, 4, 6, 2, &s);
  CHECK(st == PX_ERR_INVALID && s == NULL, "interleaved p 4 m 6: %s", px_status_name(st));
  CHECK(strstr(px_last_error(), "6 micro-batches") && strstr(px_last_error(), "4 pipeline ranks"), "message: %s",
        px_last_error());
  /* v > 1 is the interleaved schedule's only. */
  st = px_pp_schedule_make(PX_PP_1F1B, 2, 4, 2, &s);
  CHECK(st == PX_ERR_INVALID, "1f1b with v 2: %s", px_status_name(st));
  /* Names round-trip. */
  for (int kind = PX_PP_GPIPE; kind <= PX_PP_INTERLEAVED; kind++) {
    px_pp_kind back;
    CHECK_OK(px_pp_kind_parse(px_pp_kind_name((px_pp_kind)kind), &back));
    CHECK(back == (px_pp_kind)kind, "%s", px_pp_kind_name((px_pp_kind)kind));
  }
  px_pp_kind k;
  CHECK(px_pp_kind_parse("zb", &k) == PX_ERR_INVALID && strstr(px_last_error(), "\"zb\""), "%s", px_last_error());
  return px_test_finish("test_pp_schedule_generated_tables_pass_the_checker");
}
