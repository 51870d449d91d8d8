// plexus generate: sample text from a language-model checkpoint with the
// tokenizer it was trained with.
//
//   plexus generate --checkpoint runs/wiki/checkpoints --prompt "The game" --tokens 50
//                   --temperature 0.8 --top-k 40 --seed 1
//
// Each new token: the model runs on the last `context` tokens (no cache:
// the models of the zoo are small enough that a full forward per token is
// cheap next to printing it), the last position's logits are divided by the
// temperature, cut to the top k, and sampled from a Philox stream keyed by
// (seed, token index): the same seed gives the same text.
#include "app.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Index of a sample from softmax(z / temperature) restricted to the top k
// (k = 0: all; temperature 0: the argmax).  p is scratch of V floats.
static int sample(const float *z, int V, double temperature, int k, float *p, px_rng *rng) {
  int best = 0;
  for (int j = 1; j < V; j++)
    if (z[j] > z[best]) best = j;
  if (temperature <= 0.0) return best;
  float cut = -INFINITY;
  if (k > 0 && k < V) {
    // The k-th largest logit: partial selection on a copy.
    memcpy(p, z, (size_t)V * sizeof *p);
    for (int i = 0; i < k; i++) {
      int m = i;
      for (int j = i + 1; j < V; j++)
        if (p[j] > p[m]) m = j;
      float t = p[i];
      p[i] = p[m];
      p[m] = t;
    }
    cut = p[k - 1];
  }
  double sum = 0.0;
  for (int j = 0; j < V; j++) {
    p[j] = z[j] >= cut ? (float)exp((z[j] - z[best]) / temperature) : 0.0f;
    sum += p[j];
  }
  double u = px_rng_uniform_f64(rng) * sum, acc = 0.0;
  for (int j = 0; j < V; j++) {
    acc += p[j];
    if (u < acc && p[j] > 0.0f) return j;
  }
  return best;
}

static void generate_usage(FILE *f) {
  fprintf(f,
          "usage: plexus generate --checkpoint PATH [--prompt TEXT] [--tokens N] [--temperature T]\n"
          "                       [--top-k K] [--seed S]\n"
          "\n"
          "Continues TEXT with N tokens sampled from a GPT checkpoint (or the newest good one in a directory\n"
          "of them), tokenized as in training (the vocabulary named in the saved config, or bytes).\n");
  px_config_print_help(f, CFG_GENERATE);
}

