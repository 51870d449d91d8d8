/* nccl_cases.h — NCCL claims written once over px_comm, for any world size
 * (one GPU per rank, the rank's thread with px_cuda_init(rank) done): the
 * collectives on device buffers give the values computed on the host, and
 * DDP over NCCL of a model on the GPU gives one process's gradients and
 * parameters.  Used by the world-of-one test and the two-GPU test. */
#ifndef PX_NCCL_CASES_H
#define PX_NCCL_CASES_H

#include "px_test.h"
#include "tensor/bf16.h"
#include "tensor/cuda/px_cuda.h"

#include <stdint.h>
#include <string.h>

/* The model's move to the GPU (nn.h, issue 15; declared here until it lands). */
px_status px_model_to_device(px_model *m, px_device device, int gpu);

enum { NB = 4 /* samples per rank */ };

static void *dmalloc(size_t bytes) {
  void *d = px_cuda_malloc(bytes ? bytes : 1);
  if (!d) {
    fprintf(stderr, "px_cuda_malloc: %s\n", px_last_error());
    exit(1);
  }
  return d;
}

/* Element i of rank r's contribution: small integers and halves, so every
 * sum below is exact in float and the same in any order. */
static float val(int r, size_t i) { return (float)((int)(i % 17) - 8 + 3 * r) * 0.5f; }

