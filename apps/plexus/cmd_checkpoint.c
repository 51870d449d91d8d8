// plexus checkpoint consolidate: one safetensors file of the whole model
// from a checkpoint of any layout (DDP's model.safetensors, or every rank's
// model.rank* pieces under ZeRO 3), with the model's state-dict names and
// "format": "pt", which PyTorch's safetensors loaders read.
//
//   plexus checkpoint consolidate runs/x/checkpoints/step_00000600 --out model.safetensors
//
// The tensors and their whole shapes come from the checkpoint itself (a
// plain file's tensors, or the "pieces" tables of the files of pieces);
// the data through px_checkpoint_load_boxes, which checks every file
// against SHA256SUMS and that every element is in exactly one piece.
#define _POSIX_C_SOURCE 200809L
#include "app.h"

#include <cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct whole {
  px_tensor_piece *p;
  int n, cap;
} whole;

// Adds key (shape) once; a key seen with another shape is an error.
static px_status add_key(whole *w, const char *file, const char *key, int ndim, const int64_t *shape) {
  for (int i = 0; i < w->n; i++) {
    if (strcmp(w->p[i].key, key) != 0) continue;
    bool same = w->p[i].ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = w->p[i].shape[d] == shape[d];
    if (!same)
      return px_error(PX_ERR_FORMAT, "%s: tensor \"%s\" has another whole shape than in the other files", file, key);
    return PX_OK;
  }
  if (ndim < 0 || ndim > PX_MAX_DIMS)
    return px_error(PX_ERR_FORMAT, "%s: tensor \"%s\" has %d dimensions", file, key, ndim);
  if (w->n == w->cap) {
    w->cap = w->cap ? 2 * w->cap : 64;
    px_tensor_piece *g = realloc(w->p, (size_t)w->cap * sizeof *g);
    if (!g) return px_error(PX_ERR_NOMEM, "consolidate: out of memory");
    w->p = g;
  }
  px_tensor_piece *q = &w->p[w->n++];
  memset(q, 0, sizeof *q);
  // The key becomes a state-dict name in the output file.
  if (strlen(key) >= sizeof((px_named_tensor *)0)->name)
    return px_error(PX_ERR_FORMAT, "%s: tensor name \"%s\" is longer than %zu bytes", file, key,
                    sizeof((px_named_tensor *)0)->name - 1);
  memcpy(q->key, key, strlen(key) + 1);
  q->ndim = ndim;
  q->count = 1;
  for (int d = 0; d < ndim; d++) {
    q->shape[d] = shape[d];
    q->count *= (size_t)shape[d];
  }
  return PX_OK;
}

// The model's tensors as listed by one file of the checkpoint.
static px_status keys_of(const char *path, whole *w) {
  px_safetensors *f;
  px_status st = px_safetensors_open(path, &f);
  if (st != PX_OK) return st;
  const char *fmt = px_safetensors_metadata(f, "format"), *js = px_safetensors_metadata(f, "pieces");
  if (fmt && strcmp(fmt, PX_PIECES_FORMAT) == 0) {
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    if (!cJSON_IsObject(j)) st = px_error(PX_ERR_FORMAT, "%s: the \"pieces\" metadata is not a JSON object", path);
    for (const cJSON *e = j ? j->child : NULL; st == PX_OK && e; e = e->next) {
      const cJSON *key = cJSON_GetObjectItemCaseSensitive(e, "key"),
                  *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
      if (!cJSON_IsString(key) || !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > PX_MAX_DIMS) {
        st = px_error(PX_ERR_FORMAT, "%s: piece \"%s\" lacks a key or a shape", path, e->string);
        break;
      }
      int64_t s[PX_MAX_DIMS];
      int d = 0;
      for (const cJSON *v = shape->child; v; v = v->next) s[d++] = cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
      for (int k = 0; k < d && st == PX_OK; k++)
        if (s[k] < 0) st = px_error(PX_ERR_FORMAT, "%s: piece \"%s\" has a bad shape", path, e->string);
      if (st == PX_OK) st = add_key(w, path, key->valuestring, d, s);
    }
    cJSON_Delete(j);
  } else {
    for (int i = 0; st == PX_OK && i < px_safetensors_count(f); i++) {
      const px_named_tensor *t = px_safetensors_get(f, i);
      st = add_key(w, path, t->name, t->tensor.ndim, t->tensor.shape);
    }
  }
  px_safetensors_close(f);
  return st;
}

