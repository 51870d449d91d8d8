/* Claim: a checkpointed unit's recompute is invisible to the parallel
 * strategies listening on the hooks, except where it must not be.
 *  - ZeRO stage 3, 2 and 3 ranks: with --recompute full, every:2 and
 *    selective, a step runs exactly as many all-gathers and reduce-scatters
 *    as without (px_zero_counts),
 *    whether the units are the checkpointed blocks ("h.0": gathered in
 *    pre_backward, the recompute uses that gather) or modules inside them
 *    ("h.0.attn": gathered by the recompute's pre_forward and kept for its
 *    backward), and the parameters after 3 SGD steps are the same bits.
 *  - DDP, 2 ranks, tiny buckets: grads_ready fires for the same modules in
 *    the same order as without recomputation, never while a recompute runs,
 *    and the first bucket's all-reduce has started before the first block's
 *    backward begins (buckets still launch as units finish).
 * If this fails, ZeRO-3 frees a unit after the recompute's forward and
 * gathers it again (two gathers), prefetches in forward order from inside
 * backward, or DDP's overlap is lost behind the recompute. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

enum { V = 23, CTX = 8, T = 6, B = 2, L = 3, STEPS = 3 };

static px_module *make_gpt(const char *policy) {
  const px_gpt_config cfg = {.vocab_size = V, .context = CTX, .n_layer = L, .n_head = 2, .n_embd = 8, .dropout = 0.1f};
  px_module *m = px_zoo_gpt(&cfg);
  px_recompute r;
  CHECK_OK(px_recompute_parse(policy, &r));
  CHECK_OK(px_zoo_gpt_recompute(m, r));
  return m;
}

static void step(px_model *md, int s, int rank) {
  int32_t x[B * T], y[B * T];
  for (int i = 0; i < B * T; i++) {
    x[i] = (i * 5 + s + 7 * rank) % V;
    y[i] = (i * 3 + s + 1 + rank) % V;
  }
  px_tensor X = px_tensor_view(x, PX_I32, 2, (int64_t[]){B, T}), logits;
  CHECK_OK(px_model_forward(md, &X, &logits));
  px_tensor dl = logits;
  dl.data = px_model_scratch(md, (size_t)px_tensor_numel(&logits));
  float loss;
  CHECK_OK(px_cross_entropy_loss(&logits, y, NULL, &loss, px_f32(&dl)));
  CHECK_OK(px_model_backward(md, &dl, NULL));
}

/* ---- ZeRO-3 -------------------------------------------------------------- */

typedef struct z_out {
  int64_t ag_fwd[STEPS], ag_bwd[STEPS], rs[STEPS];
  float *params;
  size_t n;
} z_out;

static z_out zero3_run(px_comm *c, const char *policy, const char *const *units) {
  px_model *md;
  CHECK_OK(px_model_create(&md, make_gpt(policy), 5));
  px_zero_opts o = PX_ZERO_DEFAULTS;
  o.stage = 3;
  o.units = units;
  o.n_units = L;
  px_zero *z;
  CHECK_OK(px_zero_wrap(&z, md, c, &o));
  float *p, *g;
  size_t n;
  px_zero_shard(z, &p, &g, &n);
  px_optim *opt;
  px_optim_opts so = px_sgd_defaults(0.05f);
  CHECK_OK(px_optim_create(&opt, p, g, n, &so));
  z_out out = {.n = md->n_param_elems};
  for (int s = 0; s < STEPS; s++) {
    int64_t ag0, rs0, ag1, rs1, ag2, rs2;
    px_zero_zero_grad(z);
    px_zero_counts(z, &ag0, &rs0);
    int32_t x[B * T], y[B * T];
    for (int i = 0; i < B * T; i++) {
      x[i] = (i * 5 + s + 7 * px_comm_rank(c)) % V;
      y[i] = (i * 3 + s + 1) % V;
    }
    px_tensor X = px_tensor_view(x, PX_I32, 2, (int64_t[]){B, T}), logits;
    CHECK_OK(px_model_forward(md, &X, &logits));
    px_zero_counts(z, &ag1, &rs1);
    px_tensor dl = logits;
    dl.data = px_model_scratch(md, (size_t)px_tensor_numel(&logits));
    float loss;
    CHECK_OK(px_cross_entropy_loss(&logits, y, NULL, &loss, px_f32(&dl)));
    CHECK_OK(px_model_backward(md, &dl, NULL));
    CHECK_OK(px_zero_sync(z));
    px_zero_counts(z, &ag2, &rs2);
    out.ag_fwd[s] = ag1 - ag0;
    out.ag_bwd[s] = ag2 - ag1;
    out.rs[s] = rs2 - rs0;
    CHECK_OK(px_optim_step(opt));
    CHECK_OK(px_zero_after_step(z));
  }
  out.params = malloc(out.n * sizeof(float));
  CHECK_OK(px_zero_gather_params(z, out.params));
  px_optim_free(opt);
  CHECK_OK(px_zero_free(z));
  px_model_free(md);
  return out;
}