static void case_collectives(px_comm *c) {
  const int rank = px_comm_rank(c), N = px_comm_size(c);
  const size_t n = 1000;
  float *h = malloc(n * (size_t)N * sizeof *h), *want = malloc(n * (size_t)N * sizeof *want);
  float *d = dmalloc(n * (size_t)N * sizeof *d), *d2 = dmalloc(n * (size_t)N * sizeof *d2);

  // allreduce SUM, AVG, MIN, MAX (f32)
  const px_reduce_op ops[] = {PX_SUM, PX_AVG, PX_MIN, PX_MAX};
  const char *op_names[] = {"SUM", "AVG", "MIN", "MAX"};
  for (int k = 0; k < 4; k++) {
    for (size_t i = 0; i < n; i++) h[i] = val(rank, i);
    CHECK_OK(px_cuda_to_device(d, h, n * sizeof *h));
    CHECK_OK(px_comm_allreduce(c, d, n, PX_F32, ops[k]));
    CHECK_OK(px_cuda_to_host(h, d, n * sizeof *h));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
      float s = 0, lo = val(0, i), hi = val(0, i);
      for (int r = 0; r < N; r++) {
        s += val(r, i);
        lo = fminf(lo, val(r, i));
        hi = fmaxf(hi, val(r, i));
      }
      float w = ops[k] == PX_SUM ? s : ops[k] == PX_AVG ? s / (float)N : ops[k] == PX_MIN ? lo : hi;
      bad += h[i] != w;
    }
    CHECK(bad == 0, "rank %d: allreduce %s: %zu of %zu elements wrong", rank, op_names[k], bad, n);
  }

  // allreduce SUM of int64 and double
  {
    int64_t *hi = malloc(n * sizeof *hi);
    int64_t *di = dmalloc(n * sizeof *di);
    for (size_t i = 0; i < n; i++) hi[i] = (int64_t)i * 1000000007LL + rank;
    CHECK_OK(px_cuda_to_device(di, hi, n * sizeof *hi));
    CHECK_OK(px_comm_allreduce(c, di, n, PX_I64, PX_SUM));
    CHECK_OK(px_cuda_to_host(hi, di, n * sizeof *hi));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += hi[i] != (int64_t)i * 1000000007LL * N + (int64_t)N * (N - 1) / 2;
    CHECK(bad == 0, "rank %d: allreduce I64 SUM: %zu wrong", rank, bad);
    double *hd = malloc(n * sizeof *hd);
    double *dd = dmalloc(n * sizeof *dd);
    for (size_t i = 0; i < n; i++) hd[i] = (double)val(rank, i) * 0.25;
    CHECK_OK(px_cuda_to_device(dd, hd, n * sizeof *hd));
    CHECK_OK(px_comm_allreduce(c, dd, n, PX_F64, PX_SUM));
    CHECK_OK(px_cuda_to_host(hd, dd, n * sizeof *hd));
    bad = 0;
    for (size_t i = 0; i < n; i++) {
      double s = 0;
      for (int r = 0; r < N; r++) s += (double)val(r, i) * 0.25;
      bad += hd[i] != s;
    }
    CHECK(bad == 0, "rank %d: allreduce F64 SUM: %zu wrong", rank, bad);
    free(hi);
    free(hd);
    px_cuda_free(di);
    px_cuda_free(dd);
  }

  // allreduce SUM of bf16 (mixed precision's optional bf16 reduction): the
  // values and their sums have at most 8 significant bits, so exact in bf16
  {
    uint16_t *hb = malloc(n * sizeof *hb);
    uint16_t *db = dmalloc(n * sizeof *db);
    for (size_t i = 0; i < n; i++) {
      float v = val(rank, i);
      uint32_t u;
      memcpy(&u, &v, 4);
      hb[i] = (uint16_t)(u >> 16);
    }
    CHECK_OK(px_cuda_to_device(db, hb, n * sizeof *hb));
    CHECK_OK(px_comm_allreduce(c, db, n, PX_BF16, PX_SUM));
    CHECK_OK(px_cuda_to_host(hb, db, n * sizeof *hb));
    size_t badb = 0;
    for (size_t i = 0; i < n; i++) {
      float s = 0;
      for (int r = 0; r < N; r++) s += val(r, i);
      uint32_t u = (uint32_t)hb[i] << 16;
      float got;
      memcpy(&got, &u, 4);
      badb += got != s;
    }
    CHECK(badb == 0, "rank %d: allreduce BF16 SUM: %zu wrong", rank, badb);
    free(hb);
    px_cuda_free(db);
  }

  // broadcast from the last rank
  for (size_t i = 0; i < n; i++) h[i] = val(rank, i);
  CHECK_OK(px_cuda_to_device(d, h, n * sizeof *h));
  CHECK_OK(px_comm_broadcast(c, d, n, PX_F32, N - 1));
  CHECK_OK(px_cuda_to_host(h, d, n * sizeof *h));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != val(N - 1, i);
  CHECK(bad == 0, "rank %d: broadcast from %d: %zu wrong", rank, N - 1, bad);

  // allgather: rank r's block at r·n
  for (size_t i = 0; i < n; i++) h[i] = val(rank, i);
  CHECK_OK(px_cuda_to_device(d, h, n * sizeof *h));
  CHECK_OK(px_comm_allgather(c, d, d2, n, PX_F32));
  CHECK_OK(px_cuda_to_host(h, d2, n * (size_t)N * sizeof *h));
  bad = 0;
  for (int r = 0; r < N; r++)
    for (size_t i = 0; i < n; i++) bad += h[(size_t)r * n + i] != val(r, i);
  CHECK(bad == 0, "rank %d: allgather: %zu wrong", rank, bad);

  // reduce_scatter: send N blocks (block b of rank r: val(r, b·n + i)); rank gets the sum of block `rank`
  for (size_t i = 0; i < n * (size_t)N; i++) h[i] = val(rank, i);
  CHECK_OK(px_cuda_to_device(d, h, n * (size_t)N * sizeof *h));
  CHECK_OK(px_comm_reduce_scatter(c, d, d2, n, PX_F32, PX_SUM));
  CHECK_OK(px_cuda_to_host(h, d2, n * sizeof *h));
  bad = 0;
  for (size_t i = 0; i < n; i++) {
    float s = 0;
    for (int r = 0; r < N; r++) s += val(r, (size_t)rank * n + i);
    bad += h[i] != s;
  }
  CHECK(bad == 0, "rank %d: reduce_scatter: %zu wrong", rank, bad);

  // Ordering: a fill queued on the compute stream, then at once an
  // iallreduce of the same buffer: the collective sees the filled values.
  CHECK_OK(px_cuda_fill(d, n * (size_t)N, 1.5f));
  px_request *q;
  CHECK_OK(px_comm_iallreduce(c, d, n * (size_t)N, PX_F32, PX_SUM, &q));
  bool done = false;
  CHECK_OK(px_request_test(q, &done));
  CHECK_OK(px_request_wait(q));
  CHECK_OK(px_cuda_scale(d, n * (size_t)N, 2.0f));  // ordered after the collective by the wait
  CHECK_OK(px_cuda_to_host(h, d, n * (size_t)N * sizeof *h));
  bad = 0;
  for (size_t i = 0; i < n * (size_t)N; i++) bad += h[i] != 3.0f * (float)N;
  CHECK(bad == 0, "rank %d: fill, iallreduce, scale on the streams: %zu wrong", rank, bad);

  // Host buffers are staged (the library's small agreements use them).
  int32_t one = rank + 1;
  CHECK_OK(px_comm_allreduce(c, &one, 1, PX_I32, PX_SUM));
  CHECK(one == N * (N + 1) / 2, "rank %d: host allreduce gave %d", rank, (int)one);
  double mean = rank;
  CHECK_OK(px_comm_mean(c, &mean));
  CHECK(mean == (N - 1) / 2.0, "rank %d: px_comm_mean gave %g", rank, mean);
  CHECK_OK(px_comm_barrier(c));

  // split: odd and even ranks; a negative color leaves the rank out
  px_comm *s = NULL;
  CHECK_OK(px_comm_split(c, rank % 2, rank, &s));
  CHECK(s && px_comm_size(s) == (N + 1 - rank % 2) / 2 && px_comm_rank(s) == rank / 2,
        "rank %d: split gave rank %d of %d", rank, px_comm_rank(s), px_comm_size(s));
  if (s) {
    int32_t k = 1;
    CHECK_OK(px_comm_allreduce(s, &k, 1, PX_I32, PX_SUM));
    CHECK(k == px_comm_size(s), "rank %d: allreduce on the split gave %d", rank, (int)k);
    px_comm_free(s);
  }
  s = (px_comm *)1;
  CHECK_OK(px_comm_split(c, -1, 0, &s));
  CHECK(s == NULL, "rank %d: split with color -1 gave a communicator", rank);

  // Point-to-point is refused with a message.
  px_status st = px_comm_send(c, d, 1, PX_F32, 0, 0);
  CHECK(st == PX_ERR_UNSUPPORTED && strstr(px_last_error(), "point-to-point"), "send on NCCL: %s: %s",
        px_status_name(st), px_last_error());

  free(h);
  free(want);
  px_cuda_free(d);
  px_cuda_free(d2);
}

