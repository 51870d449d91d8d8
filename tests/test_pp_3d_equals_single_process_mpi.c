/* Claim: under mpiexec, pipeline × data (× tensor) parallelism trains as
 * one process on the whole global batch (tests/pp3d_cases.h): with 4
 * processes dp 2 × pp 2 (the MLP, 1F1B over 4 micro-batches, clipping; and
 * ZeRO 1 over dp against DDP over dp), with 8 dp 2 × tp 2 × pp 2 (the
 * tensor-parallel GPT, 1F1B), to 1e-5 relative over 20 steps.  Other world
 * sizes (one process: without MPI) run the degenerate 1 × 1 × 1 mesh.
 * If this fails and the threads twin passes: the dp, tp and pp
 * communicators' messages cross under MPI (tags, or a collective on one
 * group while a peer waits on another), or the rank-order sums differ. */
#include "pp3d_cases.h"

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 120);
  const int n = px_comm_size(c);
  if (n == 4) {
    p3d_run(c, &(p3d_case){2, 1, 2, PX_PP_1F1B, 4, 1, false, 0, 0.3f});
    p3d_run(c, &(p3d_case){2, 1, 2, PX_PP_1F1B, 4, 1, false, 1, 0.3f});
  } else if (n == 8) {
    p3d_run(c, &(p3d_case){2, 2, 2, PX_PP_1F1B, 4, 1, true, 0, PPG_CLIP});
  } else {
    p3d_run(c, &(p3d_case){n, 1, 1, PX_PP_1F1B, 4, 1, false, 0, 0.3f});
  }
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, run, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_pp_3d_equals_single_process_mpi");
}
