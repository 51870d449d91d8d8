/* Claim: when the threads backend holds a rank's asynchronous operations
 * for that rank's own waits (PX_COMM_THREADS_PROGRESS=wait, what "auto"
 * picks when the ranks fill the cores), an operation a peer waits for
 * still completes while its rank blocks in something else: rank 0 starts
 * an iallreduce on one communicator and then blocks in a receive on
 * another, whose message rank 1 sends only after that iallreduce has
 * completed.  Rank 1's wait hands rank 0's held queue to its progress
 * thread; the exchange ends in well under a second, with the right sums,
 * at 2 and 3 ranks, and again with the iallreduce started behind an
 * earlier one.  If it failed, such a program (legal under MPI, where a
 * blocked call progresses every pending operation) would hang until the
 * watchdog: the job would end with a timeout instead of a result. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdlib.h>

#define TIMEOUT_S 5.0
#define MAX_WALL_S 1.0

typedef struct shared {
  int queued; /* iallreduces rank 0 starts before the one rank 1 waits for */
  double wall_s;
} shared;

static int rank_main(px_comm *c, void *arg) {
  shared *s = arg;
  int r = px_comm_rank(c), n = px_comm_size(c);
  px_comm_set_timeout(c, TIMEOUT_S);
  px_comm *other = NULL;  // a second communicator over the same ranks
  CHECK_OK(px_comm_split(c, 0, r, &other));
  CHECK(other != NULL, "split gave no communicator (rank %d)", r);
  float x[3][256];
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 256; i++) x[k][i] = (float)(r + 1) * (float)(k + 1);
  CHECK_OK(px_comm_barrier(c));
  double t0 = px_time_now();
  px_request *q[3];
  for (int k = 0; k <= s->queued; k++) CHECK_OK(px_comm_iallreduce(other, x[k], 256, PX_F32, PX_SUM, &q[k]));
  float token = 0.0f;
  if (r == 0) {
    // Blocks here with the iallreduces still queued on `other`.
    for (int p = 1; p < n; p++) CHECK_OK(px_comm_recv(c, &token, 1, PX_F32, p, 9));
    for (int k = 0; k <= s->queued; k++) CHECK_OK(px_request_wait(q[k]));
  } else {
    for (int k = 0; k <= s->queued; k++) CHECK_OK(px_request_wait(q[k]));
    token = x[s->queued][0];
    CHECK_OK(px_comm_send(c, &token, 1, PX_F32, 0, 9));
  }
  const float sum = (float)(n * (n + 1) / 2);
  for (int k = 0; k <= s->queued; k++)
    CHECK(x[k][0] == sum * (float)(k + 1) && x[k][255] == sum * (float)(k + 1),
          "iallreduce %d gave %g, want %g (rank %d)", k, x[k][0], sum * (float)(k + 1), r);
  if (r == 0) {
    CHECK(token == sum * (float)(s->queued + 1), "rank 0 received %g", token);
    s->wall_s = px_time_now() - t0;
  }
  px_comm_free(other);
  return 0;
}

int main(void) {
  setenv("PX_COMM_THREADS_PROGRESS", "wait", 1);
  for (int n = 2; n <= 3; n++)
    for (int queued = 0; queued <= 2; queued += 2) {
      shared s = {.queued = queued, .wall_s = -1};
      int code = -1;
      CHECK_OK(px_comm_run(n, rank_main, &s, &code));
      CHECK(code == 0, "%d ranks, %d queued before: a rank failed (exit %d)", n, queued, code);
      printf("%d ranks, %d iallreduce(s) queued before: exchange took %.3f s (bound %.1f s)\n", n, queued, s.wall_s,
             MAX_WALL_S);
      CHECK(s.wall_s >= 0 && s.wall_s < MAX_WALL_S, "%d ranks: the exchange took %.3f s, bound %.1f s", n, s.wall_s,
            MAX_WALL_S);
    }
  return px_test_finish("test_comm_threads_held_operations_move_while_their_rank_waits_elsewhere");
}
