/* Claim: with two GPUs driven by two threads (the threads backend as the
 * bootstrap, one GPU per rank, as FluxDistributed.jl), px_comm_nccl_create
 * gives ranks 0 and 1 of 2; the collectives on device buffers give the
 * values computed on the host (sums, averages, minima and maxima of both
 * ranks, broadcast from rank 1, allgather, reduce_scatter, split into two
 * worlds of one); DDP over NCCL of a model on the GPU, each rank with half
 * of the batch, broadcasts rank 0's parameters at wrap and gives the
 * gradients of one CPU process over the whole batch (1e-5 relative), and
 * an SGD step on the device its parameters (nccl_cases.h).  Exits 77
 * (skipped) with fewer than two GPUs.  If it fails, multi-GPU training does
 * not compute what one process computes. */
#include "nccl_cases.h"

static int rank_main(px_comm *boot, void *arg) {
  (void)arg;
  const int rank = px_comm_rank(boot);
  CHECK_OK(px_cuda_init(rank));
  px_comm *c;
  CHECK_OK(px_comm_nccl_create(boot, &c));
  CHECK(px_comm_rank(c) == rank && px_comm_size(c) == px_comm_size(boot), "rank %d of %d", px_comm_rank(c),
        px_comm_size(c));
  case_collectives(c);
  case_ddp(c, boot);
  px_comm_free(c);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  const int gpus = px_cuda_device_count();
  if (gpus < 2) {
    printf("test_nccl_two_ranks_ddp_equals_single_process: %d CUDA device(s), needs 2: skipped\n", gpus);
    return 77;
  }
  int code = 0;
  CHECK_OK(px_comm_run(2, rank_main, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_nccl_two_ranks_ddp_equals_single_process");
}
