/* Claim: under MPI (one process a rank, PX_DEBUG_COLLECTIVES=1 read from
 * the environment when the world communicator is made), the fingerprints
 * catch a skipped collective and a changed count exactly as under threads:
 * every rank returns PX_ERR_COMM with one message naming rank 0's side and
 * the diverging rank's (operation, count, dtype, label, file:line), no rank
 * runs the call, and matching collectives of every kind (split included)
 * pass.  With 3 or more processes DDP's and ZeRO's rank-order sums are
 * point-to-point messages on a private communicator (parallel/rank_sum.c):
 * they are checked as the all-reduce they are, so a rank summing another
 * count is caught there too, before any message.  With one process only
 * the matching ones run (no divergence is possible).
 * If it failed, the debug mode would be a threads-only check while the
 * mismatches it is for hang or corrupt sums in MPI jobs. */
#define _POSIX_C_SOURCE 200809L
#include "fingerprint_cases.h"
#include "parallel/rank_sum.h"

/* A rank-order sum (DDP's gradient all-reduce) of another count on rank 1. */
static void rank_sum_mismatch_is_caught(px_comm *c) {
  const int r = px_comm_rank(c);
  pxr_ctx x;
  CHECK_OK(pxr_init(&x, c));
  CHECK(px_comm_backend_of(c) != PX_COMM_MPI || x.p2p != NULL, "rank-order sums: not made of messages here");
  px_comm_set_label(c, "DDP step 9, bucket 0");
  float buf[300];
  for (int i = 0; i < 300; i++) buf[i] = 1;
  pxr_sum *s = NULL;
  CHECK_OK(pxr_allreduce(&x, buf, 300, &s));  // matching: passes and sums
  if (s) CHECK_OK(pxr_wait(s));
  CHECK(buf[0] == (float)px_comm_size(c) && buf[299] == (float)px_comm_size(c), "rank-order sum: %g", (double)buf[0]);
  s = NULL;
  px_status st = pxr_allreduce(&x, buf, r == 1 ? 100 : 200, &s);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", px_last_error());
  CHECK(st == PX_ERR_COMM && s == NULL, "rank-order sum: rank %d got %s (%s)", r, px_status_name(st), msg);
  fp_expect_in(msg, "rank 0 iallreduce 200 F32 SUM 'DDP step 9, bucket 0' at parallel/rank_sum.c:", r, "rank sum");
  fp_expect_in(msg, "rank 1 iallreduce 100 F32 SUM 'DDP step 9, bucket 0' at parallel/rank_sum.c:", r, "rank sum");
  if (s) CHECK_OK(pxr_wait(s));
  fp_all_failed(c, st, "rank sum");
  pxr_fini(&x);
}

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  fp_matched_collectives_pass(c);
  if (px_comm_size(c) >= 2) {
    fp_skipped_collective_is_caught(c, 1);
    fp_skipped_collective_is_caught(c, 0);
    fp_size_mismatch_is_caught(c);
  }
  if (px_comm_size(c) >= 3) rank_sum_mismatch_is_caught(c);
  // Failed checks print on their rank; every rank's verdict is the exit code.
  return 0;
}

int main(void) {
  setenv("PX_DEBUG_COLLECTIVES", "1", 1);
  int code = 0;
  CHECK_OK(px_comm_run(1, run_all, NULL, &code));
  CHECK(code == 0, "exit code %d", code);
  return px_test_finish("test_collective_fingerprints_catch_divergence_mpi");
}
