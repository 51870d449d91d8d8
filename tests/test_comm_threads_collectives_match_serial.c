/* Claim: with 1, 2, 3 and 4 ranks started by px_comm_run (the self backend
 * for one, threads for more), every collective gives the serial result bit
 * for bit: all-reduce (SUM, AVG, MIN, MAX over F32, F64, I32, I64),
 * broadcast from every root, all-gather (also in place), reduce-scatter,
 * point-to-point rings, asynchronous operations waited in order, splits
 * into even/odd and reversed groups, and a 3M-float all-reduce whose length
 * divides by no rank count.  If it failed, ranks of one job would hold
 * different parameters after the same step, DDP on N threads would not
 * equal one process on the N-fold batch, or results would change from run
 * to run. */
#define _POSIX_C_SOURCE 200809L
#include "test_comm_checks.h"

#include <stdatomic.h>

typedef struct shared {
  int n;
  atomic_int before_barrier;
} shared;

static int rank_main(px_comm *c, void *arg) {
  shared *s = arg;
  px_comm_backend want = s->n == 1 ? PX_COMM_SELF : PX_COMM_THREADS;
  CHECK(px_comm_backend_of(c) == want, "backend %s with %d ranks", px_comm_backend_name(px_comm_backend_of(c)), s->n);
  CHECK(px_comm_size(c) == s->n && px_comm_rank(c) >= 0 && px_comm_rank(c) < s->n, "rank %d of %d", px_comm_rank(c),
        px_comm_size(c));
  CHECK(px_comm_local_rank(c) == px_comm_rank(c) && px_comm_local_size(c) == s->n, "threads: local = global");
  CHECK(px_comm_timeout(c) == 600, "default timeout %g", px_comm_timeout(c));

  // A barrier lets no rank through before all arrived.
  atomic_fetch_add(&s->before_barrier, 1);
  CHECK_OK(px_comm_barrier(c));
  CHECK(atomic_load(&s->before_barrier) == s->n, "rank %d left the barrier with %d of %d arrived", px_comm_rank(c),
        atomic_load(&s->before_barrier), s->n);
  CHECK_OK(px_comm_barrier(c));

  comm_checks(c, true);
  return 0;
}

int main(void) {
  for (int n = 1; n <= 4; n++) {
    shared s = {.n = n};
    int code = -1;
    double t0 = px_time_now();
    CHECK_OK(px_comm_run(n, rank_main, &s, &code));
    CHECK(code == 0, "px_comm_run(%d) exit code %d", n, code);
    printf("%d rank(s): %.2f s\n", n, px_time_now() - t0);
  }
  return px_test_finish("test_comm_threads_collectives_match_serial");
}
