/* ddp_cases.h — DDP claims, written once over px_comm so the same code
 * runs under the threads backend and under mpirun.  Every rank also
 * computes the single-process reference itself (it is deterministic), so
 * each rank checks its own result. */
#ifndef PX_DDP_CASES_H
#define PX_DDP_CASES_H

#include "px_test.h"

#include <string.h>

enum { MODEL_MLP, MODEL_CNN };
enum { OPT_SGD, OPT_ADAM };

#define B 4 /* samples per rank per step */
#define STEPS 20
#define IMG 8 /* CNN input: (1, 8, 8) */

static px_module *make_model(int kind) {
  if (kind == MODEL_MLP)
    return px_chain_of(5, px_linear(3, 32, true), px_tanh(), px_linear(32, 32, true), px_tanh(),
                       px_linear(32, 2, true));
  // conv–batchnorm–relu–maxpool twice, then linear (the foundation's CNN,
  // small).  No conv bias: batch norm subtracts it again, so its gradient is
  // zero up to rounding, which Adam would amplify into noise.
  return px_chain_of(10, px_conv2d(1, 4, 3, 1, 1, false), px_batchnorm(4, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                     px_conv2d(4, 8, 3, 1, 1, false), px_batchnorm(8, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                     px_flatten(), px_linear(8 * 2 * 2, 3, true));
}

static size_t sample_size(int kind) { return kind == MODEL_MLP ? 3 : IMG * IMG; }

/* Global sample i of step s (deterministic, the same on every rank). */
static void make_sample(int kind, int step, int i, float *x, int32_t *label, float *target) {
  px_rng r = px_rng_make(1000 + (uint64_t)step, (uint64_t)i);
  size_t n = sample_size(kind);
  for (size_t k = 0; k < n; k++) x[k] = 2.0f * px_rng_uniform(&r) - 1.0f;
  *label = (int32_t)px_rng_below(&r, 3);
  target[0] = x[0] * x[1];
  target[1] = x[2] - x[0];
}

/* One step on rows [first, first + count) of the global batch; the loss
 * gradient is scaled by `scale` (1/micro-steps when accumulating). */
static void step_grads(px_model *md, int kind, int step, int first, int count, float scale) {
  size_t n = sample_size(kind);
  float *x = malloc((size_t)count * n * sizeof *x), *t = malloc((size_t)count * 2 * sizeof *t);
  int32_t *lab = malloc((size_t)count * sizeof *lab);
  for (int i = 0; i < count; i++) make_sample(kind, step, first + i, x + (size_t)i * n, lab + i, t + 2 * i);
  px_tensor X = kind == MODEL_MLP ? px_tensor_f32(x, 2, count, 3, 0, 0) : px_tensor_f32(x, 4, count, 1, IMG, IMG);
  px_tensor Y, dY;
  CHECK_OK(px_model_forward(md, &X, &Y));
  dY = Y;
  dY.data = px_model_scratch(md, (size_t)px_tensor_numel(&Y));
  float loss;
  if (kind == MODEL_MLP) {
    px_tensor T = px_tensor_f32(t, 2, count, 2, 0, 0);
    CHECK_OK(px_mse_loss(&Y, &T, &loss, px_f32(&dY)));
  } else {
    CHECK_OK(px_cross_entropy_loss(&Y, lab, NULL, &loss, px_f32(&dY)));
  }
  px_scale(px_f32(&dY), (size_t)px_tensor_numel(&Y), scale);
  CHECK_OK(px_model_backward(md, &dY, NULL));
  free(x);
  free(t);
  free(lab);
}

static px_optim *make_opt(px_model *md, int opt) {
  px_optim *o;
  px_optim_opts oo = opt == OPT_SGD ? px_sgd_defaults(0.05f) : px_adam_defaults(1e-2f);
  if (opt == OPT_SGD) oo.momentum = 0.9f;
  CHECK_OK(px_optim_create(&o, md->param_data, md->grad_data, md->n_param_elems, &oo));
  return o;
}

/* Reference: one process.  The MLP sees the whole N·B batch per step.  The
 * CNN's batch norm normalises each rank's B samples separately in DDP (as in
 * PyTorch without SyncBatchNorm), so its reference runs the N slices as
 * micro-batches with accumulated gradients: what DDP computes exactly. */
static px_model *reference(int kind, int opt, int world) {
  px_model *md;
  CHECK_OK(px_model_create(&md, make_model(kind), 100));
  px_optim *o = make_opt(md, opt);
  for (int s = 0; s < STEPS; s++) {
    px_model_zero_grad(md);
    if (kind == MODEL_MLP) step_grads(md, kind, s, 0, world * B, 1.0f);
    else
      for (int r = 0; r < world; r++) step_grads(md, kind, s, r * B, B, 1.0f / (float)world);
    CHECK_OK(px_optim_step(o));
  }
  px_optim_free(o);
  return md;
}

/* Worst over parameters of max_i |a_i - b_i| / max(|a_i|, |b_i|, rms(b)):
 * relative to each tensor's own scale, since float32 rounding (here: the
 * order in which the ranks' gradients are summed) is absolute at the scale of
 * the tensor, not of an element that happens to pass near zero. */
static double compare_params(const px_model *a, const px_model *b) {
  double worst = 0;
  for (int i = 0; i < b->n_params; i++) {
    const px_param *p = b->params[i];
    double rms = sqrt(px_sumsq(p->data, p->numel) / (double)p->numel);
    double w = px_max_rel_diff(a->param_data + p->offset, p->data, p->numel, rms);
    if (w > worst) worst = w;
  }
  return worst;
}

/* Claim: N ranks × batch B give the parameters of one process × N·B. */
static void case_equivalence(px_comm *c, int kind, int opt, size_t bucket_bytes) {
  const int rank = px_comm_rank(c), world = px_comm_size(c);
  px_model *md;
  // Different seeds per rank on purpose: wrap must broadcast rank 0's (seed 100).
  CHECK_OK(px_model_create(&md, make_model(kind), 100 + (uint64_t)rank));
  px_ddp_opts opts = PX_DDP_DEFAULTS;
  opts.bucket_bytes = opts.first_bucket_bytes = bucket_bytes;
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, md, c, &opts));
  px_optim *o = make_opt(md, opt);
  for (int s = 0; s < STEPS; s++) {
    px_model_zero_grad(md);
    step_grads(md, kind, s, rank * B, B, 1.0f);
    CHECK_OK(px_ddp_sync(d));
    CHECK_OK(px_optim_step(o));
  }
  px_model *ref = reference(kind, opt, world);
  double worst = compare_params(md, ref);
  CHECK(worst <= 1e-5, "rank %d/%d %s %s bucket %zu B (%d buckets): parameters differ by %.3g relative", rank, world,
        kind == MODEL_MLP ? "mlp" : "cnn", opt == OPT_SGD ? "sgd" : "adam", bucket_bytes, px_ddp_bucket_count(d),
        worst);
  if (rank == 0)
    printf("  %s %-4s buckets of %8zu B (%2d): worst relative difference %.2e\n", kind == MODEL_MLP ? "mlp" : "cnn",
           opt == OPT_SGD ? "sgd" : "adam", bucket_bytes, px_ddp_bucket_count(d), worst);
  px_optim_free(o);
  px_ddp_free(d);
  px_model_free(md);
  px_model_free(ref);
}

