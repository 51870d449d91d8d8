/* Claim: DDP starts a bucket's all-reduce while backward is still running:
 * on a model with several buckets, the first bucket (the last layers)
 * starts before px_model_backward returns, and buckets start in order.
 * If it failed, communication would wait for the whole backward pass and
 * nothing would overlap. */
#include "px_test.h"

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_module *m = px_chain();
  for (int i = 0; i < 6; i++) {
    px_chain_add(m, px_linear(256, 256, true));
    px_chain_add(m, px_tanh());
  }
  px_model *md;
  CHECK_OK(px_model_create(&md, m, 1));
  px_ddp_opts o = PX_DDP_DEFAULTS;
  o.bucket_bytes = o.first_bucket_bytes = 256 * 257 * sizeof(float);  // one layer per bucket
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, md, c, &o));
  CHECK(px_ddp_bucket_count(d) == 6, "%d buckets", px_ddp_bucket_count(d));
  // Bucket 0 is the end of the flat buffer: the last layer.
  size_t off, cnt;
  px_ddp_bucket_range(d, 0, &off, &cnt);
  CHECK(off + cnt == md->n_param_elems, "bucket 0 ends the buffer");
  float *x = malloc(64 * 256 * sizeof *x);  // one per rank: ranks are threads
  if (!x) return 1;
  for (int i = 0; i < 64 * 256; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
  px_tensor X = px_tensor_f32(x, 2, 64, 256, 0, 0), Y;
  int overlapped = 0;
  for (int step = 0; step < 3; step++) {
    px_model_zero_grad(md);
    CHECK_OK(px_model_forward(md, &X, &Y));
    px_tensor dY = Y;
    dY.data = px_model_scratch(md, 64 * 256);
    px_fill(px_f32(&dY), 64 * 256, 1e-3f);
    CHECK_OK(px_model_backward(md, &dY, NULL));
    double backward_end = px_time_now();
    CHECK_OK(px_ddp_sync(d));
    for (int b = 1; b < px_ddp_bucket_count(d); b++)
      CHECK(px_ddp_bucket_start_time(d, b) >= px_ddp_bucket_start_time(d, b - 1), "bucket %d before %d", b, b - 1);
    if (px_ddp_bucket_start_time(d, 0) < backward_end) overlapped++;
    if (px_comm_rank(c) == 0)
      printf("step %d: bucket 0 started %.3f ms before backward ended\n", step,
             1e3 * (backward_end - px_ddp_bucket_start_time(d, 0)));
  }
  CHECK(overlapped == 3, "rank %d: bucket 0 started before backward ended in %d of 3 steps", px_comm_rank(c),
        overlapped);
  px_ddp_free(d);
  free(x);
  px_model_free(md);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(2, run, NULL, &code));
  CHECK(code == 0, "a rank failed");
  return px_test_finish("test_ddp_overlaps_allreduce_with_backward");
}
