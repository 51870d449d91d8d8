/* Claim: on one GPU, an NCCL communicator made over the self backend
 * (px_comm_nccl_create) has rank 0 of 1 and backend "nccl"; allreduce (SUM,
 * AVG, MIN, MAX; f32, f64, i64, bf16), broadcast, allgather and reduce_scatter on
 * device buffers give the values computed on the host; a collective started
 * right after a kernel on the compute stream sees that kernel's output, and
 * a kernel after the wait sees the collective's; host buffers work (staged);
 * split and barrier work; point-to-point is refused.  DDP over it, with a
 * model on the GPU and several buckets, gives exactly the gradients of the
 * same model without DDP, and those of the CPU to 1e-5 (nccl_cases.h).
 * Exits 77 (skipped) without a GPU.  The watchdog has its own test
 * (test_nccl_watchdog_aborts_a_stalled_collective).  If it fails, the
 * GPUs' data-parallel path does not compute what the CPU's does. */
#include "nccl_cases.h"

int main(void) {
  if (px_cuda_device_count() == 0) {
    printf("test_nccl_world_of_one_collectives_and_ddp: no CUDA device, skipped\n");
    return 77;
  }
  CHECK_OK(px_cuda_init(0));
  px_comm *self, *c;
  CHECK_OK(px_comm_init_self(&self));
  px_comm_set_timeout(self, 120);
  CHECK_OK(px_comm_nccl_create(self, &c));
  CHECK(px_comm_rank(c) == 0 && px_comm_size(c) == 1, "rank %d of %d", px_comm_rank(c), px_comm_size(c));
  CHECK(px_comm_backend_of(c) == PX_COMM_NCCL && strcmp(px_comm_backend_name(px_comm_backend_of(c)), "nccl") == 0,
        "backend %s", px_comm_backend_name(px_comm_backend_of(c)));
  CHECK(px_comm_timeout(c) == 120, "the timeout was not inherited: %g", px_comm_timeout(c));
  CHECK(px_comm_nccl_available(), "px_comm_nccl_available() is false on a GPU");
  // An NCCL communicator is not a bootstrap.
  px_comm *again = (px_comm *)1;
  CHECK(px_comm_nccl_create(c, &again) == PX_ERR_INVALID && again == NULL, "NCCL over NCCL was accepted");
  case_collectives(c);
  case_ddp(c, self);
  px_comm_free(c);
  px_comm_free(self);
  return px_test_finish("test_nccl_world_of_one_collectives_and_ddp");
}