/* Claim: 3 no_sync micro-steps then a synced one equal one step on the 4×
 * batch (each micro-batch's loss scaled by 1/4, as in PyTorch). */
static void case_accumulation(px_comm *c) {
  const int rank = px_comm_rank(c), world = px_comm_size(c);
  px_model *md;
  CHECK_OK(px_model_create(&md, make_model(MODEL_MLP), 100));
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, md, c, NULL));
  px_optim *o = make_opt(md, OPT_ADAM);
  for (int s = 0; s < 5; s++) {
    px_model_zero_grad(md);
    for (int m = 0; m < 4; m++) {
      px_ddp_set_sync(d, m == 3);
      // Micro-batch m of this rank: rows of the 4·N·B global batch.
      step_grads(md, MODEL_MLP, s, (m * world + rank) * B, B, 0.25f);
    }
    CHECK_OK(px_ddp_sync(d));
    CHECK_OK(px_optim_step(o));
  }
  px_model *ref;
  CHECK_OK(px_model_create(&ref, make_model(MODEL_MLP), 100));
  px_optim *ro = make_opt(ref, OPT_ADAM);
  for (int s = 0; s < 5; s++) {
    px_model_zero_grad(ref);
    step_grads(ref, MODEL_MLP, s, 0, 4 * world * B, 1.0f);
    CHECK_OK(px_optim_step(ro));
  }
  double worst = compare_params(md, ref);
  CHECK(worst <= 1e-5, "accumulation rank %d: %.3g", rank, worst);
  if (rank == 0) printf("  accumulation (4 micro-steps): worst relative difference %.2e\n", worst);
  px_optim_free(o);
  px_optim_free(ro);
  px_ddp_free(d);
  px_model_free(md);
  px_model_free(ref);
}

