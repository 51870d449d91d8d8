/* ckpt_test_util.h — what the checkpoint tests share: a small model-like
 * state (two state dicts and a JSON blob), and file surgery (flip a byte,
 * truncate, list a directory). */
#ifndef PX_CKPT_TEST_UTIL_H
#define PX_CKPT_TEST_UTIL_H

#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A training state: model weights (f32, f64, i64 and an empty tensor),
 * optimizer moments, and state.json.  seed changes every value. */
typedef struct ckpt_state {
  float w[2][3], b[3], m[9], v[9];
  double scale[2];
  int64_t steps;
  float empty[1];
  char json[96];
  px_named_tensor model_t[5], optim_t[2];
  px_state_dict model, optim;
  px_ckpt_item items[3];
} ckpt_state;

static inline void ckpt_state_init(ckpt_state *s, int seed) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < 6; i++) s->w[i / 3][i % 3] = (float)(seed * 100 + i) * 0.5f;
  for (int i = 0; i < 3; i++) s->b[i] = -(float)(seed + i);
  for (int i = 0; i < 9; i++) {
    s->m[i] = (float)(seed * 7 + i);
    s->v[i] = (float)(seed + i) * 0.25f;
  }
  s->scale[0] = 1.0 / (seed + 3);
  s->scale[1] = -2.5 * seed;
  s->steps = 1000 + seed;
  snprintf(s->json, sizeof s->json, "{\"step\": %d, \"epoch\": %d}\n", seed, seed / 10);
  int64_t shape2[1] = {2}, shape0[1] = {0}, scalar[1] = {1};
  snprintf(s->model_t[0].name, PX_NAME_MAX, "0.weight");
  s->model_t[0].tensor = px_tensor_f32(&s->w[0][0], 2, 2, 3, 0, 0);
  snprintf(s->model_t[1].name, PX_NAME_MAX, "0.bias");
  s->model_t[1].tensor = px_tensor_f32(s->b, 1, 3, 0, 0, 0);
  snprintf(s->model_t[2].name, PX_NAME_MAX, "1.scale");
  s->model_t[2].tensor = px_tensor_view(s->scale, PX_F64, 1, shape2);
  snprintf(s->model_t[3].name, PX_NAME_MAX, "1.steps");
  s->model_t[3].tensor = px_tensor_view(&s->steps, PX_I64, 0, scalar);
  snprintf(s->model_t[4].name, PX_NAME_MAX, "2.empty");
  s->model_t[4].tensor = px_tensor_view(s->empty, PX_F32, 1, shape0);
  snprintf(s->optim_t[0].name, PX_NAME_MAX, "exp_avg");
  s->optim_t[0].tensor = px_tensor_f32(s->m, 1, 9, 0, 0, 0);
  snprintf(s->optim_t[1].name, PX_NAME_MAX, "exp_avg_sq");
  s->optim_t[1].tensor = px_tensor_f32(s->v, 1, 9, 0, 0, 0);
  s->model = (px_state_dict){s->model_t, 5};
  s->optim = (px_state_dict){s->optim_t, 2};
  static const px_kv meta[1] = {{"format", "pt"}};
  s->items[0] = (px_ckpt_item){.name = "model.safetensors", .tensors = &s->model, .metadata = meta, .n_metadata = 1};
  s->items[1] = (px_ckpt_item){.name = "optim.safetensors", .tensors = &s->optim};
  s->items[2] = (px_ckpt_item){.name = "state.json", .bytes = s->json, .n_bytes = strlen(s->json)};
}

/* Zero every value, keep the views (a model about to be loaded). */
static inline void ckpt_state_zero(ckpt_state *s) {
  memset(s->w, 0, sizeof s->w);
  memset(s->b, 0, sizeof s->b);
  memset(s->m, 0, sizeof s->m);
  memset(s->v, 0, sizeof s->v);
  memset(s->scale, 0, sizeof s->scale);
  s->steps = 0;
}

static inline bool ckpt_state_equal(const ckpt_state *a, const ckpt_state *b) {
  return !memcmp(a->w, b->w, sizeof a->w) && !memcmp(a->b, b->b, sizeof a->b) && !memcmp(a->m, b->m, sizeof a->m) &&
    !memcmp(a->v, b->v, sizeof a->v) && !memcmp(a->scale, b->scale, sizeof a->scale) && a->steps == b->steps;
}

/* Load model and optimizer of checkpoint ckpt into s; status of the first failure. */
static inline px_status ckpt_state_load(const char *ckpt, ckpt_state *s) {
  px_status st = px_checkpoint_load_tensors(ckpt, "model.safetensors", &s->model, true);
  if (st == PX_OK) st = px_checkpoint_load_tensors(ckpt, "optim.safetensors", &s->optim, true);
  return st;
}

/* Names in dir (not . and ..), sorted, joined by spaces; -1 if it cannot be read. */
static inline int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static inline int ckpt_list_dir(const char *dir, char *out, size_t len) {
  DIR *dp = opendir(dir);
  out[0] = '\0';
  if (!dp) return -1;
  char *names[256];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dp)) && n < 256) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    names[n++] = strdup(e->d_name);
  }
  closedir(dp);
  qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
  for (int i = 0; i < n; i++) {
    size_t k = strlen(out);
    snprintf(out + k, len - k, "%s%s", i ? " " : "", names[i]);
    free(names[i]);
  }
  return n;
}

static inline long ckpt_file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* XOR one byte at offset (negative: from the end) with 0x01. */
static inline bool ckpt_flip_byte(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  if (!f) return false;
  long size = ckpt_file_size(path);
  long at = offset < 0 ? size + offset : offset;
  bool ok = at >= 0 && at < size && fseek(f, at, SEEK_SET) == 0;
  int c = ok ? fgetc(f) : EOF;
  ok = ok && c != EOF && fseek(f, at, SEEK_SET) == 0 && fputc(c ^ 0x01, f) != EOF;
  return fclose(f) == 0 && ok;
}

static inline bool ckpt_write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(text, 1, strlen(text), f) == strlen(text);
  return fclose(f) == 0 && ok;
}

/* Whole file as a NUL-terminated malloc'ed string (NULL if unreadable). */
static inline char *ckpt_read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  long n = ckpt_file_size(path);
  char *s = malloc((size_t)(n < 0 ? 0 : n) + 1);
  size_t got = s ? fread(s, 1, (size_t)(n < 0 ? 0 : n), f) : 0;
  fclose(f);
  if (s) s[got] = '\0';
  return s;
}

static inline void ckpt_rm_rf(const char *path) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

#endif
