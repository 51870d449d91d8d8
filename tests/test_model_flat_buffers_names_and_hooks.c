/* Claims about px_model (DESIGN decisions 1, 2, 4):
 * - parameters live in one contiguous buffer in registration order, with
 *   PyTorch state_dict names, and gradients mirror that layout;
 * - hooks fire around every module: pre/post forward in forward order,
 *   pre_backward/grads_ready in reverse, grads_ready after the gradient is in;
 * - backward accumulates (two backwards = twice the gradient);
 * - the steady-state step allocates nothing;
 * - same seed → same weights, another seed → other weights;
 * - a wrong input shape is an error that names the layer and the shapes.
 * If any fails, DDP buckets, checkpoints or PyTorch interop break. */
#include "px_test.h"

#include <string.h>

#define MAX_EVENTS 256
static char events[MAX_EVENTS][48];
static int n_events;
static px_model *the_model;
static float grad_seen_at_ready;

static void record(const char *what, px_module *m) {
  if (n_events < MAX_EVENTS) snprintf(events[n_events++], 48, "%s %s:%u", what, m->ops->type, m->uid);
}
static void on_pre_fwd(void *u, px_module *m) {
  (void)u;
  record("pf", m);
}
static void on_post_fwd(void *u, px_module *m) {
  (void)u;
  record("qf", m);
}
static void on_pre_bwd(void *u, px_module *m) {
  (void)u;
  record("pb", m);
}
static void on_ready(void *u, px_module *m) {
  (void)u;
  record("gr", m);
  // The first Linear's weight gradient must already be in when it is ready.
  if (m == the_model->modules[1]) grad_seen_at_ready = (float)px_sumsq(m->params[0].grad, m->params[0].numel);
}

