/* Claim: with the debug mode turned on by px_comm_set_debug_collectives on
 * every rank, a rank that passes another count to a collective is caught
 * before the collective runs, on 2, 3 and 4 ranks: every rank returns
 * PX_ERR_COMM with one message naming both sides ("rank 0 allreduce 1024
 * F32 SUM '<label>' at <file>:<line>; rank 1 allreduce 512 ..."), the
 * buffers are untouched (no partial or wrong sum), and the same holds for
 * an asynchronous all-gather whose last rank gathers 5 doubles where the
 * others gather 4.  Matching collectives of every kind pass.
 * If it failed, mismatched counts would sum mismatched buffers silently (or
 * read past a rank's buffer), as they do without the check. */
#define _POSIX_C_SOURCE 200809L
#include "fingerprint_cases.h"

static int size_main(px_comm *c, void *arg) {
  (void)arg;
  CHECK(!px_comm_debug_collectives(c), "the mode is on before it was asked for");
  px_comm_set_debug_collectives(c, true);
  fp_matched_collectives_pass(c);
  fp_size_mismatch_is_caught(c);
  return 0;
}

int main(void) {
  unsetenv("PX_DEBUG_COLLECTIVES");
  for (int n = 2; n <= 4; n++) {
    int code = -1;
    CHECK_OK(px_comm_run(n, size_main, NULL, &code));
    CHECK(code == 0, "%d ranks: exit code %d", n, code);
  }
  return px_test_finish("test_collective_fingerprints_catch_a_size_mismatch");
}
