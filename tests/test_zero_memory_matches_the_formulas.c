/* Claim: px_zero_memory_of counts exactly what a rank holds, and that is
 * what the ZeRO formulas say.  Model: 6 layers Linear(16, 16) (272
 * parameters each, n = 1632), buckets and units of one layer, N = 2 (every
 * layer splits evenly) and N = 3 (padded to 273):
 *
 *   stage 1  params = full               grads = full (+ <= 2 padded copies)
 *   stage 2  params = full               grads = shard + buckets in flight
 *                                        (at most PXZ_MAX_RS_IN_FLIGHT + 1)
 *   stage 3  params = shard              grads = shard + units in flight
 *            gathered = 2 units (the one computing and the one prefetched)
 *
 * with shard = 6·ceil(272/N) floats; stages 1-2 update their pieces in
 * place inside the full buffers (no copy of them), and the optimizer's
 * state is 2 × shard (Adam) in every stage.  "In flight" is observed by a second
 * listener that counts, after every hook, the layers whose gradient
 * storage (stage 2-3) or gathered parameters (stage 3) exist; the pools
 * must hold exactly the most it saw at once.  If it fails, the memory
 * table users choose a stage from is wrong, or a stage keeps what it
 * claims to free (grad_data in stage 2, param_data in stage 3). */
#include "px_test.h"
#include "parallel/zero_internal.h" /* PXZ_MAX_RS_IN_FLIGHT */

#include <string.h>

enum { LAYERS = 6, W = 16, PER = W * W + W };

typedef struct probe {
  px_model *md;
  int most_grads, most_params;
} probe;

