/* Claim: under MPI (one process a rank, PX_DEBUG_COLLECTIVES=1 read from
 * the environment when the world communicator is made), the fingerprints
 * catch a skipped collective and a changed count exactly as under threads:
 * every rank returns PX_ERR_COMM with one message naming rank 0's side and
 * the diverging rank's (operation, count, dtype, label, file:line), no rank
 * runs the call, and matching collectives of every kind (split included)
 * pass.  With one process only the matching ones run (no divergence is
 * possible).
 * If it failed, the debug mode would be a threads-only check while the
 * mismatches it is for hang or corrupt sums in MPI jobs. */
#define _POSIX_C_SOURCE 200809L
#include "fingerprint_cases.h"

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  fp_matched_collectives_pass(c);
  if (px_comm_size(c) >= 2) {
    fp_skipped_collective_is_caught(c, 1);
    fp_skipped_collective_is_caught(c, 0);
    fp_size_mismatch_is_caught(c);
  }
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
