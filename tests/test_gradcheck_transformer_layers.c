/* Claim: the transformer layers compute gradients that agree with central
 * finite differences: token embedding (with repeated ids) plus learned
 * positions, GPT-2's Conv1D (with and without bias), causal multi-head
 * self-attention (several heads, T > 1, one tile and several tiles of
 * query rows, with attention and residual dropout in training mode), the
 * output projection tied to the embedding (the embedding's gradient gets
 * both shares), and a whole 2-layer GPT from the zoo.
 * If this fails, that layer's backward is wrong (a missing softmax row term,
 * a causal mask applied in forward but not in backward, a transposed
 * Conv1D weight, a tied gradient that overwrites instead of adding) and a
 * transformer trained with it descends in a wrong direction.
 * (LayerNorm and GELU have their checks in test_gradcheck_conv_pool_norm
 * and test_gradcheck_linear_activations_losses.) */
#include "gradcheck.h"
#include <plexus/zoo.h>

// GPT-2's N(0, 0.02) makes attention nearly uniform and every gradient
// tiny, which a finite difference with atol 1e-3 could not tell from wrong:
// draw every parameter from N(0, std) instead (LayerNorm's γ included).
static px_module *widen(px_module *m, float std) {
  for (int k = 0; k < m->n_params; k++) {
    m->params[k].init = PX_INIT_NORMAL;
    m->params[k].init_a = std;
  }
  for (int i = 0; i < m->n_children; i++) widen(m->children[i], std);
  return m;
}

static void check_embedding(void) {
  // 2×5 ids over a vocabulary of 7, ids 3 and 5 repeated: dW rows sum.
  int32_t ids[10] = {3, 0, 5, 3, 6, 5, 5, 1, 3, 2};
  px_tensor t = px_tensor_view(ids, PX_I32, 2, (int64_t[]){2, 5});
  gradcheck("embedding", px_embedding(7, 4), &t, (gc_opts){.skip_input = true});
  gradcheck("embedding+positions", px_chain_of(2, px_embedding(7, 4), widen(px_pos_embedding(6, 4), 1.0f)), &t,
            (gc_opts){.skip_input = true});
  // Positions alone, on a float input: dx = dy.
  float x[2 * 3 * 4];
  gc_fill_uniform(x, 24, 3, -1, 1);
  px_tensor xt = px_tensor_f32(x, 3, 2, 3, 4, 0);
  gradcheck("positions", widen(px_pos_embedding(5, 4), 1.0f), &xt, (gc_opts){0});
}

static void check_conv1d(void) {
  for (int bias = 0; bias < 2; bias++) {
    float x[3 * 2 * 6];
    gc_fill_uniform(x, 36, 11 + bias, -1, 1);
    px_tensor t = px_tensor_f32(x, 3, 3, 2, 6, 0);
    gradcheck(bias ? "conv1d+bias" : "conv1d", widen(px_conv1d(6, 5, bias), 0.5f), &t, (gc_opts){0});
  }
}

static void check_attention(void) {
  // (N, T, C) = (2, 5, 8) with 2 heads; then T = 70 > one tile of 64 query rows.
  static float x[2 * 70 * 8];
  gc_fill_uniform(x, 2 * 5 * 8, 21, -1, 1);
  px_tensor t = px_tensor_f32(x, 3, 2, 5, 8, 0);
  gradcheck("attention H=2 T=5", widen(px_causal_self_attention(8, 2, 0.0f, 0.0f), 0.5f), &t,
            (gc_opts){.max_checks = 96});
  gradcheck("attention H=4 T=5", widen(px_causal_self_attention(8, 4, 0.0f, 0.0f), 0.5f), &t,
            (gc_opts){.max_checks = 96});
  // Dropout on the probabilities and the residual, in training mode: the
  // same step in every probe, so the same masks; the masked backward must
  // match.
  gradcheck("attention dropout", widen(px_causal_self_attention(8, 2, 0.3f, 0.2f), 0.5f), &t,
            (gc_opts){.max_checks = 96, .train = true});
  gc_fill_uniform(x, 1 * 70 * 8, 22, -1, 1);
  px_tensor t70 = px_tensor_f32(x, 3, 1, 70, 8, 0);
  gradcheck("attention T=70 (two tiles)", widen(px_causal_self_attention(8, 2, 0.0f, 0.0f), 0.5f), &t70,
            (gc_opts){.max_checks = 128});
  gradcheck("attention T=70 dropout", widen(px_causal_self_attention(8, 2, 0.25f, 0.0f), 0.5f), &t70,
            (gc_opts){.max_checks = 128, .train = true});
}

static void check_tied_head(void) {
  // ids -> wte -> Conv1D -> logits = h · wteᵀ: wte.weight's gradient is the
  // scatter-add of the embedding plus the head's dyᵀ · h.
  int32_t ids[6] = {1, 4, 4, 0, 2, 4};
  px_tensor t = px_tensor_view(ids, PX_I32, 2, (int64_t[]){2, 3});
  px_module *wte = px_embedding(5, 6);
  px_module *root = px_chain_of(3, wte, widen(px_conv1d(6, 6, true), 0.5f), px_tied_head(wte));
  gradcheck("tied head", root, &t, (gc_opts){.skip_input = true});
}

static void check_gpt(void) {
  px_gpt_config cfg = {.vocab_size = 11, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 8, .dropout = 0.1f};
  int32_t ids[2 * 6] = {1, 5, 10, 0, 3, 3, 7, 2, 2, 9, 4, 6};
  px_tensor t = px_tensor_view(ids, PX_I32, 2, (int64_t[]){2, 6});
  gradcheck("gpt 2 layers", widen(px_zoo_gpt(&cfg), 0.3f), &t,
            (gc_opts){.skip_input = true, .max_checks = 128, .train = true});
}

int main(void) {
  check_embedding();
  check_conv1d();
  check_attention();
  check_tied_head();
  check_gpt();
  return px_test_finish("test_gradcheck_transformer_layers");
}
