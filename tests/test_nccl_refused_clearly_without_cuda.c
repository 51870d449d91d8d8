/* Claim: where plexus has no GPU to give NCCL (a build without CUDA, or no
 * device visible), px_comm_nccl_create returns PX_ERR_UNSUPPORTED with a
 * message that says why, leaves *out NULL, and the bootstrap still works;
 * px_comm_nccl_available() says false.  On a machine with a GPU it exits 77
 * (skipped: the NCCL tests cover it there).  If it fails, asking for NCCL
 * on a CPU machine crashes or hangs instead of saying what is missing. */
#include "px_test.h"

#include <string.h>

int main(void) {
  if (px_comm_nccl_available()) {
    printf("test_nccl_refused_clearly_without_cuda: a GPU is available, skipped\n");
    return 77;
  }
  px_comm *self, *c = (px_comm *)1;
  CHECK_OK(px_comm_init_self(&self));
  px_status st = px_comm_nccl_create(self, &c);
  const char *msg = px_last_error();
  printf("px_comm_nccl_create: %s: %s\n", px_status_name(st), msg);
  CHECK(st == PX_ERR_UNSUPPORTED, "expected PX_ERR_UNSUPPORTED, got %s", px_status_name(st));
  CHECK(c == NULL, "*out was not cleared");
  CHECK(strstr(msg, "CUDA") != NULL, "the message does not say CUDA is missing: \"%s\"", msg);
  // The bootstrap is untouched.
  int32_t v = 3;
  CHECK_OK(px_comm_allreduce(self, &v, 1, PX_I32, PX_SUM));
  CHECK(v == 3, "the self communicator broke: %d", (int)v);
  CHECK(px_comm_nccl_create(self, NULL) != PX_OK, "a NULL out was accepted");
  px_comm_free(self);
  return px_test_finish("test_nccl_refused_clearly_without_cuda");
}
