/* Claim: under MPI, DDP's bucket all-reduces move while backward computes:
 * the first bucket (the last layer) is complete before px_model_backward
 * returns, not merely started.  ctest runs this under mpiexec -n 1, 2 and 4
 * (_np1/2/4; without MPI, a world of one).
 *
 * If it failed, Open MPI (which moves a non-blocking collective only inside
 * MPI calls) would leave every bucket standing until px_ddp_sync waits for
 * it: the "overlapped" all-reduce would run after backward, and data
 * parallel training would pay for all its communication.
 *
 * Backward here runs 8 layers of 512×512 at batch 128 after bucket 0
 * starts (about 0.5 GFLOP, tens of ms), while bucket 0 is 1 MiB.  On a
 * loaded machine a peer can be descheduled for a whole backward, so the
 * claim is asked of at least one step in six, per rank: without progress
 * during backward it holds in none (checked by removing DDP's
 * progress_buckets call: 0 of 6). */
#include "px_test.h"

enum { LAYERS = 8, WIDTH = 512, BATCH = 128, STEPS = 6 };

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_module *m = px_chain();
  for (int i = 0; i < LAYERS; i++) {
    px_chain_add(m, px_linear(WIDTH, WIDTH, true));
    px_chain_add(m, px_tanh());
  }
  px_model *md;
  CHECK_OK(px_model_create(&md, m, 1));
  px_ddp_opts o = PX_DDP_DEFAULTS;
  o.bucket_bytes = o.first_bucket_bytes = (size_t)WIDTH * (WIDTH + 1) * sizeof(float);  // a layer a bucket
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, md, c, &o));
  CHECK(px_ddp_bucket_count(d) == LAYERS, "%d buckets", px_ddp_bucket_count(d));
  static float x[BATCH * WIDTH];
  for (int i = 0; i < BATCH * WIDTH; i++) x[i] = (float)((i * 7919 + px_comm_rank(c)) % 1000) / 1000.0f - 0.5f;
  px_tensor X = px_tensor_f32(x, 2, BATCH, WIDTH, 0, 0), Y;
  int hidden = 0;
  for (int step = 0; step < STEPS; step++) {
    px_model_zero_grad(md);
    CHECK_OK(px_model_forward(md, &X, &Y));
    px_tensor dY = Y;
    dY.data = px_model_scratch(md, BATCH * WIDTH);
    px_fill(px_f32(&dY), BATCH * WIDTH, 1e-3f);
    CHECK_OK(px_model_backward(md, &dY, NULL));
    double backward_end = px_time_now();
    CHECK_OK(px_ddp_sync(d));
    double started = px_ddp_bucket_start_time(d, 0), done = px_ddp_bucket_done_time(d, 0);
    CHECK(done >= started && started > 0, "bucket 0 done at %.6f, started at %.6f", done, started);
    if (done < backward_end) hidden++;
    printf("rank %d step %d: bucket 0 took %.3f ms, done %.3f ms %s backward ended\n", px_comm_rank(c), step,
           1e3 * (done - started), 1e3 * (done > backward_end ? done - backward_end : backward_end - done),
           done > backward_end ? "after" : "before");
  }
  CHECK(hidden >= 1, "rank %d: bucket 0 completed before backward ended in %d of %d steps", px_comm_rank(c), hidden,
        STEPS);
  px_ddp_free(d);
  px_model_free(md);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, run, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_ddp_buckets_complete_during_backward_mpi");
}