static int zero3_rank(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 60);
  static const char *const blocks[L] = {"h.0", "h.1", "h.2"};
  static const char *const inside[L] = {"h.0.attn", "h.1.attn", "h.2.attn"};
  const char *const *cases[2] = {blocks, inside};
  static const char *const policies[3] = {"full", "every:2", "selective"};
  for (int k = 0; k < 2; k++) {
    z_out ref = zero3_run(c, "none", cases[k]);
    for (int q = 0; q < 3; q++) {
      const char *policy = policies[q];
      z_out got = zero3_run(c, policy, cases[k]);
      for (int s = 0; s < STEPS; s++) {
        CHECK(got.ag_fwd[s] == ref.ag_fwd[s] && got.ag_bwd[s] == ref.ag_bwd[s] && got.rs[s] == ref.rs[s],
              "units %s.., step %d: with --recompute %s %lld+%lld all-gathers (forward+backward) and %lld "
              "reduce-scatters, without %lld+%lld and %lld",
              cases[k][0], s, policy, (long long)got.ag_fwd[s], (long long)got.ag_bwd[s], (long long)got.rs[s],
              (long long)ref.ag_fwd[s], (long long)ref.ag_bwd[s], (long long)ref.rs[s]);
        // Each unit once per pass, plus the root unit (wte, wpe, ln_f, and
        // the blocks' other modules when the units are inside them), which
        // a unit that starts frees: with the blocks as units it is gathered
        // for the embeddings, again for ln_f and the head, and for the
        // embeddings' backward; with units inside the blocks the first
        // step (which records that the root unit is read between units)
        // gathers it again after each unit, later steps once a step.
        const int root_fwd = k == 0 ? 2 : s == 0 ? 1 + L : 1, root_bwd = k == 0 ? 1 : s == 0 ? L : 0;
        CHECK(ref.ag_fwd[s] == L + root_fwd && ref.ag_bwd[s] == L + root_bwd,
              "units %s.. step %d: %lld + %lld all-gathers, expected %d + %d", cases[k][0], s, (long long)ref.ag_fwd[s],
              (long long)ref.ag_bwd[s], L + root_fwd, L + root_bwd);
      }
      CHECK(memcmp(ref.params, got.params, ref.n * sizeof(float)) == 0,
            "units %s..: ZeRO-3 parameters after %d steps differ with --recompute %s", cases[k][0], STEPS, policy);
      free(got.params);
    }
    free(ref.params);
  }
  return px_test_failures ? 1 : 0;
}

/* ---- DDP ------------------------------------------------------------------ */

typedef struct probe {
  px_model *md;
  px_ddp *ddp;
  char ready[256][128];
  int n_ready;
  int recomputes_seen, ready_while_recomputing;
  double t_step, t_bucket0_at_first_block;
} probe;