/* ---- DDP over NCCL ------------------------------------------------------------ */

static px_module *mlp(void) {
  return px_chain_of(5, px_linear(3, 32, true), px_tanh(), px_linear(32, 32, true), px_tanh(), px_linear(32, 2, true));
}

static void sample(int i, float *x, float *t) {
  px_rng r = px_rng_make(1000, (uint64_t)i);
  for (int k = 0; k < 3; k++) x[k] = 2.0f * px_rng_uniform(&r) - 1.0f;
  t[0] = x[0] * x[1];
  t[1] = x[2] - x[0];
}

/* Forward and backward of samples [first, first + count) with the mean
 * squared error's gradient 2(y - t)/numel computed on the host, on either
 * device. */
static void grads_of(px_model *md, int first, int count) {
  float *x = malloc((size_t)count * 3 * sizeof *x), *t = malloc((size_t)count * 2 * sizeof *t);
  for (int i = 0; i < count; i++) sample(first + i, x + 3 * i, t + 2 * i);
  const bool gpu = md->device == PX_CUDA;
  float *xd = NULL;
  px_tensor X = px_tensor_f32(x, 2, count, 3, 0, 0);
  if (gpu) {
    xd = dmalloc((size_t)count * 3 * sizeof *xd);
    CHECK_OK(px_cuda_to_device(xd, x, (size_t)count * 3 * sizeof *x));
    X.data = xd;
    X.device = PX_CUDA;
  }
  px_tensor Y;
  CHECK_OK(px_model_forward(md, &X, &Y));
  const size_t ny = (size_t)px_tensor_numel(&Y);
  float *y = malloc(ny * sizeof *y), *dy = malloc(ny * sizeof *dy);
  if (gpu) CHECK_OK(px_cuda_to_host(y, Y.data, ny * sizeof *y));
  else memcpy(y, Y.data, ny * sizeof *y);
  for (size_t i = 0; i < ny; i++) dy[i] = 2.0f * (y[i] - t[i]) / (float)ny;
  px_tensor dY = Y;
  dY.data = px_model_scratch(md, ny);
  CHECK(dY.data != NULL, "no scratch for dY");
  if (gpu) CHECK_OK(px_cuda_to_device(dY.data, dy, ny * sizeof *dy));
  else memcpy(dY.data, dy, ny * sizeof *dy);
  CHECK_OK(px_model_backward(md, &dY, NULL));
  if (gpu) {
    CHECK_OK(px_cuda_sync());
    px_cuda_free(xd);
  }
  free(x);
  free(t);
  free(y);
  free(dy);
}

