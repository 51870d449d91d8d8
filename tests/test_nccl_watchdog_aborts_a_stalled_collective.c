/* Claim: on one GPU, an NCCL collective that cannot complete within the
 * communicator's timeout (here its stream is held up behind a 3 s host
 * function on the compute stream, with a timeout of 0.5 s) makes
 * px_request_wait return PX_ERR_TIMEOUT after about the timeout, not after
 * the stall, with a message naming the collective, its element count and
 * the label; the NCCL communicator is aborted, so later collectives fail
 * with PX_ERR_COMM at once instead of hanging.  A blocking collective with
 * a stalled stream times out the same way.  Exits 77 (skipped) without a
 * GPU.  If it fails, a stalled GPU job hangs silently. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void CUDART_CB stall(void *arg) {
  (void)arg;
  sleep(3);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void case_timeout(bool blocking) {
  px_comm *self, *c;
  CHECK_OK(px_comm_init_self(&self));
  CHECK_OK(px_comm_nccl_create(self, &c));
  px_comm_set_timeout(c, 0.5);
  px_comm_set_label(c, "step 7, bucket 2");
  const size_t n = 1000;
  float *d = px_cuda_malloc(n * sizeof *d);
  CHECK(d != NULL, "px_cuda_malloc");
  CHECK_OK(px_cuda_fill(d, n, 1.0f));
  CHECK(cudaLaunchHostFunc((cudaStream_t)px_cuda_compute_stream(), stall, NULL) == cudaSuccess, "cudaLaunchHostFunc");
  const double t0 = now();
  px_status st;
  if (blocking) {
    st = px_comm_allreduce(c, d, n, PX_F32, PX_SUM);
  } else {
    px_request *q;
    CHECK_OK(px_comm_iallreduce(c, d, n, PX_F32, PX_SUM, &q));
    st = px_request_wait(q);
  }
  const double waited = now() - t0;
  const char *msg = px_last_error();
  printf("%s: %s after %.2f s: %s\n", blocking ? "allreduce" : "iallreduce + wait", px_status_name(st), waited, msg);
  CHECK(st == PX_ERR_TIMEOUT, "expected PX_ERR_TIMEOUT, got %s", px_status_name(st));
  CHECK(waited < 2.5, "the wait took %.2f s: the watchdog did not end it at 0.5 s", waited);
  CHECK(strstr(msg, "allreduce") && strstr(msg, "1000 elements") && strstr(msg, "step 7, bucket 2"),
        "the message does not name the collective, the count and the label: \"%s\"", msg);
  st = px_comm_allreduce(c, d, n, PX_F32, PX_SUM);
  CHECK(st == PX_ERR_COMM && strstr(px_last_error(), "aborted"), "after the abort: %s: %s", px_status_name(st),
        px_last_error());
  // The stall ends; the aborted collective's kernel may then report an
  // error on the stream, which is not what this test is about.
  px_status end = px_cuda_sync();
  printf("  stream after the stall: %s\n", end == PX_OK ? "ok" : px_last_error());
  px_cuda_free(d);
  px_comm_free(c);
  px_comm_free(self);
}

int main(void) {
  if (px_cuda_device_count() == 0) {
    printf("test_nccl_watchdog_aborts_a_stalled_collective: no CUDA device, skipped\n");
    return 77;
  }
  CHECK_OK(px_cuda_init(0));
  case_timeout(false);
  case_timeout(true);
  return px_test_finish("test_nccl_watchdog_aborts_a_stalled_collective");
}