/* Claim: with join, a rank that runs out of batches early neither hangs
 * the others nor changes their result: steps where only k ranks have data
 * average over those k.  Rank r has STEPS - r batches. */
static void case_join(px_comm *c) {
  const int rank = px_comm_rank(c), world = px_comm_size(c);
  px_model *md;
  CHECK_OK(px_model_create(&md, make_model(MODEL_MLP), 100));
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, md, c, NULL));
  px_optim *o = make_opt(md, OPT_SGD);
  int mine = 8 - rank, steps = 0;
  for (int s = 0;; s++) {
    int active;
    CHECK_OK(px_ddp_join(d, s < mine, &active));
    if (active == 0) break;
    px_model_zero_grad(md);
    if (s < mine) {
      step_grads(md, MODEL_MLP, s, rank * B, B, 1.0f);
      CHECK_OK(px_ddp_sync(d));
    } else {
      CHECK_OK(px_ddp_shadow(d));
    }
    CHECK_OK(px_optim_step(o));
    steps++;
  }
  CHECK(steps == 8, "rank %d took %d steps", rank, steps);
  // Reference: step s averages the ranks r with s < 8 - r, i.e. r < 8 - s.
  px_model *ref;
  CHECK_OK(px_model_create(&ref, make_model(MODEL_MLP), 100));
  px_optim *ro = make_opt(ref, OPT_SGD);
  for (int s = 0; s < 8; s++) {
    int k = world < 8 - s ? world : 8 - s;
    px_model_zero_grad(ref);
    step_grads(ref, MODEL_MLP, s, 0, k * B, 1.0f);
    CHECK_OK(px_optim_step(ro));
  }
  double worst = compare_params(md, ref);
  CHECK(worst <= 1e-5, "join rank %d: %.3g", rank, worst);
  if (rank == 0) printf("  join (uneven inputs): worst relative difference %.2e\n", worst);
  px_optim_free(o);
  px_optim_free(ro);
  px_ddp_free(d);
  px_model_free(md);
  px_model_free(ref);
}

/* Claim: models that differ between ranks are refused at wrap on every
 * rank, naming the first differing parameter. */
static void case_mismatch(px_comm *c) {
  const int rank = px_comm_rank(c), world = px_comm_size(c);
  if (world < 2) return;
  px_model *md;
  int width = rank == world - 1 ? 17 : 16;
  CHECK_OK(px_model_create(&md, px_chain_of(3, px_linear(4, 8, true), px_relu(), px_linear(8, width, true)), 1));
  px_ddp *d = NULL;
  px_status st = px_ddp_wrap(&d, md, c, NULL);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "2.weight"), "rank %d: mismatch gives %s: %s", rank,
        px_status_name(st), px_last_error());
  if (rank == 0) printf("  mismatch: %s\n", px_last_error());
  px_model_free(md);
}

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 120);
  if (px_comm_rank(c) == 0)
    printf("%d rank(s), backend %s\n", px_comm_size(c), px_comm_backend_name(px_comm_backend_of(c)));
  const size_t buckets[3] = {1, 1u << 20, 25u << 20};  // one parameter each, 1 MiB, 25 MiB
  for (int k = 0; k < 3; k++) {
    case_equivalence(c, MODEL_MLP, OPT_ADAM, buckets[k]);
    case_equivalence(c, MODEL_CNN, OPT_SGD, buckets[k]);
  }
  case_equivalence(c, MODEL_MLP, OPT_SGD, 1);
  case_equivalence(c, MODEL_CNN, OPT_ADAM, 1u << 20);
  case_accumulation(c);
  case_join(c);
  case_mismatch(c);
  return px_test_failures ? 1 : 0;
}

#endif