static double rel_diff(const float *a, const float *b, size_t n) {
  double rms = sqrt(px_sumsq(b, n) / (double)(n ? n : 1));
  return px_max_rel_diff(a, b, n, rms > 0 ? rms : 1e-30);
}

/* Claim: rank r's device model under DDP over NCCL with samples [r·NB,
 * (r+1)·NB) has, after px_ddp_sync, the gradients of one CPU process over
 * all N·NB samples (1e-5 relative), and after an SGD step (momentum) on
 * the device its parameters; with one rank, exactly the gradients of the same device
 * model without DDP.  Wrap broadcasts rank 0's parameters (the ranks'
 * seeds differ).  A device model with a host communicator, and a CPU model
 * with the NCCL one, are refused. */
static void case_ddp(px_comm *c, px_comm *bootstrap) {
  const int rank = px_comm_rank(c), N = px_comm_size(c);
  px_model *md, *ref;
  CHECK_OK(px_model_create(&md, mlp(), 100 + (uint64_t)rank));
  CHECK_OK(px_model_create(&ref, mlp(), 100));

  px_ddp *d = NULL;
  px_status st = px_ddp_wrap(&d, md, c, NULL);  // still on the CPU
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "NCCL"), "CPU model with an NCCL comm: %s: %s",
        px_status_name(st), px_last_error());
  CHECK_OK(px_model_to_device(md, PX_CUDA, px_cuda_current_device()));
  st = px_ddp_wrap(&d, md, bootstrap, NULL);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "NCCL"), "device model with the %s comm: %s: %s",
        px_comm_backend_name(px_comm_backend_of(bootstrap)), px_status_name(st), px_last_error());

  px_ddp_opts opts = PX_DDP_DEFAULTS;
  opts.bucket_bytes = opts.first_bucket_bytes = 4096;  // several buckets
  CHECK_OK(px_ddp_wrap(&d, md, c, &opts));
  CHECK(px_ddp_bucket_count(d) > 1, "expected several buckets, got %d", px_ddp_bucket_count(d));

  CHECK_OK(px_cuda_zero(md->grad_data, md->n_param_elems * sizeof(float)));
  grads_of(md, rank * NB, NB);
  CHECK_OK(px_ddp_sync(d));
  const size_t np = md->n_param_elems;
  float *g = malloc(np * sizeof *g), *p = malloc(np * sizeof *p);
  CHECK_OK(px_cuda_to_host(g, md->grad_data, np * sizeof *g));
  CHECK_OK(px_cuda_to_host(p, md->param_data, np * sizeof *p));

  // The CPU reference over the whole batch.
  px_model_zero_grad(ref);
  grads_of(ref, 0, N * NB);
  double wp = rel_diff(p, ref->param_data, np), wg = rel_diff(g, ref->grad_data, np);
  printf("rank %d/%d: DDP over NCCL: params vs rank 0's %.3g, grads vs one CPU process %.3g\n", rank, N, wp, wg);
  CHECK(wp == 0, "rank %d: the wrap did not broadcast rank 0's parameters (%.3g)", rank, wp);
  CHECK(wg <= 1e-5, "rank %d: DDP gradients differ from one process by %.3g", rank, wg);

  if (N == 1) {  // the same device model without DDP: the same bits
    px_model *plain;
    CHECK_OK(px_model_create(&plain, mlp(), 100));
    CHECK_OK(px_model_to_device(plain, PX_CUDA, px_cuda_current_device()));
    CHECK_OK(px_cuda_zero(plain->grad_data, np * sizeof(float)));
    grads_of(plain, 0, NB);
    float *pg = malloc(np * sizeof *pg);
    CHECK_OK(px_cuda_to_host(pg, plain->grad_data, np * sizeof *pg));
    CHECK(memcmp(pg, g, np * sizeof *g) == 0, "world of one: DDP's gradients are not the plain model's bits");

    // reduce_dtype bf16: each bucket cast to bf16, summed over NCCL (one
    // rank: itself), cast back: the plain gradients rounded to bf16, bit
    // for bit.
    px_model *mb;
    CHECK_OK(px_model_create(&mb, mlp(), 100));
    CHECK_OK(px_model_to_device(mb, PX_CUDA, px_cuda_current_device()));
    px_ddp_opts ob = opts;
    ob.reduce_dtype = PX_BF16;
    px_ddp *db;
    CHECK_OK(px_ddp_wrap(&db, mb, c, &ob));
    CHECK_OK(px_cuda_zero(mb->grad_data, np * sizeof(float)));
    grads_of(mb, 0, NB);
    CHECK_OK(px_ddp_sync(db));
    float *gb = malloc(np * sizeof *gb);
    CHECK_OK(px_cuda_to_host(gb, mb->grad_data, np * sizeof *gb));
    size_t off = 0, changed = 0;
    for (size_t i = 0; i < np; i++) {
      const float want = px_bf16_to_f32(px_f32_to_bf16(pg[i]));
      off += memcmp(&want, &gb[i], sizeof want) != 0;
      changed += want != pg[i];
    }
    printf("world of one, bf16 reduction: %zu of %zu gradients not the bf16 rounding of the f32 ones (%zu of them "
           "changed by the rounding)\n",
           off, np, changed);
    CHECK(off == 0 && changed > 0, "bf16 reduction: %zu gradients off, %zu changed by rounding", off, changed);
    px_ddp_free(db);
    px_model_free(mb);
    free(gb);
    free(pg);
    px_model_free(plain);
  }

  // An SGD step on the device against the CPU reference's (SGD: Adam's
  // first step is lr·sign(g), which turns rounding in a gradient near 0
  // into a whole step).
  px_optim_opts oo = px_sgd_defaults(0.05f);
  oo.momentum = 0.9f;
  px_optim *og, *oc;
  CHECK_OK(px_optim_create(&og, md->param_data, md->grad_data, np, &oo));
  CHECK_OK(px_optim_to_device(og));
  CHECK_OK(px_optim_create(&oc, ref->param_data, ref->grad_data, np, &oo));
  CHECK_OK(px_optim_step(og));
  CHECK_OK(px_optim_step(oc));
  CHECK_OK(px_cuda_to_host(p, md->param_data, np * sizeof *p));
  double ws = rel_diff(p, ref->param_data, np);
  CHECK(ws <= 1e-5, "rank %d: parameters after a device SGD step differ by %.3g", rank, ws);

  px_optim_free(og);
  px_optim_free(oc);
  px_ddp_free(d);
  px_model_free(md);
  px_model_free(ref);
  free(g);
  free(p);
}

#endif