static int consolidate(const char *ckpt_arg, const char *out) {
  char ck[1024], note[2048];
  if (px_app_resolve_checkpoint(ckpt_arg, ck, sizeof ck, note, sizeof note) != PX_OK) {
    fprintf(stderr, "plexus checkpoint consolidate: %s\n", px_last_error());
    return 1;
  }
  if (*note) fprintf(stderr, "%s\n", note);
  whole w = {0};
  px_status st = PX_OK;
  DIR *d = opendir(ck);
  if (!d) st = px_error(PX_ERR_IO, "cannot list %s", ck);
  for (struct dirent *e; st == PX_OK && d && (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (strncmp(e->d_name, "model", 5) != 0 || n < 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0) continue;
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", ck, e->d_name);
    st = keys_of(p, &w);
  }
  if (d) closedir(d);
  if (st == PX_OK && w.n == 0) st = px_error(PX_ERR_NOT_FOUND, "checkpoint %s holds no model*.safetensors", ck);
  float *buf = NULL;
  size_t total = 0;
  for (int i = 0; i < w.n; i++) total += w.p[i].count;
  if (st == PX_OK && !(buf = malloc((total ? total : 1) * sizeof *buf)))
    st = px_error(PX_ERR_NOMEM, "consolidate: out of memory for %zu parameters", total);
  px_state_dict sd = {0};
  if (st == PX_OK && !(sd.items = calloc((size_t)w.n, sizeof *sd.items))) st = px_error(PX_ERR_NOMEM, "out of memory");
  for (size_t i = 0, at = 0; st == PX_OK && i < (size_t)w.n; at += w.p[i].count, i++) {
    w.p[i].data = buf + at;
    memcpy(sd.items[i].name, w.p[i].key, strlen(w.p[i].key) + 1);  // shorter than name: add_key checked
    sd.items[i].tensor = px_tensor_view(w.p[i].data, PX_F32, w.p[i].ndim, w.p[i].shape);
    sd.count++;
  }
  if (st == PX_OK) st = px_checkpoint_load_boxes(ck, "model", w.p, w.n);
  const px_kv meta[1] = {{"format", "pt"}};
  if (st == PX_OK) st = px_safetensors_save(out, &sd, meta, 1);
  free(sd.items);
  free(buf);
  free(w.p);
  if (st != PX_OK) {
    fprintf(stderr, "plexus checkpoint consolidate: %s\n", px_last_error());
    return 1;
  }
  printf("%s: %d tensors, %zu parameters, from %s\n", out, w.n, total, ck);
  return 0;
}

int px_cmd_checkpoint(int argc, char **argv) {
  // argv[0] is "checkpoint".
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    printf("usage: plexus checkpoint consolidate CKPT --out FILE.safetensors\n"
           "  one safetensors file of the whole model (state-dict names, \"format\": \"pt\") from a checkpoint\n"
           "  of any layout (DDP, ZeRO 1-3, any world size); CKPT: a checkpoint or a directory of them (the newest)\n");
    return 0;
  }
  const char *out = px_app_find_option(argc, argv, "out");
  if (argc < 3 || strcmp(argv[1], "consolidate") != 0 || !out || strncmp(argv[2], "--", 2) == 0) {
    fprintf(stderr, "usage: plexus checkpoint consolidate CKPT --out FILE.safetensors\n");
    return 2;
  }
  return consolidate(argv[2], out);
}
