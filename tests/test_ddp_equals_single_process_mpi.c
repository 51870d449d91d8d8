/* Claim: the DDP equivalences of test_ddp_equals_single_process hold under
 * MPI with 1, 2 and 4 processes (ctest runs this as _np1, _np2, _np4). */
#include "ddp_cases.h"

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, run_all, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_ddp_equals_single_process_mpi");
}
