/* checkpoint_logits — the plexus half of
 * tests/test_cli_checkpoint_consolidated_gpt_matches_pytorch_logits.py.
 *
 * Builds a language model from a checkpoint exactly as `plexus generate`
 * does (the saved config, the vocabulary it names or bytes, the zoo's
 * model, px_train_load_weights: a checkpoint of any layout, a ZeRO-3 one
 * assembled from every rank's pieces), runs it in eval mode on a batch of
 * token ids and writes the logits:
 *
 *   checkpoint_logits CKPT IDS OUT
 *
 *   IDS  int32 B, int32 T, then B*T int32 token ids (little-endian, raw)
 *   OUT  B*T*V float32 logits, raw; "vocab V" is printed on stdout
 *
 * A failure prints px_last_error() and exits 1; a bad command line exits 2. */
#include "app.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int32_t *read_ids(const char *path, int32_t *B, int32_t *T) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  int32_t *ids = NULL;
  if (fread(B, sizeof *B, 1, f) == 1 && fread(T, sizeof *T, 1, f) == 1 && *B > 0 && *T > 0) {
    const size_t n = (size_t)*B * (size_t)*T;
    ids = malloc(n * sizeof *ids);
    if (ids && fread(ids, sizeof *ids, n, f) != n) {
      free(ids);
      ids = NULL;
    }
  }
  fclose(f);
  return ids;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: checkpoint_logits CKPT IDS OUT\n");
    return 2;
  }
  int32_t B = 0, T = 0;
  int32_t *ids = read_ids(argv[2], &B, &T);
  if (!ids) {
    fprintf(stderr, "checkpoint_logits: cannot read the ids in %s\n", argv[2]);
    return 2;
  }
  px_config cfg;
  px_config_defaults(&cfg);
  char ckpt[1024], note[2048];
  int64_t step;
  px_vocab *vocab = NULL;
  px_model *model = NULL;
  int rc = 1;
  px_status st = px_app_resolve_checkpoint(argv[1], ckpt, sizeof ckpt, note, sizeof note);
  if (st == PX_OK) st = px_app_checkpoint_config(ckpt, &cfg, CFG_GENERATE, &step);
  if (st == PX_OK) {
    if (strcmp(cfg.data, "text") == 0 && strcmp(cfg.tokenizer, "byte") == 0) st = px_vocab_byte(&vocab);
    else if (*cfg.vocab) st = px_vocab_load(&vocab, cfg.vocab);
    else st = px_error(PX_ERR_INVALID, "the checkpoint's config names no vocabulary");
  }
  px_data_shape shape = {.tokens = true};
  px_module *root = NULL;
  if (st == PX_OK) {
    shape.vocab_size = cfg.vocab_size > 0 ? (size_t)cfg.vocab_size : px_vocab_size(vocab);
    st = px_app_build_model(&cfg, &shape, &root);
  }
  if (st == PX_OK) st = px_model_create(&model, root, (uint64_t)cfg.seed);
  if (st == PX_OK) st = px_train_load_weights(model, ckpt, NULL, 0);
  if (st == PX_OK) {
    px_model_train(model, false);
    int64_t shp[2] = {B, T};
    px_tensor x = px_tensor_view(ids, PX_I32, 2, shp), logits;
    st = px_model_forward(model, &x, &logits);
    if (st == PX_OK) {
      FILE *f = fopen(argv[3], "wb");
      const size_t n = (size_t)px_tensor_numel(&logits);
      if (!f || fwrite(px_f32(&logits), sizeof(float), n, f) != n) st = px_error(PX_ERR_IO, "cannot write %s", argv[3]);
      if (f && fclose(f) != 0) st = px_error(PX_ERR_IO, "cannot write %s", argv[3]);
      if (st == PX_OK) printf("vocab %zu, step %lld, checkpoint %s\n", shape.vocab_size, (long long)step, ckpt);
    }
  }
  if (st == PX_OK) rc = 0;
  else fprintf(stderr, "checkpoint_logits: %s\n", px_last_error());
  px_model_free(model);
  px_vocab_free(vocab);
  px_config_free(&cfg);
  free(ids);
  return rc;
}
