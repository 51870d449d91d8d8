/* Claim: gradients through checkpointed units agree with central finite
 * differences of the float64-summed loss (gradcheck.h): a full unit around
 * Linear-Tanh-Dropout(0.3)-Linear in training mode (the recompute must draw
 * the forward's mask), around Conv-BatchNorm-Tanh (batch statistics
 * recomputed), nested units, a unit inside a residual, selective pairs
 * (GELU -> Conv1D, BatchNorm+Tanh -> Conv2d, Tanh -> Linear), and the zoo's
 * 2-layer GPT with dropout under --recompute full, every:2 and selective.
 * If this fails, a recompute does not reproduce the forward (another
 * dropout mask, other statistics), a rebound consumer reads a stale input,
 * or the arena rewind overwrote an input gradient. */
#include "gradcheck.h"
#include <plexus/zoo.h>

static px_module *widen(px_module *m, float std) {
  for (int k = 0; k < m->n_params; k++)
    if (!m->params[k].is_buffer) {
      m->params[k].init = PX_INIT_NORMAL;
      m->params[k].init_a = std;
    }
  for (int i = 0; i < m->n_children; i++) widen(m->children[i], std);
  return m;
}

static void check_full_units(void) {
  float x[4 * 6];
  gc_fill_uniform(x, 24, 1, -1, 1);
  px_tensor t = px_tensor_f32(x, 2, 4, 6, 0, 0);
  gradcheck("checkpoint(linear tanh dropout linear)",
            px_checkpoint(px_chain_of(4, px_linear(6, 8, true), px_tanh(), px_dropout(0.3f), px_linear(8, 3, true))),
            &t, (gc_opts){0});
  gradcheck("checkpoint(checkpoint(linear) tanh) linear",
            px_chain_of(2, px_checkpoint(px_chain_of(2, px_checkpoint(px_linear(6, 6, true)), px_tanh())),
                        px_linear(6, 2, true)),
            &t, (gc_opts){0});
  gradcheck("residual(checkpoint(linear tanh))",
            px_residual(px_checkpoint(px_chain_of(2, px_linear(6, 6, true), px_tanh()))), &t, (gc_opts){0});
  float img[2 * 2 * 5 * 5];
  gc_fill_uniform(img, 100, 2, -1, 1);
  px_tensor ti = px_tensor_f32(img, 4, 2, 2, 5, 5);
  // Tanh, not ReLU, after batch norm: a ±h probe must not cross a kink
  // (the plain chain with ReLU fails the same way; the ResNet's ReLU pairs
  // are checked bit for bit in test_recompute_is_bitwise_exact).
  gradcheck("checkpoint(conv batchnorm tanh)",
            px_checkpoint(px_chain_of(3, px_conv2d(2, 3, 3, 1, 1, false), px_batchnorm(3, 1e-5f, 0.1f), px_tanh())),
            &ti, (gc_opts){0});
}

static void check_pairs(void) {
  float x[2 * 3 * 6];
  gc_fill_uniform(x, 36, 3, -1, 1);
  px_tensor t = px_tensor_f32(x, 3, 2, 3, 6, 0);
  gradcheck("pair(gelu, conv1d)",
            px_checkpoint_pair("act", px_gelu(true), "c_proj", widen(px_conv1d(6, 4, true), 0.5f)), &t, (gc_opts){0});
  px_tensor t2 = px_tensor_f32(x, 2, 6, 6, 0, 0);
  gradcheck("linear pair(tanh, linear)",
            px_chain_of(2, px_linear(6, 6, true), px_checkpoint_pair("a", px_tanh(), "b", px_linear(6, 4, true))), &t2,
            (gc_opts){0});
  float img[2 * 2 * 4 * 4];
  gc_fill_uniform(img, 64, 4, -1, 1);
  px_tensor ti = px_tensor_f32(img, 4, 2, 2, 4, 4);
  gradcheck("pair(batchnorm tanh, conv2d)",
            px_checkpoint_pair("", px_chain_of(2, px_batchnorm(2, 1e-5f, 0.1f), px_tanh()), "conv",
                               px_conv2d(2, 3, 3, 1, 1, true)),
            &ti, (gc_opts){0});
}

static void check_gpt(void) {
  static const char *const policies[3] = {"full", "every:2", "selective"};
  int32_t ids[2 * 6] = {1, 4, 7, 2, 9, 3, 10, 0, 5, 5, 8, 6};
  px_tensor t = px_tensor_view(ids, PX_I32, 2, (int64_t[]){2, 6});
  for (int p = 0; p < 3; p++) {
    px_gpt_config cfg = {.vocab_size = 11, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 8, .dropout = 0.1f};
    px_module *m = px_zoo_gpt(&cfg);
    px_recompute r;
    CHECK_OK(px_recompute_parse(policies[p], &r));
    CHECK_OK(px_zoo_gpt_recompute(m, r));
    char label[48];
    snprintf(label, sizeof label, "gpt 2 layers --recompute %s", policies[p]);
    gradcheck(label, widen(m, 0.3f), &t, (gc_opts){.skip_input = true, .max_checks = 96, .train = true});
  }
}

int main(void) {
  check_full_units();
  check_pairs();
  check_gpt();
  return px_test_finish("test_gradcheck_checkpointed_units");
}
