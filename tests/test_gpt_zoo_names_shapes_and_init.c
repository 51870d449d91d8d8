/* Claim: px_zoo_gpt builds GPT-2 with Hugging Face's parameter names, in
 * GPT2Model's state_dict order, with its shapes and layouts (Conv1D
 * weights (in, out)), one copy of the tied wte, and GPT-2's initialisation
 * (N(0, 0.02) weights, N(0, 0.02/√(2L)) residual projections, zero biases,
 * LayerNorm 1/0); a training step allocates nothing once the arena has
 * reached its size.  If this fails, GPT-2 checkpoints do not load (or load
 * into the wrong tensors), the model trains from another start than GPT-2's,
 * or the steady-state loop calls malloc. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

static void expect(const px_model *md, int *k, const char *name, int ndim, int64_t d0, int64_t d1) {
  CHECK(*k < md->n_params, "parameter %d (%s) missing", *k, name);
  if (*k >= md->n_params) return;
  const px_param *p = md->params[*k];
  CHECK(strcmp(p->name, name) == 0, "parameter %d is \"%s\", expected \"%s\"", *k, p->name, name);
  CHECK(p->ndim == ndim && p->shape[0] == d0 && (ndim == 1 || p->shape[1] == d1),
        "\"%s\" has shape (%lld, %lld) ndim %d, expected (%lld, %lld)", name, (long long)p->shape[0],
        (long long)(p->ndim > 1 ? p->shape[1] : 0), p->ndim, (long long)d0, (long long)d1);
  (*k)++;
}

static void stats(const px_param *p, double *mean, double *std) {
  double s = 0, ss = 0;
  for (size_t i = 0; i < p->numel; i++) {
    s += p->data[i];
    ss += (double)p->data[i] * p->data[i];
  }
  *mean = s / (double)p->numel;
  *std = sqrt(ss / (double)p->numel - *mean * *mean);
}

int main(void) {
  enum { V = 3001, T = 64, L = 3, H = 4, C = 64 };
  px_gpt_config cfg = {.vocab_size = V, .context = T, .n_layer = L, .n_head = H, .n_embd = C, .dropout = 0.1f};
  px_model *md;
  CHECK_OK(px_model_create(&md, px_zoo_gpt(&cfg), 1234));
  int k = 0;
  expect(md, &k, "wte.weight", 2, V, C);
  expect(md, &k, "wpe.weight", 2, T, C);
  for (int l = 0; l < L; l++) {
    char n[64];
#define P(suffix, nd, a, b) (snprintf(n, sizeof n, "h.%d.%s", l, suffix), expect(md, &k, n, nd, a, b))
    P("ln_1.weight", 1, C, 0);
    P("ln_1.bias", 1, C, 0);
    P("attn.c_attn.weight", 2, C, 3 * C);
    P("attn.c_attn.bias", 1, 3 * C, 0);
    P("attn.c_proj.weight", 2, C, C);
    P("attn.c_proj.bias", 1, C, 0);
    P("ln_2.weight", 1, C, 0);
    P("ln_2.bias", 1, C, 0);
    P("mlp.c_fc.weight", 2, C, 4 * C);
    P("mlp.c_fc.bias", 1, 4 * C, 0);
    P("mlp.c_proj.weight", 2, 4 * C, C);
    P("mlp.c_proj.bias", 1, C, 0);
#undef P
  }
  expect(md, &k, "ln_f.weight", 1, C, 0);
  expect(md, &k, "ln_f.bias", 1, C, 0);
  CHECK(k == md->n_params, "%d parameters, expected %d", md->n_params, k);
  // GPT-2's count: V·C + T·C + L·(12C² + 13C) + 2C (the head adds none).
  CHECK(md->n_param_elems == (size_t)V * C + (size_t)T * C + (size_t)L * (12 * C * C + 13 * C) + 2 * C,
        "%zu parameter elements", md->n_param_elems);
  CHECK(md->n_buffers == 0, "no buffers (the causal mask is not stored)");

  // Initialisation.
  const double proj_std = 0.02 / sqrt(2.0 * L);
  for (int i = 0; i < md->n_params; i++) {
    const px_param *p = md->params[i];
    double mean, std;
    stats(p, &mean, &std);
    const char *dot = strrchr(p->name, '.');
    bool ln = strstr(p->name, "ln_") != NULL;
    if (strcmp(dot, ".bias") == 0) {
      CHECK(px_max_abs(p->data, p->numel) == 0.0f, "\"%s\" starts at zero", p->name);
    } else if (ln) {
      CHECK(mean == 1.0 && std == 0.0, "\"%s\" starts at one", p->name);
    } else {
      double want = strstr(p->name, "c_proj") ? proj_std : 0.02;
      // n >= 4096 draws: the sample std is within 5% of σ with a wide margin.
      CHECK(fabs(std / want - 1.0) < 0.05 && fabs(mean) < 0.1 * want, "\"%s\": mean %g std %g, expected N(0, %g)",
            p->name, mean, std, want);
    }
  }

  // Steady state: after two steps, a step asks the system for no memory.
  px_optim *opt;
  px_optim_opts oo = px_adamw_defaults(1e-3f);
  CHECK_OK(px_optim_create(&opt, md->param_data, md->grad_data, md->n_param_elems, &oo));
  int32_t ids[2 * 16];
  for (int i = 0; i < 32; i++) ids[i] = (i * 37) % V;
  px_tensor t = px_tensor_view(ids, PX_I32, 2, (int64_t[]){2, 16});
  uint64_t allocs = 0;
  for (int s = 0; s < 4; s++) {
    if (s == 2) allocs = px_arena_system_allocs(md->arena);
    px_model_zero_grad(md);
    px_tensor y;
    CHECK_OK(px_model_forward(md, &t, &y));
    float *dy = px_model_scratch(md, (size_t)px_tensor_numel(&y));
    float loss;
    CHECK_OK(px_cross_entropy_loss(&y, ids, NULL, &loss, dy));
    px_tensor dyt = y;
    dyt.data = dy;
    CHECK_OK(px_model_backward(md, &dyt, NULL));
    CHECK_OK(px_optim_step(opt));
  }
  CHECK(px_arena_system_allocs(md->arena) == allocs, "the arena grew after step 2");
  px_optim_free(opt);
  px_model_free(md);
  return px_test_finish("test_gpt_zoo_names_shapes_and_init");
}