static void look(void *user, px_module *m) {
  (void)m;
  probe *p = user;
  int grads = 0, params = 0;
  for (int i = 0; i < p->md->n_params; i += 2) {  // weight and bias of one layer share a bucket / unit
    grads += p->md->params[i]->grad != NULL;
    params += p->md->params[i]->data != NULL;
  }
  if (grads > p->most_grads) p->most_grads = grads;
  if (params > p->most_params) p->most_params = params;
}

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  const int N = px_comm_size(c), rank = px_comm_rank(c);
  const size_t f = sizeof(float), n = LAYERS * PER;
  const size_t piece = (PER + (size_t)N - 1) / (size_t)N, padded = piece * (size_t)N, shard = LAYERS * piece;
  const bool even = padded == PER;
  for (int stage = 1; stage <= 3; stage++) {
    px_module *root = px_chain();
    for (int l = 0; l < LAYERS; l++) {
      px_chain_add(root, px_linear(W, W, true));
      if (l + 1 < LAYERS) px_chain_add(root, px_tanh());
    }
    px_model *md;
    CHECK_OK(px_model_create(&md, root, 9));
    px_zero_opts o = PX_ZERO_DEFAULTS;
    o.stage = stage;
    o.bucket_bytes = o.first_bucket_bytes = PER * sizeof(float);
    px_zero *z;
    CHECK_OK(px_zero_wrap(&z, md, c, &o));
    CHECK((md->grad_data == NULL) == (stage >= 2) && (md->param_data == NULL) == (stage == 3),
          "stage %d: grad_data %p param_data %p while wrapped", stage, (void *)md->grad_data, (void *)md->param_data);
    probe pr = {.md = md};
    px_hooks h = {.user = &pr, .pre_forward = look, .post_forward = look, .pre_backward = look, .grads_ready = look};
    int handle;
    CHECK_OK(px_model_attach_hooks(md, &h, &handle));
    float *p, *g;
    size_t sn;
    px_zero_shard(z, &p, &g, &sn);
    CHECK(sn == shard, "stage %d: shard of %zu floats, expected %zu", stage, sn, shard);
    CHECK((p != NULL) == (stage == 3) && (g != NULL) == (stage >= 2),
          "stage %d: contiguous shard params %p grads %p (stages 1-2 keep their pieces in place)", stage, (void *)p,
          (void *)g);
    px_optim *opt;
    px_optim_opts so = px_adam_defaults(1e-3f);
    CHECK_OK(px_zero_optim_create(z, &opt, &so));
    CHECK(opt->n_state == 2 && opt->n == shard, "stage %d: optimizer state %d x %zu, expected 2 x %zu", stage,
          opt->n_state, opt->n, shard);
    float x[4 * W], dyv[4 * W];
    for (int i = 0; i < 4 * W; i++) {
      x[i] = (float)((i * 7 + rank) % 11) / 11.0f - 0.5f;
      dyv[i] = 0.01f * (float)(i % 5);
    }
    for (int s = 0; s < 3; s++) {
      px_zero_zero_grad(z);
      px_tensor X = px_tensor_f32(x, 2, 4, W, 0, 0), Y;
      CHECK_OK(px_model_forward(md, &X, &Y));
      px_tensor dY = Y;
      dY.data = px_model_scratch(md, 4 * W);
      memcpy(dY.data, dyv, sizeof dyv);
      CHECK_OK(px_model_backward(md, &dY, NULL));
      CHECK_OK(px_zero_sync(z));
      CHECK_OK(px_optim_step(opt));
      CHECK_OK(px_zero_after_step(z));
    }
    px_zero_memory m;
    px_zero_memory_of(z, &m);
    // Padded copies (N = 3 only: with N = 2 every layer splits evenly):
    // stage 1's reduce-scatters send one per bucket, at most
    // PXZ_MAX_RS_IN_FLIGHT at once, and stages 1-2's px_zero_after_step
    // receives every bucket into one, PXZ_MAX_AG_IN_FLIGHT at once.  The
    // all-gathers are a fixed window: exactly that many; how many
    // reduce-scatter copies were alive depends on how fast they completed,
    // so stage 1's grads are checked as "full + k copies" for k <= the
    // window.
    const size_t copies = even ? 0 : PXZ_MAX_AG_IN_FLIGHT * padded * f;
    const size_t rs_copies = even ? 0 : PXZ_MAX_RS_IN_FLIGHT * padded * f;
    size_t want_params, want_grads, want_gathered;
    if (stage == 1) {
      want_params = n * f;
      size_t extra = m.grads - n * f;
      want_grads = m.grads >= n * f && extra % (padded * f) == 0 && extra <= rs_copies ? m.grads : 0;
      want_gathered = copies;
    } else if (stage == 2) {
      want_params = n * f;
      want_grads = shard * f + (size_t)pr.most_grads * padded * f;
      want_gathered = copies;
    } else {
      want_params = shard * f;
      want_grads = shard * f + (size_t)pr.most_grads * padded * f;
      want_gathered = (size_t)pr.most_params * padded * f;
      CHECK(pr.most_params == 2, "stage 3: at most %d layers gathered at once, expected 2 (computing + prefetched)",
            pr.most_params);
      // A unit's storage is made after the previous unit's reduce-scatter
      // finished: one unit's gradients at a time.
      CHECK(pr.most_grads == 1, "stage 3: %d layers' gradient storage at once, expected 1", pr.most_grads);
    }
    CHECK(m.params == want_params && m.grads == want_grads && m.gathered == want_gathered,
          "N %d stage %d: params %zu grads %zu gathered %zu bytes, expected %zu %zu %zu", N, stage, m.params, m.grads,
          m.gathered, want_params, want_grads, want_gathered);
    if (stage >= 2)
      CHECK(pr.most_grads >= 1 && pr.most_grads <= PXZ_MAX_RS_IN_FLIGHT + 1,
            "stage %d: %d layers' gradient storage at once; at most %d reduce-scatters in flight plus the one "
            "being written",
            stage, pr.most_grads, PXZ_MAX_RS_IN_FLIGHT);
    CHECK(m.arena_peak == px_arena_high_water(md->arena) && m.arena_peak > 0, "arena peak %zu", m.arena_peak);
    if (rank == 0)
      printf("  N %d stage %d: params %6zu  grads %6zu (%d in flight)  gathered %5zu  arena %zu bytes; full model "
             "%zu\n",
             N, stage, m.params, m.grads, stage >= 2 ? pr.most_grads : 0, m.gathered, m.arena_peak, n * f);
    px_optim_free(opt);
    px_model_remove_hooks(md, handle);
    CHECK_OK(px_zero_free(z));
    px_model_free(md);
  }
  return px_test_failures ? 1 : 0;
}

int main(void) {
  for (int n = 2; n <= 3; n++) {
    int code = 0;
    CHECK_OK(px_comm_run(n, run_all, NULL, &code));
    CHECK(code == 0, "%d ranks: a rank failed (%d)", n, code);
  }
  return px_test_finish("test_zero_memory_matches_the_formulas");
}
