/* Claim: the px_checkpoint_write0 claims of
 * test_checkpoint_write0_reports_to_all hold under MPI with 1, 2 and 4
 * processes (ctest runs this as _np1, _np2, _np4): rank 0's state written
 * once, the same status and message on every rank, also on failure. */
#include "checkpoint_write0_cases.h"

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, write0_cases, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_checkpoint_write0_reports_to_all_mpi");
}
