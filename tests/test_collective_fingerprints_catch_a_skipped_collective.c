/* Claim: with PX_DEBUG_COLLECTIVES=1 (read from the environment when the
 * threads communicator is made), a rank that skips a collective is caught
 * at its next one, on 2, 3 and 4 ranks:
 *   - every rank returns PX_ERR_COMM, none runs either call (buffers
 *     untouched), and the communicator stays usable;
 *   - the message names both sides: rank 0's all-reduce (count, dtype, op,
 *     label, this repository's file and line) and the skipper's broadcast,
 *     and how many ranks differ (the skipper rank 1, or rank 0 itself);
 *   - collectives of every kind that match pass the check and compute what
 *     they compute without it (no false positive), split included;
 *   - a rank that skips its last collective and never calls another leaves
 *     the others in the fingerprint exchange until the watchdog, whose
 *     message names that exchange, the collective it guards and the rank
 *     that did not arrive.
 * If it failed, a skipped collective would hang the job or pair the wrong
 * calls (a broadcast's bytes summed as gradients) with no hint where. */
#define _POSIX_C_SOURCE 200809L
#include "fingerprint_cases.h"

#include <time.h>

typedef struct never_out {
  px_status st[4];
  char msg[4][1024];
  int line;
} never_out;

static int skip_main(px_comm *c, void *arg) {
  (void)arg;
  fp_matched_collectives_pass(c);
  fp_skipped_collective_is_caught(c, 1);
  fp_skipped_collective_is_caught(c, 0);
  return 0;
}

/* Rank 1 skips the last all-reduce and stays busy past the others' deadline. */
static int never_main(px_comm *c, void *arg) {
  never_out *o = arg;
  const int r = px_comm_rank(c);
  px_comm_set_timeout(c, 0.5);
  px_comm_set_label(c, "step 6");
  float x[4] = {0};
  if (r == 1) {
    nanosleep(&(struct timespec){1, 0}, NULL);
    return 0;
  }
  const int line = __LINE__ + 1;
  o->st[r] = px_comm_allreduce(c, x, 4, PX_F32, PX_SUM);
  if (r == 0) o->line = line;  // one writer: the ranks are threads
  snprintf(o->msg[r], sizeof o->msg[r], "%s", px_last_error());
  return 0;
}

int main(void) {
  setenv("PX_DEBUG_COLLECTIVES", "1", 1);
  for (int n = 2; n <= 4; n++) {
    int code = -1;
    CHECK_OK(px_comm_run(n, skip_main, NULL, &code));
    CHECK(code == 0, "%d ranks: exit code %d", n, code);
  }
  for (int n = 2; n <= 3; n++) {
    never_out o;
    memset(&o, 0, sizeof o);
    int code = -1;
    CHECK_OK(px_comm_run(n, never_main, &o, &code));
    for (int r = 0; r < n; r++) {
      if (r == 1) continue;
      char want[256];
      // The exchange is the backend's all-gather; its label says what it guards.
      snprintf(want, sizeof want,
               "allgather (fingerprint exchange before allreduce #1 at "
               "tests/test_collective_fingerprints_catch_a_skipped_collective.c:%d, step 6)",
               o.line);
      CHECK(o.st[r] == PX_ERR_TIMEOUT, "never: %d ranks, rank %d got %s (%s)", n, r, px_status_name(o.st[r]), o.msg[r]);
      fp_expect_in(o.msg[r], want, r, "never");
      fp_expect_in(o.msg[r], "waiting on ranks [1]", r, "never");
    }
  }
  return px_test_finish("test_collective_fingerprints_catch_a_skipped_collective");
}
