/* Claim: px_zoo_gpt_load_hf fills every parameter of a GPT from a Hugging
 * Face file ("transformer."-prefixed keys, mask buffers and lm_head.weight
 * skipped), and a file it refuses (a missing tensor, a wrong shape) leaves
 * the model exactly as it was.  If this fails, loading GPT-2 weights can
 * leave a model half old, half new after an error, or miss tensors. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static px_gpt_config cfg = {.vocab_size = 23, .context = 6, .n_layer = 2, .n_head = 2, .n_embd = 8};

// Save model `src`'s parameters under "transformer.<name>", plus each
// layer's mask buffers and lm_head.weight, leaving out parameter `skip`
// (-1: none) and giving parameter `reshape` (-1: none) a 1-D shape.
static void save_hf(const px_model *src, const char *path, int skip, int reshape) {
  static uint8_t mask[6 * 6];
  static float masked_bias = -1e4f;
  px_state_dict sd = {calloc((size_t)src->n_params + 8, sizeof(px_named_tensor)), 0};
  for (int k = 0; k < src->n_params; k++) {
    if (k == skip) continue;
    const px_param *p = src->params[k];
    px_named_tensor *it = &sd.items[sd.count++];
    snprintf(it->name, sizeof it->name, "transformer.%.100s", p->name);
    it->tensor = px_tensor_view(p->data, PX_F32, p->ndim, p->shape);
    if (k == reshape) {
      it->tensor.ndim = 1;
      it->tensor.shape[0] = (int64_t)p->numel;
    }
  }
  for (int l = 0; l < cfg.n_layer; l++) {
    px_named_tensor *it = &sd.items[sd.count++];
    snprintf(it->name, sizeof it->name, "transformer.h.%d.attn.bias", l);
    it->tensor = px_tensor_view(mask, PX_U8, 4, (int64_t[]){1, 1, 6, 6});
    it = &sd.items[sd.count++];
    snprintf(it->name, sizeof it->name, "transformer.h.%d.attn.masked_bias", l);
    it->tensor = px_tensor_view(&masked_bias, PX_F32, 0, NULL);
  }
  px_named_tensor *it = &sd.items[sd.count++];
  snprintf(it->name, sizeof it->name, "lm_head.weight");
  it->tensor = px_tensor_view(src->params[0]->data, PX_F32, 2, src->params[0]->shape);
  CHECK_OK(px_safetensors_save(path, &sd, NULL, 0));
  px_state_dict_free(&sd);
}

int main(void) {
  px_model *a, *b;
  CHECK_OK(px_model_create(&a, px_zoo_gpt(&cfg), 1));
  CHECK_OK(px_model_create(&b, px_zoo_gpt(&cfg), 2));
  char good[64], missing[64], shape[64];
  snprintf(good, sizeof good, "gpt_hf_good_%d.safetensors", (int)getpid());
  snprintf(missing, sizeof missing, "gpt_hf_missing_%d.safetensors", (int)getpid());
  snprintf(shape, sizeof shape, "gpt_hf_shape_%d.safetensors", (int)getpid());
  save_hf(a, good, -1, -1);
  save_hf(a, missing, a->n_params - 1, -1);  // no ln_f.bias: found only after all others were matched
  save_hf(a, shape, -1, a->n_params - 4);    // h.1.mlp.c_proj.weight as 1-D
  CHECK(memcmp(a->param_data, b->param_data, a->n_param_elems * sizeof(float)) != 0, "two seeds, two models");

  // Refused files leave b untouched.
  float *before = malloc(b->n_param_elems * sizeof *before);
  memcpy(before, b->param_data, b->n_param_elems * sizeof *before);
  CHECK(px_zoo_gpt_load_hf(b, missing) == PX_ERR_NOT_FOUND, "missing ln_f.bias refused");
  CHECK(strstr(px_last_error(), "ln_f.bias") && strstr(px_last_error(), missing), "%s", px_last_error());
  CHECK(px_zoo_gpt_load_hf(b, shape) == PX_ERR_SHAPE, "wrong shape refused");
  CHECK(strstr(px_last_error(), "h.1.mlp.c_proj.weight") && strstr(px_last_error(), shape), "%s", px_last_error());
  CHECK(memcmp(before, b->param_data, b->n_param_elems * sizeof(float)) == 0, "a refused file changed the model");

  // The good file makes b equal to a.
  CHECK_OK(px_zoo_gpt_load_hf(b, good));
  CHECK(memcmp(a->param_data, b->param_data, a->n_param_elems * sizeof(float)) == 0, "b now equals a");
  remove(good);
  remove(missing);
  remove(shape);
  free(before);
  px_model_free(a);
  px_model_free(b);
  return px_test_finish("test_gpt_load_hf_is_all_or_nothing");
}