int main(void) {
  // chain: 0 Linear(3,4) 1 Tanh 2 Residual(chain(0 Linear(4,4), 1 ReLU)) 3 Linear(4,2, no bias)
  px_module *root = px_chain_of(4, px_linear(3, 4, true), px_tanh(),
                                px_residual(px_chain_of(2, px_linear(4, 4, true), px_relu())), px_linear(4, 2, false));
  px_model *md;
  CHECK_OK(px_model_create(&md, root, 1));
  the_model = md;

  const char *names[] = {"0.weight", "0.bias", "2.0.weight", "2.0.bias", "3.weight"};
  const size_t sizes[] = {12, 4, 16, 4, 8};
  CHECK(md->n_params == 5, "n_params %d", md->n_params);
  size_t off = 0;
  for (int i = 0; i < md->n_params && i < 5; i++) {
    px_param *p = md->params[i];
    CHECK(strcmp(p->name, names[i]) == 0, "param %d named %s, expected %s", i, p->name, names[i]);
    CHECK(p->offset == off && p->numel == sizes[i], "%s at %zu size %zu", p->name, p->offset, p->numel);
    CHECK(p->data == md->param_data + off && p->grad == md->grad_data + off, "%s views the flat buffers", p->name);
    off += sizes[i];
  }
  CHECK(md->n_param_elems == off, "flat size %zu vs %zu", md->n_param_elems, off);
  CHECK(px_model_find(md, "2.0.bias") == md->params[3], "find by name");
  // Initialisation like PyTorch: U(±1/√fan_in).
  for (size_t i = 0; i < 12; i++) CHECK(fabsf(md->param_data[i]) <= 1.0f / sqrtf(3.0f), "init bound");

  px_hooks h = {.pre_forward = on_pre_fwd,
                .post_forward = on_post_fwd,
                .pre_backward = on_pre_bwd,
                .grads_ready = on_ready};
  CHECK_OK(px_model_attach_hooks(md, &h, NULL));

  float xs[2 * 3] = {0.1f, -0.2f, 0.3f, 0.5f, 0.4f, -0.6f};
  px_tensor x = px_tensor_f32(xs, 2, 2, 3, 0, 0), y;
  CHECK_OK(px_model_forward(md, &x, &y));
  CHECK(y.ndim == 2 && y.shape[0] == 2 && y.shape[1] == 2, "output shape");
  px_tensor dy = y;
  dy.data = px_model_scratch(md, 4);
  px_fill(px_f32(&dy), 4, 1.0f);
  px_model_zero_grad(md);
  CHECK_OK(px_model_backward(md, &dy, NULL));

  const char *expect[] = {"pf Chain:0",    "pf Linear:1",   "qf Linear:1",   "pf Tanh:2",   "qf Tanh:2",
                          "pf Residual:3", "pf Chain:4",    "pf Linear:5",   "qf Linear:5", "pf ReLU:6",
                          "qf ReLU:6",     "qf Chain:4",    "qf Residual:3", "pf Linear:7", "qf Linear:7",
                          "qf Chain:0",    "pb Chain:0",    "pb Linear:7",   "gr Linear:7", "pb Residual:3",
                          "pb Chain:4",    "pb ReLU:6",     "gr ReLU:6",     "pb Linear:5", "gr Linear:5",
                          "gr Chain:4",    "gr Residual:3", "pb Tanh:2",     "gr Tanh:2",   "pb Linear:1",
                          "gr Linear:1",   "gr Chain:0"};
  int n_expect = (int)(sizeof expect / sizeof *expect);
  CHECK(n_events == n_expect, "%d hook events, expected %d", n_events, n_expect);
  for (int i = 0; i < n_events && i < n_expect; i++)
    CHECK(strcmp(events[i], expect[i]) == 0, "event %d: %s, expected %s", i, events[i], expect[i]);
  CHECK(grad_seen_at_ready > 0, "0.weight gradient empty when grads_ready fired");

  // Backward accumulates: a second pass doubles every gradient.
  float *g1 = malloc(md->n_param_elems * sizeof *g1);
  memcpy(g1, md->grad_data, md->n_param_elems * sizeof *g1);
  CHECK(px_sumsq(g1, md->n_param_elems) > 0, "gradients are non-zero");
  CHECK_OK(px_model_forward(md, &x, &y));
  dy = y;
  dy.data = px_model_scratch(md, 4);
  px_fill(px_f32(&dy), 4, 1.0f);
  CHECK_OK(px_model_backward(md, &dy, NULL));
  for (size_t i = 0; i < md->n_param_elems; i++) CHECK_CLOSE(md->grad_data[i], 2.0f * g1[i], 1e-6);
  free(g1);

  // Steady state: after the first steps, no more system allocations.
  uint64_t allocs = px_arena_system_allocs(md->arena);
  for (int step = 0; step < 5; step++) {
    CHECK_OK(px_model_forward(md, &x, &y));
    dy = y;
    dy.data = px_model_scratch(md, 4);
    CHECK_OK(px_model_backward(md, &dy, NULL));
  }
  CHECK(px_arena_system_allocs(md->arena) == allocs, "arena allocated in steady state");

  // Wrong input width: a clear error naming the layer and the shape.
  float bad[2 * 5] = {0};
  px_tensor xb = px_tensor_f32(bad, 2, 2, 5, 0, 0);
  px_status st = px_model_forward(md, &xb, &y);
  CHECK(st == PX_ERR_SHAPE, "status %s", px_status_name(st));
  CHECK(strstr(px_last_error(), "Linear(3 -> 4)") && strstr(px_last_error(), "(2, 5)") &&
          strstr(px_last_error(), "0.weight"),
        "message: %s", px_last_error());

  // Same seed → same weights; another seed → different.
  px_model *a, *b;
  CHECK_OK(px_model_create(&a, px_chain_of(1, px_linear(8, 8, true)), 5));
  CHECK_OK(px_model_create(&b, px_chain_of(1, px_linear(8, 8, true)), 5));
  CHECK(memcmp(a->param_data, b->param_data, a->n_param_elems * sizeof(float)) == 0, "same seed");
  px_model_init(b, 6);
  CHECK(memcmp(a->param_data, b->param_data, a->n_param_elems * sizeof(float)) != 0, "other seed");
  px_model_free(a);
  px_model_free(b);

  // Duplicate names are refused.
  px_module *dup = px_chain();
  CHECK_OK(px_chain_add_named(dup, "x", px_linear(2, 2, true)));
  CHECK_OK(px_chain_add_named(dup, "x", px_linear(2, 2, true)));
  px_model *d;
  CHECK(px_model_create(&d, dup, 1) == PX_ERR_INVALID && strstr(px_last_error(), "x.weight"), "duplicate names: %s",
        px_last_error());

  // A failed constructor inside px_chain_of frees the rest and keeps its message.
  px_module *broken = px_chain_of(2, px_linear(2, 2, true), px_linear(0, 2, true));
  CHECK(broken == NULL && strstr(px_last_error(), "positive"), "chain_of failure: %s", px_last_error());

  px_model_free(md);
  return px_test_finish("test_model_flat_buffers_names_and_hooks");
}
