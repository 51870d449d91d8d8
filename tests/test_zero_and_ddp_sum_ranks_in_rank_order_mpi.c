/* Claim: under MPI with 2, 3 and 4 processes (ctest: _np2, _np3, _np4),
 * DDP's all-reduce and ZeRO's reduce-scatter (stages 1, 2, 3) give every
 * gradient element the bits of the serial sum in rank order,
 * ((g_0 + g_1) + g_2) + ..., times 1/N: one summation order, so the stages
 * can equal DDP to the bit (src/parallel/rank_sum.h).  The gradients are
 * chosen so that the order shows: values over 20 binades, whose sum in
 * reversed rank order differs from the rank-order sum in many elements
 * (checked, so the test can tell orders apart from 3 ranks on).  Buckets of
 * 64 B to 64 KiB, and a layer whose size is no multiple of N: 4099
 * gradients (pieces shorter than one message of rank_sum.c), and 1200007
 * (pieces of 300-600 K floats: several messages, whose receives reuse the
 * storage of sends still in flight).  If it fails, DDP and ZeRO no longer
 * sum alike (Open MPI's ring and its reduce-scatter do not), or a piece or
 * a message lands in the wrong place. */
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

static int OUT; /* Linear(1, OUT) without bias: its weight's gradient is dY itself */

/* Rank r's gradient of element i. */
static float grad_of(int r, int i) {
  px_rng g = px_rng_make(77, (uint64_t)(r * OUT + i));
  float v = px_rng_uniform(&g) - 0.5f;
  return v * (float)(1u << px_rng_below(&g, 20));
}

/* One backward whose weight gradient is this rank's grad_of(rank, .). */
static void backward(px_model *md, int rank) {
  float one = 1.0f;
  px_tensor X = px_tensor_f32(&one, 2, 1, 1, 0, 0), Y;
  CHECK_OK(px_model_forward(md, &X, &Y));
  px_tensor dY = Y;
  dY.data = px_model_scratch(md, OUT);
  for (int i = 0; i < OUT; i++) px_f32(&dY)[i] = grad_of(rank, i);
  CHECK_OK(px_model_backward(md, &dY, NULL));
}

static void run_one(px_comm *c, int out) {
  OUT = out;
  const int rank = px_comm_rank(c), N = px_comm_size(c);
  float *want = malloc(OUT * sizeof *want);
  int reversed_differs = 0;
  for (int i = 0; i < OUT; i++) {
    float s = grad_of(0, i), rev = grad_of(N - 1, i);
    for (int r = 1; r < N; r++) s += grad_of(r, i);
    for (int r = N - 2; r >= 0; r--) rev += grad_of(r, i);
    reversed_differs += s != rev;
    want[i] = s * (1.0f / (float)N);
  }
  if (N >= 3)
    CHECK(reversed_differs > OUT / 100, "only %d of %d sums depend on the order: the test cannot tell orders apart",
          reversed_differs, OUT);
  // A bucket never splits a parameter: the large layer is one bucket at any size.
  static const size_t buckets[] = {64, 4096, 65536};
  for (int b = 0; b < (OUT > 65536 ? 1 : 3); b++) {
    // DDP.
    px_model *md;
    CHECK_OK(px_model_create(&md, px_linear(1, OUT, false), 3));
    px_ddp_opts o = PX_DDP_DEFAULTS;
    o.bucket_bytes = o.first_bucket_bytes = buckets[b];
    px_ddp *d;
    CHECK_OK(px_ddp_wrap(&d, md, c, &o));
    px_model_zero_grad(md);
    backward(md, rank);
    CHECK_OK(px_ddp_sync(d));
    int bad = 0;
    for (int i = 0; i < OUT; i++) bad += memcmp(&md->grad_data[i], &want[i], sizeof(float)) != 0;
    CHECK(bad == 0, "rank %d/%d DDP, %zu B buckets: %d of %d gradients differ from the rank-order sum", rank, N,
          buckets[b], bad, OUT);
    px_ddp_free(d);
    px_model_free(md);
    // ZeRO: this rank's pieces of the averaged gradient.
    for (int stage = 1; stage <= 3; stage++) {
      CHECK_OK(px_model_create(&md, px_linear(1, OUT, false), 3));
      px_zero_opts zo = PX_ZERO_DEFAULTS;
      zo.stage = stage;
      zo.bucket_bytes = zo.first_bucket_bytes = buckets[b];
      px_zero *z;
      CHECK_OK(px_zero_wrap(&z, md, c, &zo));
      px_zero_zero_grad(z);
      backward(md, rank);
      CHECK_OK(px_zero_sync(z));
      const int n = px_zero_segments(z, NULL, NULL, NULL, 0);
      size_t *v = malloc(3 * (size_t)(n + 1) * sizeof *v);
      px_zero_segments(z, v, v + n, v + 2 * n, n);
      float *shard;
      px_zero_shard(z, NULL, &shard, NULL);
      bad = 0;
      size_t seen = 0;
      for (int k = 0; k < n; k++)
        for (size_t e = 0; e < v[2 * n + k]; e++, seen++) {
          const float *got = stage == 1 ? md->grad_data + v[k] + e : shard + v[n + k] + e;
          bad += memcmp(got, &want[v[k] + e], sizeof(float)) != 0;
        }
      CHECK(bad == 0 && seen > 0,
            "rank %d/%d ZeRO-%d, %zu B buckets: %d of %zu gradients of its pieces differ "
            "from the rank-order sum",
            rank, N, stage, buckets[b], bad, seen);
      free(v);
      CHECK_OK(px_zero_free(z));
      px_model_free(md);
    }
  }
  if (rank == 0)
    printf("%d ranks, %d gradients: DDP and ZeRO 1-3 give the rank-order sums (%d differ in reversed order)\n", N, OUT,
           reversed_differs);
  free(want);
}

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 120);
  run_one(c, 4099);
  run_one(c, 1200007);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, run_all, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_zero_and_ddp_sum_ranks_in_rank_order_mpi");
}
