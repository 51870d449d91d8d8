/* Claim: ZeRO stage 3 moves what FSDP moves, no more: per training step
 * exactly one all-gather per unit in forward, one per unit in backward
 * (none with reshard_after_forward = false), one reduce-scatter per unit,
 * and nothing in px_zero_after_step; with a tied head the embedding's unit
 * stays gathered from its forward to its backward (the head reads it in
 * between), so backward gathers every unit but that one.  From the second
 * step on, the next unit's all-gather is already started when a unit begins
 * its forward (prefetch in the order the first step recorded), and not
 * without prefetch.  Evaluation (px_model_train(false)) works while
 * wrapped: one all-gather per unit, no reduce-scatter, nothing left
 * gathered, and the logits of the unwrapped model to the bit.  If it
 * fails, stage 3 gathers too often (wasted bandwidth), too rarely (a unit
 * computed from freed memory), or does not overlap its gathers. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

enum { V = 23, T = 5, ROWS = 2 };

static px_module *make_mlp(void) {
  // 4 units with parameters (the default: the root's children that hold any).
  return px_chain_of(7, px_linear(3, 8, true), px_tanh(), px_linear(8, 8, true), px_tanh(), px_linear(8, 5, true),
                     px_tanh(), px_linear(5, 2, true));
}

static px_module *make_gpt(void) {
  const px_gpt_config cfg = {.vocab_size = V, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 8, .dropout = 0};
  return px_zoo_gpt(&cfg);
}

static void forward(px_model *md, bool gpt, int s, px_tensor *y, int32_t *targets) {
  static float x[ROWS * 3];
  static int32_t ids[ROWS * T];
  for (int i = 0; i < ROWS * 3; i++) x[i] = (float)((i * 7 + s) % 5) / 5.0f - 0.4f;
  for (int i = 0; i < ROWS * T; i++) {
    ids[i] = (i * 5 + s) % V;
    targets[i] = (i * 3 + s + 1) % V;
  }
  px_tensor X = gpt ? px_tensor_view(ids, PX_I32, 2, (int64_t[]){ROWS, T}) : px_tensor_f32(x, 2, ROWS, 3, 0, 0);
  CHECK_OK(px_model_forward(md, &X, y));
}

static void backward(px_model *md, bool gpt, const px_tensor *y, const int32_t *targets) {
  px_tensor dy = *y;
  dy.data = px_model_scratch(md, (size_t)px_tensor_numel(y));
  float loss;
  if (gpt) {
    CHECK_OK(px_cross_entropy_loss(y, targets, NULL, &loss, px_f32(&dy)));
  } else {
    px_fill(px_f32(&dy), (size_t)px_tensor_numel(y), 0.1f);
  }
  CHECK_OK(px_model_backward(md, &dy, NULL));
}

/* A second listener beside ZeRO's: at each unit's pre_forward, how many
 * all-gathers ZeRO (the earlier slot, so it has already acted) started. */
typedef struct probe {
  px_zero *z;
  px_model *md;
  int64_t at_unit[16];
  int n;
} probe;

static void probe_pre_forward(void *user, px_module *m) {
  probe *p = user;
  // The MLP's units are the root's children with parameters (not Tanh).
  if (!p->z || m->parent != p->md->root || m->n_params == 0 || p->n >= 16) return;
  px_zero_counts(p->z, &p->at_unit[p->n++], NULL);
}

