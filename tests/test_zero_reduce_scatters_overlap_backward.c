/* Claim: ZeRO reduce-scatters while backward still computes, as DDP
 * all-reduces: with one bucket (stages 1-2) or unit (stage 3) per layer of a
 * 6-layer MLP, when layer k's backward begins the reduce-scatters of every
 * later layer have already started, one per layer in backward order, and
 * when backward returns all 6 have.  Stage 1 with no_sync starts none until
 * the last micro-step.  If it fails, ZeRO waits for the whole backward
 * before communicating (no overlap), or launches groups in an order that
 * could differ between ranks. */
#include "px_test.h"

enum { LAYERS = 6, W = 8 };

typedef struct probe {
  px_zero *z;
  px_model *md;
  int64_t seen[LAYERS]; /* reduce-scatters started when layer k's backward began */
  int n;
} probe;

static void at_pre_backward(void *user, px_module *m) {
  probe *p = user;
  if (m->n_params == 0 || p->n >= LAYERS) return;  // the Linear layers only
  px_zero_counts(p->z, NULL, &p->seen[p->n++]);
}

static void step(px_model *md) {
  float x[2 * W];
  for (int i = 0; i < 2 * W; i++) x[i] = (float)(i % 5) / 5.0f - 0.3f;
  px_tensor X = px_tensor_f32(x, 2, 2, W, 0, 0), Y;
  CHECK_OK(px_model_forward(md, &X, &Y));
  px_tensor dY = Y;
  dY.data = px_model_scratch(md, 2 * W);
  px_fill(px_f32(&dY), 2 * W, 0.1f);
  CHECK_OK(px_model_backward(md, &dY, NULL));
}

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  for (int stage = 1; stage <= 3; stage++) {
    px_module *root = px_chain();
    for (int l = 0; l < LAYERS; l++) {
      px_chain_add(root, px_linear(W, W, true));
      px_chain_add(root, px_tanh());
    }
    px_model *md;
    CHECK_OK(px_model_create(&md, root, 2));
    px_zero_opts o = PX_ZERO_DEFAULTS;
    o.stage = stage;
    o.bucket_bytes = o.first_bucket_bytes = (W * W + W) * sizeof(float);  // one layer per bucket
    px_zero *z;
    CHECK_OK(px_zero_wrap(&z, md, c, &o));
    probe pr = {.z = z, .md = md};
    px_hooks h = {.user = &pr, .pre_backward = at_pre_backward};
    int handle;
    CHECK_OK(px_model_attach_hooks(md, &h, &handle));
    for (int s = 0; s < 2; s++) {
      int64_t rs0, rs1;
      px_zero_counts(z, NULL, &rs0);
      px_zero_zero_grad(z);
      pr.n = 0;
      step(md);
      px_zero_counts(z, NULL, &rs1);
      CHECK(pr.n == LAYERS, "stage %d: %d Linear backwards seen", stage, pr.n);
      for (int k = 0; k < pr.n; k++)
        CHECK(pr.seen[k] - rs0 == k,
              "stage %d step %d: when the %d-th layer from the end began backward, %lld "
              "reduce-scatters had started, expected %d",
              stage, s, k + 1, (long long)(pr.seen[k] - rs0), k);
      CHECK(rs1 - rs0 == LAYERS, "stage %d: %lld reduce-scatters by the end of backward, expected %d", stage,
            (long long)(rs1 - rs0), LAYERS);
      CHECK_OK(px_zero_sync(z));
      CHECK_OK(px_zero_after_step(z));
    }
    if (stage == 1) {
      // no_sync: stage 1 accumulates whole gradients, nothing moves.
      int64_t rs0, rs1;
      px_zero_counts(z, NULL, &rs0);
      px_zero_set_sync(z, false);
      step(md);
      px_zero_counts(z, NULL, &rs1);
      CHECK(rs1 == rs0, "stage 1 no_sync started %lld reduce-scatters", (long long)(rs1 - rs0));
      px_zero_set_sync(z, true);
      step(md);
      CHECK_OK(px_zero_sync(z));
    }
    px_model_remove_hooks(md, handle);
    CHECK_OK(px_zero_free(z));
    px_model_free(md);
  }
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(2, run_all, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_zero_reduce_scatters_overlap_backward");
}
