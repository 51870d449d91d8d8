/* Claim: activation checkpointing changes memory, not results.  20 Adam
 * steps with dropout on (embedding, attention probabilities, residuals)
 * give bitwise the same parameters with --recompute full, every:2 and
 * selective as without recomputation: for the zoo's GPT in one process and
 * with DDP on 2 ranks of the threads backend (each policy against DDP
 * without it), and for a small ResNet, whose batch norms' running
 * statistics must be the same bits too (a recompute that updated them a
 * second time would move them).  Also the arena's high-water mark shrinks
 * as the policies promise: full < every:2 < none and selective < none.
 * If this fails, a recompute drew other dropout masks (ctx.step or the
 * seed not restored), batch norm took a batch in twice, a rebind pointed a
 * GEMM at the wrong input, or rewinding the arena overwrote something
 * still in use. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

enum { V = 29, CTX = 12, T = 10, B = 2, STEPS = 20, IMG = 8, CLASSES = 3 };
enum { GPT, RESNET };

static const char *const policies[] = {"none", "full", "every:2", "selective"};
#define N_POLICIES 4

typedef struct run_out {
  float *params, *buffers;
  size_t n_params, n_buffers;
  size_t high_water;
} run_out;

static px_module *build(int kind, const char *policy) {
  px_recompute r;
  CHECK_OK(px_recompute_parse(policy, &r));
  px_module *m;
  if (kind == GPT) {
    const px_gpt_config cfg =
      {.vocab_size = V, .context = CTX, .n_layer = 4, .n_head = 2, .n_embd = 16, .dropout = 0.1f};
    m = px_zoo_gpt(&cfg);
    CHECK_OK(px_zoo_gpt_recompute(m, r));
  } else {
    m = px_zoo_resnet_small(3, CLASSES, 1, 4);
    CHECK_OK(px_zoo_resnet_recompute(m, r));
  }
  return m;
}

// Rows [first, first + count) of the global batch of step s.
static void batch(int kind, int s, int first, int count, void *x, int32_t *y) {
  for (int i = 0; i < count; i++) {
    px_rng r = px_rng_make(900 + (uint64_t)s, (uint64_t)(first + i));
    if (kind == GPT) {
      int32_t seq[T + 1];
      for (int t = 0; t <= T; t++) seq[t] = (int32_t)px_rng_below(&r, V);
      memcpy((int32_t *)x + (size_t)i * T, seq, T * sizeof(int32_t));
      memcpy(y + (size_t)i * T, seq + 1, T * sizeof(int32_t));
    } else {
      float *img = (float *)x + (size_t)i * 3 * IMG * IMG;
      for (int k = 0; k < 3 * IMG * IMG; k++) img[k] = 2.0f * px_rng_uniform(&r) - 1.0f;
      y[i] = (int32_t)px_rng_below(&r, CLASSES);
    }
  }
}

// 20 steps on rows [first, first + count) of each global batch; comm NULL: one process.
static run_out train(int kind, const char *policy, px_comm *comm, int first, int count) {
  px_model *md;
  CHECK_OK(px_model_create(&md, build(kind, policy), 11));
  px_ddp *ddp = NULL;
  if (comm) CHECK_OK(px_ddp_wrap(&ddp, md, comm, NULL));
  px_optim *opt;
  px_optim_opts so = px_adam_defaults(3e-3f);
  CHECK_OK(px_optim_create(&opt, md->param_data, md->grad_data, md->n_param_elems, &so));
  const size_t per_row = kind == GPT ? T : 3 * IMG * IMG;
  const size_t y_per_row = kind == GPT ? T : 1;
  float *xf = malloc((size_t)count * per_row * sizeof(float));
  int32_t *y = malloc((size_t)count * y_per_row * sizeof(int32_t));
  for (int s = 0; s < STEPS; s++) {
    batch(kind, s, first, count, xf, y);
    px_tensor x = kind == GPT ? px_tensor_view(xf, PX_I32, 2, (int64_t[]){count, T})
                              : px_tensor_view(xf, PX_F32, 4, (int64_t[]){count, 3, IMG, IMG});
    px_tensor logits;
    px_model_zero_grad(md);
    CHECK_OK(px_model_forward(md, &x, &logits));
    px_tensor dl = logits;
    dl.data = px_model_scratch(md, (size_t)px_tensor_numel(&logits));
    float loss;
    CHECK_OK(px_cross_entropy_loss(&logits, y, NULL, &loss, px_f32(&dl)));
    CHECK_OK(px_model_backward(md, &dl, NULL));
    if (ddp) CHECK_OK(px_ddp_sync(ddp));
    CHECK_OK(px_optim_step(opt));
  }
  run_out o = {.n_params = md->n_param_elems,
               .n_buffers = md->n_buffer_elems,
               .high_water = px_arena_high_water(md->arena)};
  o.params = malloc(o.n_params * sizeof(float) + 1);
  o.buffers = malloc(o.n_buffers * sizeof(float) + 1);
  memcpy(o.params, md->param_data, o.n_params * sizeof(float));
  memcpy(o.buffers, md->buffer_data, o.n_buffers * sizeof(float));
  free(xf);
  free(y);
  px_optim_free(opt);
  px_ddp_free(ddp);
  px_model_free(md);
  return o;
}

static void free_out(run_out *o) {
  free(o->params);
  free(o->buffers);
}

static size_t first_diff(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return n;
}

static void compare(const char *what, const char *policy, const run_out *ref, const run_out *got) {
  CHECK(ref->n_params == got->n_params && ref->n_buffers == got->n_buffers, "%s %s: layouts differ", what, policy);
  size_t i = first_diff(ref->params, got->params, ref->n_params);
  CHECK(i == ref->n_params, "%s --recompute %s: parameter element %zu is %.9g, without recomputation %.9g", what,
        policy, i, i < ref->n_params ? (double)got->params[i] : 0.0, i < ref->n_params ? (double)ref->params[i] : 0.0);
  i = first_diff(ref->buffers, got->buffers, ref->n_buffers);
  CHECK(i == ref->n_buffers, "%s --recompute %s: running statistic %zu is %.9g, without recomputation %.9g", what,
        policy, i, i < ref->n_buffers ? (double)got->buffers[i] : 0.0,
        i < ref->n_buffers ? (double)ref->buffers[i] : 0.0);
}

static int ddp_rank(px_comm *comm, void *arg) {
  (void)arg;
  px_comm_set_timeout(comm, 60);
  const int r = px_comm_rank(comm);
  run_out ref = train(GPT, "none", comm, r * B, B);
  for (int p = 1; p < N_POLICIES; p++) {
    run_out got = train(GPT, policies[p], comm, r * B, B);
    char what[32];
    snprintf(what, sizeof what, "DDP rank %d gpt", r);
    compare(what, policies[p], &ref, &got);
    free_out(&got);
  }
  free_out(&ref);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  for (int kind = GPT; kind <= RESNET; kind++) {
    const char *what = kind == GPT ? "gpt" : "resnet";
    run_out out[N_POLICIES];
    for (int p = 0; p < N_POLICIES; p++) out[p] = train(kind, policies[p], NULL, 0, 2 * B);
    for (int p = 1; p < N_POLICIES; p++) compare(what, policies[p], &out[0], &out[p]);
    printf("%s arena high-water: none %zu, full %zu, every:2 %zu, selective %zu bytes\n", what, out[0].high_water,
           out[1].high_water, out[2].high_water, out[3].high_water);
    CHECK(out[1].high_water < out[2].high_water && out[2].high_water < out[0].high_water,
          "%s: high-water full %zu, every:2 %zu, none %zu: expected full < every:2 < none", what, out[1].high_water,
          out[2].high_water, out[0].high_water);
    CHECK(out[3].high_water < out[0].high_water, "%s: high-water selective %zu not below none %zu", what,
          out[3].high_water, out[0].high_water);
    for (int p = 0; p < N_POLICIES; p++) free_out(&out[p]);
  }
  int code = 0;
  CHECK_OK(px_comm_run(2, ddp_rank, NULL, &code));
  CHECK(code == 0, "a DDP rank failed (%d)", code);
  return px_test_finish("test_recompute_is_bitwise_exact");
}