static void run_case(px_comm *c, bool gpt, bool reshard, bool prefetch) {
  const int rank = px_comm_rank(c);
  px_model *md;
  CHECK_OK(px_model_create(&md, gpt ? make_gpt() : make_mlp(), 5));
  px_zero_opts o = PX_ZERO_DEFAULTS;
  o.stage = 3;
  o.reshard_after_forward = reshard;
  o.prefetch = prefetch;
  px_zero *z;
  CHECK_OK(px_zero_wrap(&z, md, c, &o));
  probe pr = {.md = md};
  int handle;
  px_hooks h = {.user = &pr, .pre_forward = probe_pre_forward};
  CHECK_OK(px_model_attach_hooks(md, &h, &handle));
  const int64_t U = px_zero_unit_count(z);
  CHECK(U == 4, "%s: %lld units, expected 4 (%s)", gpt ? "gpt" : "mlp", (long long)U,
        gpt ? "wte, wpe, h, ln_f" : "the four Linear layers");
  px_optim *opt;
  px_optim_opts so = px_sgd_defaults(0.01f);
  CHECK_OK(px_zero_optim_create(z, &opt, &so));
  int32_t targets[ROWS * T];
  for (int s = 0; s < 3; s++) {
    int64_t ag0, rs0, ag1, rs1, ag2, rs2, ag3, rs3;
    px_zero_zero_grad(z);
    px_tensor y;
    pr.z = z;
    pr.n = 0;
    px_zero_counts(z, &ag0, &rs0);
    forward(md, gpt, s, &y, targets);
    px_zero_counts(z, &ag1, &rs1);
    pr.z = NULL;
    backward(md, gpt, &y, targets);
    CHECK_OK(px_zero_sync(z));
    px_zero_counts(z, &ag2, &rs2);
    CHECK_OK(px_optim_step(opt));
    CHECK_OK(px_zero_after_step(z));
    px_zero_counts(z, &ag3, &rs3);
    // Tied GPT: wte stays gathered for the head, so backward skips it.
    const int64_t bwd = !reshard ? 0 : gpt ? U - 1 : U;
    CHECK(ag1 - ag0 == U && rs1 == rs0,
          "%s reshard %d step %d: forward ran %lld all-gathers and %lld "
          "reduce-scatters, expected %lld and 0",
          gpt ? "gpt" : "mlp", reshard, s, (long long)(ag1 - ag0), (long long)(rs1 - rs0), (long long)U);
    CHECK(ag2 - ag1 == bwd && rs2 - rs1 == U,
          "%s reshard %d step %d: backward ran %lld all-gathers and %lld "
          "reduce-scatters, expected %lld and %lld",
          gpt ? "gpt" : "mlp", reshard, s, (long long)(ag2 - ag1), (long long)(rs2 - rs1), (long long)bwd,
          (long long)U);
    CHECK(ag3 == ag2 && rs3 == rs2, "after_step communicated in stage 3");
    if (!gpt && s > 0) {
      // At unit k's pre_forward (ZeRO acted first): units 0..k gathered,
      // plus unit k+1 started when prefetching.
      for (int k = 0; k < pr.n; k++) {
        int64_t expect = ag0 + k + 1 + (prefetch && k + 1 < U ? 1 : 0);
        CHECK(pr.at_unit[k] == expect, "step %d prefetch %d: at unit %d's forward %lld all-gathers, expected %lld", s,
              prefetch, k, (long long)pr.at_unit[k], (long long)expect);
      }
      CHECK(pr.n == U, "the probe saw %d units", pr.n);
    }
  }
  // Evaluation while wrapped, against the same parameters unwrapped.
  float *flat = malloc(md->n_param_elems * sizeof *flat);
  CHECK_OK(px_zero_gather_params(z, flat));
  px_model *plain;
  CHECK_OK(px_model_create(&plain, gpt ? make_gpt() : make_mlp(), 5));
  memcpy(plain->param_data, flat, md->n_param_elems * sizeof *flat);
  px_model_train(md, false);
  px_model_train(plain, false);
  int64_t ag0, rs0, ag1, rs1;
  px_zero_counts(z, &ag0, &rs0);
  px_tensor y, yp;
  forward(md, gpt, 9, &y, targets);
  px_zero_counts(z, &ag1, &rs1);
  forward(plain, gpt, 9, &yp, targets);
  CHECK(ag1 - ag0 == U && rs1 == rs0, "evaluation: %lld all-gathers and %lld reduce-scatters, expected %lld and 0",
        (long long)(ag1 - ag0), (long long)(rs1 - rs0), (long long)U);
  CHECK(px_tensor_numel(&y) == px_tensor_numel(&yp) &&
          memcmp(y.data, yp.data, (size_t)px_tensor_numel(&y) * sizeof(float)) == 0,
        "rank %d: evaluation while wrapped differs from the unwrapped model", rank);
  for (int i = 0; i < md->n_params; i++)
    CHECK(md->params[i]->data == NULL, "after evaluation \"%s\" is still gathered", md->params[i]->name);
  px_model_train(md, true);
  px_optim_free(opt);
  px_model_remove_hooks(md, handle);
  CHECK_OK(px_zero_free(z));
  free(flat);
  px_model_free(plain);
  px_model_free(md);
}

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 60);
  for (int gpt = 0; gpt <= 1; gpt++)
    for (int reshard = 1; reshard >= 0; reshard--) run_case(c, gpt, reshard, true);
  run_case(c, false, true, false);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  for (int n = 2; n <= 3; n++) {
    int code = 0;
    CHECK_OK(px_comm_run(n, run_all, NULL, &code));
    CHECK(code == 0, "%d ranks: a rank failed (%d)", n, code);
  }
  return px_test_finish("test_zero3_collectives_per_unit");
}
