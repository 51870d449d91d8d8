/* Claim: under the threads backend with N = 2, 3 and 4 ranks, ZeRO stages
 * 1, 2 and 3 train an MLP (157 parameters: no multiple of N, a layer of 2
 * elements and a bias of 1, fewer than the ranks), a CNN with batch norm and
 * a small GPT whose head is tied to its embedding to the parameters DDP
 * gives after 20 steps, with SGD + momentum, Adam, and AdamW with gradient
 * clipping: per tensor within 1e-6 relative, and to the bit where nothing
 * changes the summation order (no clipping: the threads backend sums ranks
 * in rank order for all-reduce and reduce-scatter alike).  Also gradient
 * accumulation with no_sync, and stages 2-3 with a 2 ms sleep before every
 * collective.  If it fails, sharding changes what training computes: a
 * piece mapped to the wrong elements, padding read as data, a gradient
 * reduced before the tied head's share is in, or a missing wait. */
#include "zero_cases.h"

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 120);
  if (px_comm_rank(c) == 0)
    printf("%d ranks, backend %s\n", px_comm_size(c), px_comm_backend_name(px_comm_backend_of(c)));
  for (int kind = MODEL_MLP; kind <= MODEL_GPT; kind++) {
    zall_stages(c, kind, OPT_SGD, 0, true);
    zall_stages(c, kind, OPT_ADAM, 0, true);
    zall_stages(c, kind, OPT_ADAMW, 0.05f, true);
  }
  zaccumulation(c, MODEL_MLP, true);
  zaccumulation(c, MODEL_GPT, true);
  zdelayed(c, MODEL_GPT, true);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  for (int n = 2; n <= 4; n++) {
    int code = 0;
    CHECK_OK(px_comm_run(n, run_all, NULL, &code));
    CHECK(code == 0, "%d threads: a rank failed (%d)", n, code);
  }
  printf("largest relative difference from DDP in any case: %.2e (||a - b|| / ||b|| per tensor: %.2e)\n", zworst_seen,
         zworst_norm_seen);
  return px_test_finish("test_zero_equals_ddp");
}
