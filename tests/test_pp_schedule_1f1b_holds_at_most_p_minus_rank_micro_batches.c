/* Activation memory, read off the tables: counting forwards minus backwards
 * along each rank's actions, 1F1B never has more than p - r micro-batches
 * in flight on rank r (Megatron's bound: rank 0 holds p, the last rank 1),
 * and GPipe holds all m.  If this failed, 1F1B would lose the memory
 * advantage it exists for.  The count is exact: min(p - r, m) for 1F1B.
 * Interleaved 1F1B, which trades memory for a smaller bubble, stays within
 * its warm-up plus one: 2(p - r - 1) + (v - 1)p + 1 chunk-micro-batches. */
#include <stdio.h>

#include "px_test.h"

static int peak_in_flight(const px_pp_schedule *s, int r) {
  int now = 0, peak = 0;
  for (int k = 0; k < s->n_actions[r]; k++) {
    if (s->actions[r][k].op == PX_PP_FORWARD) now++;
    if (s->actions[r][k].op == PX_PP_BACKWARD) now--;
    if (now > peak) peak = now;
  }
  return peak;
}

int main(void) {
  for (int p = 1; p <= 8; p++)
    for (int m = 1; m <= 32; m++) {
      px_pp_schedule *s = NULL;
      CHECK_OK(px_pp_schedule_make(PX_PP_1F1B, p, m, 1, &s));
      for (int r = 0; r < p; r++) {
        int peak = peak_in_flight(s, r), bound = p - r < m ? p - r : m;
        CHECK(peak <= p - r, "1f1b p %d m %d rank %d: %d micro-batches in flight, more than p - r = %d", p, m, r, peak,
              p - r);
        CHECK(peak == bound, "1f1b p %d m %d rank %d: %d in flight, expected min(p - r, m) = %d", p, m, r, peak, bound);
      }
      px_pp_schedule_free(s);
      CHECK_OK(px_pp_schedule_make(PX_PP_GPIPE, p, m, 1, &s));
      for (int r = 0; r < p; r++)
        CHECK(peak_in_flight(s, r) == m, "gpipe p %d m %d rank %d: %d in flight, expected m", p, m, r,
              peak_in_flight(s, r));
      px_pp_schedule_free(s);
      for (int v = 1; v <= 4 && m % p == 0; v++) {
        CHECK_OK(px_pp_schedule_make(PX_PP_INTERLEAVED, p, m, v, &s));
        for (int r = 0; r < p; r++) {
          int bound = 2 * (p - r - 1) + (v - 1) * p + 1;
          if (bound > m * v) bound = m * v;
          CHECK(peak_in_flight(s, r) <= bound, "interleaved p %d m %d v %d rank %d: %d in flight, bound %d", p, m, v, r,
                peak_in_flight(s, r), bound);
        }
        px_pp_schedule_free(s);
      }
    }
  px_pp_schedule *s = NULL;
  CHECK_OK(px_pp_schedule_make(PX_PP_1F1B, 4, 8, 1, &s));
  printf("1f1b p 4 m 8, in flight per rank:");
  for (int r = 0; r < 4; r++) printf(" %d", peak_in_flight(s, r));
  printf("\n");
  px_pp_schedule_free(s);
  return px_test_finish("test_pp_schedule_1f1b_holds_at_most_p_minus_rank_micro_batches");
}
