/* Claim: as test_tp_gpt_equals_single_process.c, under mpiexec, with and
 * without sequence parallelism: with 1
 * process tp = 1 (the layers with a group of one), with 2 processes tp = 2,
 * with 4 processes tp = 4 and dp 2 × tp 2 (DDP over the dp communicator of
 * the mesh): 20 AdamW steps with dropout and clipping give the single
 * process's losses, gradient norms and parameter boxes to 1e-5 relative.
 * If this fails under MPI but not threads, the mesh's sub-communicators or
 * the MPI collectives the tp layers use do not hold what they should. */
#include "tp_gpt_cases.h"

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 120);
  const int n = px_comm_size(c);
  for (int sp = 0; sp <= 1; sp++) {
    tpg_case(c, n, 0, sp, true);  // tp = world
    if (n == 4)                   // dp 2 × tp 2: DDP, ZeRO-1, ZeRO-2 over dp
      for (int stage = 0; stage <= 2; stage++) tpg_case(c, 2, stage, sp, true);
  }
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, run_all, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_tp_gpt_equals_single_process_mpi");
}
