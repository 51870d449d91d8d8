/* Claim: the ZeRO equivalences of test_zero_equals_ddp hold under MPI with
 * 2, 3 and 4 processes (ctest runs this as _np2, _np3, _np4): stages 1-3
 * give DDP's parameters within 1e-6 relative per tensor, and to the bit
 * where the test of the threads backend asks for it (no clipping, no
 * accumulation in the shard): DDP's all-reduce and ZeRO's reduce-scatter
 * add the ranks in rank order under MPI too (src/parallel/rank_sum.h).  If
 * only the np3/np4 runs fail, the two reductions sum in different orders
 * again (Open MPI's own collectives do). */
#include "zero_cases.h"

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 120);
  const int world = px_comm_size(c);
  const bool exact = true;
  if (px_comm_rank(c) == 0) printf("%d ranks, backend %s\n", world, px_comm_backend_name(px_comm_backend_of(c)));
  for (int kind = MODEL_MLP; kind <= MODEL_GPT; kind++) {
    zall_stages(c, kind, OPT_SGD, 0, exact);
    zall_stages(c, kind, OPT_ADAM, 0, exact);
    zall_stages(c, kind, OPT_ADAMW, 0.05f, exact);
  }
  zaccumulation(c, MODEL_MLP, exact);
  zaccumulation(c, MODEL_GPT, exact);
  zdelayed(c, MODEL_MLP, exact);
  if (px_comm_rank(c) == 0)
    printf("largest relative difference from DDP in any case: %.2e (||a - b|| / ||b|| per tensor: %.2e)\n", zworst_seen,
           zworst_norm_seen);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, run_all, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_zero_equals_ddp_mpi");
}
