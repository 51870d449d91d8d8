/* The simulated bubble of every generated table equals the formula:
 * (p - 1)/(m + p - 1) for GPipe and 1F1B, (p - 1)/(v·m + p - 1) for
 * interleaved 1F1B, on every rank, for p <= 8, m <= 32, v <= 4 (interleaved
 * where m % p == 0), with equal forward and backward costs.  If this failed,
 * a schedule would idle more than Megatron's analysis says it must (a
 * misplaced receive that holds a rank back, a warm-up that is too short).
 *
 * Tolerance 1e-12: with tf = tb = 1 every time is an integer, so makespan
 * and busy time are exact; only the two divisions (busy / makespan, and the
 * formula's) round, each within one ulp.
 *
 * Also with a backward twice the forward (tf 1, tb 2, as usual for a
 * network): the formulas hold for any tf and tb (the bubble is p - 1 stage
 * times of tf + tb, against m·v of them computing), and the tables are laid
 * out on a unit timeline, so this shows that where a receive sits in the
 * table does not cost time when the real costs differ. */
#include <stdio.h>

#include "px_test.h"

static double worst_gap(px_pp_kind kind, int p, int m, int v, double tf, double tb, double *makespan) {
  px_pp_schedule *s = NULL;
  CHECK_OK(px_pp_schedule_make(kind, p, m, v, &s));
  double busy[8];
  CHECK_OK(px_pp_schedule_simulate(s, tf, tb, busy, makespan));
  double want = px_pp_bubble_formula(kind, p, m, v), worst = 0;
  for (int r = 0; r < p; r++) {
    double gap = fabs((1.0 - busy[r]) - want);
    if (gap > worst) worst = gap;
  }
  px_pp_schedule_free(s);
  return worst;
}

int main(void) {
  int tables = 0;
  for (int kind = PX_PP_GPIPE; kind <= PX_PP_INTERLEAVED; kind++)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 32; m++)
        for (int v = 1; v <= (kind == PX_PP_INTERLEAVED ? 4 : 1); v++) {
          if (kind == PX_PP_INTERLEAVED && m % p != 0) continue;
          double span;
          double gap = worst_gap((px_pp_kind)kind, p, m, v, 1, 1, &span);
          CHECK(gap <= 1e-12, "%s p %d m %d v %d: bubble off the formula %.6f by %.3g (makespan %g)",
                px_pp_kind_name((px_pp_kind)kind), p, m, v, px_pp_bubble_formula((px_pp_kind)kind, p, m, v), gap, span);
          /* The makespan itself: (v·m + p - 1) slots of tf + tb. */
          double vm = kind == PX_PP_INTERLEAVED ? (double)v * m : m;
          CHECK(span == 2 * (vm + p - 1), "%s p %d m %d v %d: makespan %g, expected %g",
                px_pp_kind_name((px_pp_kind)kind), p, m, v, span, 2 * (vm + p - 1));
          gap = worst_gap((px_pp_kind)kind, p, m, v, 1, 2, &span);
          CHECK(gap <= 1e-12, "%s p %d m %d v %d, tb = 2 tf: bubble off the formula by %.3g",
                px_pp_kind_name((px_pp_kind)kind), p, m, v, gap);
          tables++;
        }
  printf("%d tables timed\n", tables);
  return px_test_finish("test_pp_schedule_bubble_matches_formula");
}
