/* Claim: under the threads backend with N = 1, 2, 4 ranks, DDP training
 * (N ranks × batch B) gives the parameters of one process on the N·B batch
 * to 1e-5 relative, for buckets of one parameter, 1 MiB and 25 MiB; gradient
 * accumulation with no_sync equals the big batch; join handles uneven
 * inputs; mismatched models are refused at wrap.  If it fails, data-parallel
 * training does not compute what the user's single-process run computes. */
#include "ddp_cases.h"

int main(void) {
  for (int n = 1; n <= 4; n *= 2) {
    int code = 0;
    CHECK_OK(px_comm_run(n, run_all, NULL, &code));
    CHECK(code == 0, "%d threads: a rank failed (%d)", n, code);
  }
  return px_test_finish("test_ddp_equals_single_process");
}
