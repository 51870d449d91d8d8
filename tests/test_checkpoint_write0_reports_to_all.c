/* Claim: px_checkpoint_write0 under the threads backend (3 ranks) writes
 * rank 0's state once, gives every rank the checkpoint's path, rotates, and
 * gives every rank the same status and message when the write fails (an
 * unwritable directory, no items).  If it failed, ranks would race to write
 * one checkpoint, or some would go on believing in a checkpoint that was
 * never written while others stop. */
#include "checkpoint_write0_cases.h"

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(3, write0_cases, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_checkpoint_write0_reports_to_all");
}