static void on_pre_forward(void *user, px_module *m) {
  probe *p = user;
  if (m == p->md->root) p->t_step = px_time_now();
  if (p->md->ctx.recomputing) p->recomputes_seen++;
}

static void on_pre_backward(void *user, px_module *m) {
  probe *p = user;
  // h.0: the first block, whose backward comes last.
  if (strcmp(m->name, "0") == 0 && m->parent && strcmp(m->parent->name, "h") == 0)
    p->t_bucket0_at_first_block = px_ddp_bucket_start_time(p->ddp, 0);
}

static void on_grads_ready(void *user, px_module *m) {
  probe *p = user;
  if (p->md->ctx.recomputing) p->ready_while_recomputing++;
  // Modules that own parameters (what DDP acts on), by their first
  // parameter's name: the same in both models (wrappers are transparent).
  if (m->n_params == 0 || p->n_ready >= 256) return;
  snprintf(p->ready[p->n_ready++], 128, "%.20s %.100s", m->ops->type, m->params[0].name);
}

static probe *ddp_run(px_comm *c, const char *policy) {
  probe *p = calloc(1, sizeof *p);
  CHECK_OK(px_model_create(&p->md, make_gpt(policy), 5));
  px_ddp_opts o = PX_DDP_DEFAULTS;
  o.bucket_bytes = o.first_bucket_bytes = 256;
  CHECK_OK(px_ddp_wrap(&p->ddp, p->md, c, &o));
  int handle;
  px_hooks h = {.user = p,
                .pre_forward = on_pre_forward,
                .pre_backward = on_pre_backward,
                .grads_ready = on_grads_ready};
  CHECK_OK(px_model_attach_hooks(p->md, &h, &handle));
  for (int s = 0; s < 2; s++) {
    p->n_ready = 0;
    px_model_zero_grad(p->md);
    step(p->md, s, px_comm_rank(c));
    CHECK_OK(px_ddp_sync(p->ddp));
    CHECK(p->t_bucket0_at_first_block > p->t_step,
          "%s step %d: no bucket had started its all-reduce when the "
          "first block's backward began",
          policy, s);
  }
  px_model_remove_hooks(p->md, handle);
  return p;
}

static int ddp_rank(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 60);
  probe *ref = ddp_run(c, "none"), *got = ddp_run(c, "full");
  CHECK(ref->n_ready == got->n_ready, "grads_ready fired %d times with recompute, %d without", got->n_ready,
        ref->n_ready);
  for (int i = 0; i < ref->n_ready && i < got->n_ready; i++)
    CHECK(strcmp(ref->ready[i], got->ready[i]) == 0, "grads_ready #%d: \"%s\" with recompute, \"%s\" without", i,
          got->ready[i], ref->ready[i]);
  CHECK(got->recomputes_seen > 0 && ref->recomputes_seen == 0, "recompute forwards seen: %d with, %d without",
        got->recomputes_seen, ref->recomputes_seen);
  CHECK(got->ready_while_recomputing == 0, "grads_ready fired %d times inside a recompute",
        got->ready_while_recomputing);
  for (probe *p = ref; p; p = p == ref ? got : NULL) {
    px_ddp_free(p->ddp);
    px_model_free(p->md);
  }
  free(ref);
  free(got);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  for (int n = 2; n <= 3; n++) {
    int code = 0;
    CHECK_OK(px_comm_run(n, zero3_rank, NULL, &code));
    CHECK(code == 0, "ZeRO-3, %d ranks: a rank failed (%d)", n, code);
  }
  int code = 0;
  CHECK_OK(px_comm_run(2, ddp_rank, NULL, &code));
  CHECK(code == 0, "DDP: a rank failed (%d)", code);
  return px_test_finish("test_recompute_composes_with_ddp_and_zero3");
}
