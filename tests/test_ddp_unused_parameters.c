/* Claim: with find_unused_parameters, a module that does not run forward
 * in a step (a branch not taken) counts as ready with zero gradient, so
 * every bucket completes on every rank and training equals one process;
 * without the option, px_ddp_sync fails with a message naming the
 * parameter instead of hanging the job.  If it failed, models with
 * conditional branches would deadlock under DDP. */
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

static int with_option(px_comm *c, void *arg) {
  (void)arg;
  px_model *md, *ref;
  CHECK_OK(px_model_create(&md, make_model(), 3));
  px_ddp_opts o = PX_DDP_DEFAULTS;
  o.find_unused_parameters = true;
  o.bucket_bytes = o.first_bucket_bytes = 64;  // several buckets, one of them only unused parameters
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, md, c, &o));
  px_optim *opt, *ropt;
  px_optim_opts so = px_sgd_defaults(0.1f);
  CHECK_OK(px_optim_create(&opt, md->param_data, md->grad_data, md->n_param_elems, &so));
  // Reference: one process, both ranks' rows in one batch (rank r's rows follow r·rows).
  CHECK_OK(px_model_create(&ref, make_model(), 3));
  CHECK_OK(px_optim_create(&ropt, ref->param_data, ref->grad_data, ref->n_param_elems, &so));
  const int world = px_comm_size(c), rows = 8 / world;
  for (int s = 0; s < 5; s++) {
    px_model_zero_grad(md);
    step(md, px_comm_rank(c), rows, s);
    CHECK_OK(px_ddp_sync(d));
    px_param *unused = px_model_find(md, "1.1.weight");
    CHECK(unused && px_sumsq(unused->grad, unused->numel) == 0.0, "unused parameter got a gradient");
    CHECK_OK(px_optim_step(opt));
    px_model_zero_grad(ref);
    step(ref, 0, 8, s);
    CHECK_OK(px_optim_step(ropt));
  }
  double worst = px_max_rel_diff(md->param_data, ref->param_data, md->n_param_elems, 1e-2);
  CHECK(worst < 1e-5, "rank %d: %.3g from one process", px_comm_rank(c), worst);
  px_optim_free(opt);
  px_optim_free(ropt);
  px_ddp_free(d);
  px_model_free(md);
  px_model_free(ref);
  return px_test_failures ? 1 : 0;
}

static int without_option(px_comm *c, void *arg) {
  (void)arg;
  px_model *md;
  CHECK_OK(px_model_create(&md, make_model(), 3));
  px_ddp *d;
  // The first rank to notice aborts the job, so a slower peer may see that
  // abort (carrying the same message) while still inside wrap.
  px_status st = px_ddp_wrap(&d, md, c, NULL);
  if (st == PX_OK) {
    px_model_zero_grad(md);
    step(md, px_comm_rank(c), 4, 0);
    st = px_ddp_sync(d);
    px_ddp_free(d);
  }
  CHECK(st != PX_OK && strstr(px_last_error(), "1.1.weight") && strstr(px_last_error(), "find_unused_parameters"),
        "without the option: %s %s", px_status_name(st), px_last_error());
  px_model_free(md);
  return 0;
}

int main(void) {
  // The rows of the batch are split by rank, so the reference sees the
  // same 8 rows: with 1 rank all 8, with 2 ranks 4 each.
  for (int n = 1; n <= 2; n++) {
    int code = 0;
    CHECK_OK(px_comm_run(n, with_option, NULL, &code));
    CHECK(code == 0, "%d ranks with find_unused_parameters failed", n);
  }
  int code = 0;
  CHECK_OK(px_comm_run(2, without_option, NULL, &code));
  return px_test_finish("test_ddp_unused_parameters");
}
