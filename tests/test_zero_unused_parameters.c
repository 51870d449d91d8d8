/* Claim: with find_unused_parameters, ZeRO stages 1-3 treat a module that
 * does not run forward (a branch not taken) as DDP does: its parameters
 * count as ready with zero gradient, every bucket or unit completes on every
 * rank (also a bucket or unit of nothing but unused parameters, which no
 * backward ever materialised or gathered), the unused parameter's shard
 * gradient is zero, and training gives DDP's parameters to the bit (2
 * ranks, threads).  Without the option, px_zero_sync fails on every rank
 * with a message naming the parameter instead of hanging the job.  If it
 * failed, models with conditional branches would deadlock or diverge under
 * ZeRO. */
#include "px_test.h"

#include <string.h>

// A two-way branch that only ever takes child 0 (child 1 is "unused").
static px_status branch_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  return px_module_forward(m->children[0], ctx, x, y);
}
static px_status branch_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  return px_module_backward(m->children[0], ctx, dy, dx);
}
static const px_module_ops branch_ops = {.type = "Branch", .forward = branch_forward, .backward = branch_backward};

static px_module *make_model(void) {
  px_module *br = px_module_alloc(sizeof(px_module), &branch_ops);
  px_module_add_child(br, "0", px_linear(8, 8, true));
  px_module_add_child(br, "1", px_linear(8, 8, true));
  return px_chain_of(4, px_linear(4, 8, true), br, px_tanh(), px_linear(8, 2, true));
}

static void step(px_model *md, int rank, int rows, int s) {
  float x[8 * 4], t[8 * 2];
  for (int i = 0; i < rows * 4; i++) x[i] = (float)(((i + 4 * rows * rank) * 37 + s * 11) % 17) / 17.0f - 0.5f;
  for (int i = 0; i < rows * 2; i++) t[i] = (float)(((i + 2 * rows * rank) * 13 + s) % 7) / 7.0f;
  px_tensor X = px_tensor_f32(x, 2, rows, 4, 0, 0), T = px_tensor_f32(t, 2, rows, 2, 0, 0), Y;
  CHECK_OK(px_model_forward(md, &X, &Y));
  px_tensor dY = Y;
  float loss;
  dY.data = px_model_scratch(md, (size_t)rows * 2);
  CHECK_OK(px_mse_loss(&Y, &T, &loss, px_f32(&dY)));
  CHECK_OK(px_model_backward(md, &dY, NULL));
}

/* Largest |g| of the shard over the flat range [off, off + n). */
static float shard_grad_max(const px_zero *z, const px_model *model, size_t off, size_t n) {
  size_t fo[64], so[64], cnt[64];
  int k = px_zero_segments(z, fo, so, cnt, 64);
  float *g;
  px_zero_shard(z, NULL, &g, NULL);
  // Stage 1 keeps its gradient pieces in place in grad_data (g is NULL).
  const px_model *md = px_zero_stage(z) == 1 ? model : NULL;
  float m = 0;
  for (int i = 0; i < k && i < 64; i++)
    for (size_t j = 0; j < cnt[i]; j++)
      if (fo[i] + j >= off && fo[i] + j < off + n) m = fmaxf(m, fabsf(md ? md->grad_data[fo[i] + j] : g[so[i] + j]));
  return m;
}

static int with_option(px_comm *c, void *arg) {
  (void)arg;
  const int rank = px_comm_rank(c), rows = 8 / px_comm_size(c);
  px_optim_opts so = px_sgd_defaults(0.1f);
  so.momentum = 0.9f;
  // Reference: DDP with the option, buckets of 64 B.
  px_model *ref;
  CHECK_OK(px_model_create(&ref, make_model(), 3));
  px_ddp_opts dopt = PX_DDP_DEFAULTS;
  dopt.find_unused_parameters = true;
  dopt.bucket_bytes = dopt.first_bucket_bytes = 64;
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, ref, c, &dopt));
  px_optim *ropt;
  CHECK_OK(px_optim_create(&ropt, ref->param_data, ref->grad_data, ref->n_param_elems, &so));
  for (int s = 0; s < 5; s++) {
    px_model_zero_grad(ref);
    step(ref, rank, rows, s);
    CHECK_OK(px_ddp_sync(d));
    CHECK_OK(px_optim_step(ropt));
  }
  px_ddp_free(d);
  px_optim_free(ropt);

  static const char *units[] = {"0", "1.0", "1.1", "3"};  // "1.1": a unit of unused parameters only
  for (int variant = 0; variant < 4; variant++) {
    const int stage = variant < 2 ? variant + 1 : 3;
    px_model *md;
    CHECK_OK(px_model_create(&md, make_model(), 3));
    px_zero_opts o = PX_ZERO_DEFAULTS;
    o.stage = stage;
    o.find_unused_parameters = true;
    o.bucket_bytes = o.first_bucket_bytes = 64;  // 1.1.weight and 1.1.bias: buckets of unused parameters only
    if (variant == 3) {
      o.units = units;
      o.n_units = 4;
    }
    px_zero *z;
    CHECK_OK(px_zero_wrap(&z, md, c, &o));
    px_optim *opt;
    CHECK_OK(px_zero_optim_create(z, &opt, &so));
    const px_param *unused = px_model_find(md, "1.1.weight");
    for (int s = 0; s < 5; s++) {
      px_zero_zero_grad(z);
      step(md, rank, rows, s);
      CHECK_OK(px_zero_sync(z));
      CHECK(shard_grad_max(z, md, unused->offset, unused->numel) == 0.0f,
            "stage %d variant %d: the unused parameter's shard has a gradient", stage, variant);
      CHECK_OK(px_optim_step(opt));
      CHECK_OK(px_zero_after_step(z));
    }
    px_optim_free(opt);
    CHECK_OK(px_zero_free(z));
    CHECK(memcmp(md->param_data, ref->param_data, md->n_param_elems * sizeof(float)) == 0,
          "rank %d stage %d variant %d: parameters differ from DDP's by %.3g", rank, stage, variant,
          px_max_rel_diff(md->param_data, ref->param_data, md->n_param_elems, 1e-2));
    px_model_free(md);
  }
  px_model_free(ref);
  return px_test_failures ? 1 : 0;
}

static int without_option(px_comm *c, void *arg) {
  const int stage = *(const int *)arg;
  px_model *md;
  CHECK_OK(px_model_create(&md, make_model(), 3));
  px_zero_opts o = PX_ZERO_DEFAULTS;
  o.stage = stage;
  px_zero *z;
  // The first rank to notice aborts the job, so a slower peer may see that
  // abort (carrying the same message) while still inside wrap.
  px_status st = px_zero_wrap(&z, md, c, &o);
  if (st == PX_OK) {
    px_zero_zero_grad(z);
    step(md, px_comm_rank(c), 4, 0);
    st = px_zero_sync(z);
    px_zero_free(z);
  }
  CHECK(st != PX_OK && strstr(px_last_error(), "1.1.weight") && strstr(px_last_error(), "find_unused_parameters"),
        "stage %d without the option: %s %s", stage, px_status_name(st), px_last_error());
  px_model_free(md);
  return 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(2, with_option, NULL, &code));
  CHECK(code == 0, "2 ranks with find_unused_parameters failed");
  for (int stage = 1; stage <= 3; stage++) {
    CHECK_OK(px_comm_run(2, without_option, &stage, &code));
  }
  return px_test_finish("test_zero_unused_parameters");
}
