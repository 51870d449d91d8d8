/* Claim: activation checkpointing composes with tensor parallelism.  The
 * GPT in tensor-parallel form (tp 2 and tp 4 on the threads backend) with
 * every block a checkpointed unit (--recompute full) or every second one
 * (every:2) trains 10 AdamW steps with dropout on to bitwise the same
 * parameter boxes as without recomputation; and the recompute runs each
 * checkpointed block's forward collectives again inside backward, in the
 * same order on every rank: per step, the forward ops' all-reduces grow by
 * exactly two for each recomputed block (attention's and the MLP's
 * row-parallel outputs) and backward's are unchanged.
 * If this fails, a recompute inside a tensor-parallel block drew other
 * dropout masks (the split attention keys masks by the global head), a
 * row-parallel all-reduce was skipped or doubled in the recompute, or the
 * tp ranks disagreed on which blocks recompute. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

enum { V = 37, CTX = 12, T = 10, B = 4, STEPS = 10, LAYERS = 4 };

typedef struct tp_out {
  uint64_t fwd_allreduce, bwd_allreduce; /* per step, of the last step */
} tp_out;

static px_model *build(px_tp_group *g, const char *policy) {
  const px_tp_gpt_config cfg =
    {.vocab_size = V, .context = CTX, .n_layer = LAYERS, .n_head = 4, .n_embd = 16, .dropout = 0.1f};
  px_module *m = px_tp_gpt(g, &cfg);
  CHECK(m != NULL, "px_tp_gpt: %s", px_last_error());
  px_recompute r;
  CHECK_OK(px_recompute_parse(policy, &r));
  if (r.kind != PX_RECOMPUTE_NONE) CHECK_OK(px_zoo_gpt_recompute(m, r));
  px_model *md = NULL;
  CHECK_OK(px_model_create(&md, m, 11));
  return md;
}

// Trains STEPS AdamW steps on fixed batches; returns the model (caller frees).
static px_model *train(px_tp_group *g, const char *policy, tp_out *out) {
  px_model *md = build(g, policy);
  px_optim *o;
  px_optim_opts oo = px_adamw_defaults(3e-3f);
  CHECK_OK(px_optim_create(&o, md->param_data, md->grad_data, md->n_param_elems, &oo));
  px_model_train(md, true);
  int32_t x[B * T], y[B * T];
  for (int s = 0; s < STEPS; s++) {
    for (int i = 0; i < B; i++) {
      px_rng r = px_rng_make(900 + (uint64_t)s, (uint64_t)i);
      int32_t seq[T + 1];
      for (int t = 0; t <= T; t++) seq[t] = (int32_t)px_rng_below(&r, V);
      memcpy(x + i * T, seq, T * sizeof *x);
      memcpy(y + i * T, seq + 1, T * sizeof *y);
    }
    const px_tp_counts c0 = g->counts;
    px_model_zero_grad(md);
    px_tensor xt = px_tensor_view(x, PX_I32, 2, (int64_t[]){B, T}), logits;
    CHECK_OK(px_model_forward(md, &xt, &logits));
    px_tensor dl = logits;
    dl.data = px_model_scratch(md, (size_t)px_tensor_numel(&logits));
    float loss;
    CHECK_OK(px_tp_cross_entropy(g, &logits, V, y, -100, &loss, px_f32(&dl)));
    CHECK_OK(px_model_backward(md, &dl, NULL));
    float norm;
    CHECK_OK(px_tp_clip_grad_norm(g, md, 0.5f, &norm));
    CHECK_OK(px_optim_step(o));
    out->fwd_allreduce = g->counts.fwd_allreduce - c0.fwd_allreduce;
    out->bwd_allreduce = g->counts.bwd_allreduce - c0.bwd_allreduce;
  }
  px_optim_free(o);
  return md;
}

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 120);
  const int tp = px_comm_size(c);
  px_tp_group g = px_tp_group_of(c);
  tp_out plain, with;
  px_model *ref = train(&g, "none", &plain);
  const char *policies[2] = {"full", "every:2"};
  const uint64_t recomputed[2] = {LAYERS, LAYERS / 2};
  for (int k = 0; k < 2; k++) {
    px_model *md = train(&g, policies[k], &with);
    int same = 0;
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i], *q = px_model_find(ref, p->name);
      CHECK(q && q->numel == p->numel, "tp %d %s: \"%s\" missing or resized", tp, policies[k], p->name);
      if (q && q->numel == p->numel) same += memcmp(p->data, q->data, p->numel * sizeof(float)) == 0;
    }
    CHECK(same == md->n_params,
          "tp %d --recompute %s: only %d of %d parameter boxes equal the run without "
          "recomputation to the bit",
          tp, policies[k], same, md->n_params);
    // px_tp_counts files a collective under the op that issues it: the
    // recompute's are forward ops (run inside backward).
    CHECK(with.fwd_allreduce == plain.fwd_allreduce + 2 * recomputed[k],
          "tp %d %s: %llu forward-op all-reduces a step; expected %llu (%llu without recomputation + 2 for each of "
          "%llu recomputed blocks)",
          tp, policies[k], (unsigned long long)with.fwd_allreduce,
          (unsigned long long)(plain.fwd_allreduce + 2 * recomputed[k]), (unsigned long long)plain.fwd_allreduce,
          (unsigned long long)recomputed[k]);
    CHECK(with.bwd_allreduce == plain.bwd_allreduce,
          "tp %d %s: %llu backward all-reduces a step, %llu without "
          "recomputation",
          tp, policies[k], (unsigned long long)with.bwd_allreduce, (unsigned long long)plain.bwd_allreduce);
    if (px_comm_rank(c) == 0)
      printf("  tp %d --recompute %-7s: %d/%d boxes bitwise, all-reduces a step forward %llu, backward %llu "
             "(without: %llu, %llu)\n",
             tp, policies[k], same, md->n_params, (unsigned long long)with.fwd_allreduce,
             (unsigned long long)with.bwd_allreduce, (unsigned long long)plain.fwd_allreduce,
             (unsigned long long)plain.bwd_allreduce);
    px_model_free(md);
  }
  px_model_free(ref);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  const int tps[2] = {2, 4};
  for (int i = 0; i < 2; i++) {
    int code = 0;
    CHECK_OK(px_comm_run(tps[i], run, NULL, &code));
    CHECK(code == 0, "tp %d: a rank failed (%d)", tps[i], code);
  }
  return px_test_finish("test_recompute_composes_with_tensor_parallel");
}