int px_cmd_generate(int argc, char **argv) {
  for (int a = 1; a < argc; a++)
    if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
      generate_usage(stdout);
      return 0;
    }
  px_config cfg;
  px_config_defaults(&cfg);
  px_config *c = &cfg;
  char ckpt[1024], note[2048];
  int64_t step;
  px_vocab *vocab = NULL;
  px_model *model = NULL;
  uint32_t *ids = NULL;
  float *scratch = NULL;
  char *text = NULL;
  int rc = 1;
  const char *ck = px_app_find_option(argc, argv, "checkpoint");
  if (!ck) {
    px_error(PX_ERR_INVALID, "--checkpoint PATH is required");
    goto out;
  }
  if (px_app_resolve_checkpoint(ck, ckpt, sizeof ckpt, note, sizeof note) != PX_OK) goto out;
  if (note[0]) fprintf(stderr, "plexus generate: %s\n", note);
  if (px_app_checkpoint_config(ckpt, c, CFG_GENERATE, &step) != PX_OK) goto out;
  if (px_config_parse(c, argc, argv, 1, CFG_GENERATE) != PX_OK) goto out;
  if (strcmp(c->model, "gpt") != 0) {
    px_error(PX_ERR_INVALID, "%s holds a %s, not a language model (gpt)", ckpt, c->model);
    goto out;
  }
  // The tokenizer of training: bytes, or the saved vocabulary.
  px_status st;
  if (strcmp(c->data, "text") == 0 && strcmp(c->tokenizer, "byte") == 0) st = px_vocab_byte(&vocab);
  else if (*c->vocab) st = px_vocab_load(&vocab, c->vocab);
  else st = px_error(PX_ERR_INVALID, "the checkpoint's config names no vocabulary (data.vocab): give --vocab FILE");
  if (st != PX_OK) goto out;
  px_data_shape shape = {.tokens = true,
                         .vocab_size = c->vocab_size > 0 ? (size_t)c->vocab_size : px_vocab_size(vocab)};
  px_module *root;
  if (px_app_build_model(c, &shape, &root) != PX_OK || px_model_create(&model, root, (uint64_t)c->seed) != PX_OK)
    goto out;
  if (px_train_load_weights(model, ckpt, NULL, 0) != PX_OK) goto out;
  px_model_train(model, false);

  size_t n_prompt = 0;
  uint32_t *prompt = NULL;
  const size_t plen = strlen(c->prompt);
  if (px_vocab_encode(vocab, c->prompt, plen, &prompt, &n_prompt) != PX_OK) goto out;
  // The word tokenizer ends every line with <eos>, the last one too; a
  // prompt is continued on its own line unless it ends with a newline.
  if (px_vocab_kind(vocab) == PX_TOKENIZER_WORD && n_prompt > 0 && plen > 0 && c->prompt[plen - 1] != '\n' &&
      prompt[n_prompt - 1] == px_vocab_id(vocab, "<eos>", 5))
    n_prompt--;
  const size_t total = n_prompt + (size_t)c->tokens + 1;
  ids = malloc(total * sizeof *ids);
  const int V = (int)shape.vocab_size, T = (int)c->context;
  scratch = malloc((size_t)V * sizeof *scratch);
  int32_t *window = malloc((size_t)T * sizeof *window);
  if (!ids || !scratch || !window) {
    free(prompt);
    free(window);
    px_error(PX_ERR_NOMEM, "out of memory");
    goto out;
  }
  size_t n = 0;
  if (n_prompt == 0) {
    // Nothing to continue: start where a line starts.
    ids[n++] = px_vocab_kind(vocab) == PX_TOKENIZER_BYTE ? (uint32_t)'\n' : px_vocab_id(vocab, "<eos>", 5);
  } else {
    memcpy(ids, prompt, n_prompt * sizeof *ids);
    n = n_prompt;
  }
  free(prompt);
  const size_t first_new = n_prompt == 0 ? 1 : n_prompt;
  px_rng rng = px_rng_make((uint64_t)c->seed, 0x67656e);
  for (int64_t k = 0; k < c->tokens; k++) {
    const size_t t = n < (size_t)T ? n : (size_t)T;
    for (size_t i = 0; i < t; i++) window[i] = (int32_t)ids[n - t + i];
    int64_t shp[2] = {1, (int64_t)t};
    px_tensor x = px_tensor_view(window, PX_I32, 2, shp), logits;
    if (px_model_forward(model, &x, &logits) != PX_OK) {
      free(window);
      goto out;
    }
    const float *last = px_f32(&logits) + (t - 1) * (size_t)V;
    ids[n++] = (uint32_t)sample(last, V, c->temperature, (int)c->top_k, scratch, &rng);
  }
  free(window);
  size_t need = px_vocab_decode(vocab, ids + (n_prompt ? 0 : first_new), n - (n_prompt ? 0 : first_new), NULL, 0);
  text = malloc(need + 1);
  if (!text) {
    px_error(PX_ERR_NOMEM, "out of memory");
    goto out;
  }
  px_vocab_decode(vocab, ids + (n_prompt ? 0 : first_new), n - (n_prompt ? 0 : first_new), text, need + 1);
  printf("%s\n", text);
  rc = 0;
out:
  if (rc) px_app_fail("generate");
  free(text);
  free(scratch);
  free(ids);
  px_model_free(model);
  px_vocab_free(vocab);
  px_config_free(c);
  return rc;
}
