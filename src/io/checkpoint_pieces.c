// Pieces of named tensors in checkpoint files (io.h): how a sharded model
// (ZeRO) is saved without ever being gathered on one rank, and put back.
//
// A piece is the flat range [offset, offset + count) of the row-major
// tensor `key` of a given whole shape.  A file of pieces is a safetensors
// file whose tensors are the pieces, 1-D, named "<key>@<offset>", with
// __metadata__:
//
//   "format":  "plexus-pieces"      "version": "1"
//   "pieces":  {"h.0.ln_1.weight@0": {"key": "h.0.ln_1.weight", "dtype": "F32",
//               "shape": [256], "offset": 0, "count": 128}, ...}
//
// The key and whole shape make a piece mean the same thing under any layout
// (DESIGN decision 8); the next step, loading into another layout, only
// has to intersect ranges.  Two loads exist now: the same layout (each rank
// reads its own file, every piece must match), and the whole tensors in one
// process (every file, every element covered exactly once).
#include "io/checkpoint.h"
#include "io/internal.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t numel_of(int ndim, const int64_t *shape) {
  size_t n = 1;
  for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
  return n;
}

static cJSON *shape_json(int ndim, const int64_t *shape) {
  cJSON *a = cJSON_CreateArray();
  for (int d = 0; a && d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[d]));
  return a;
}

px_status px_pieces_state_dict(const px_tensor_piece *pieces, int n, px_state_dict *sd, char **pieces_json) {
  memset(sd, 0, sizeof *sd);
  *pieces_json = NULL;
  if (n < 0 || (n > 0 && !pieces)) return px_error(PX_ERR_INVALID, "pieces: %d pieces and no array", n);
  sd->items = calloc(n > 0 ? (size_t)n : 1, sizeof *sd->items);
  cJSON *root = cJSON_CreateObject();
  if (!sd->items || !root) {
    cJSON_Delete(root);
    px_state_dict_free(sd);
    return px_error(PX_ERR_NOMEM, "pieces: out of memory");
  }
  px_status st = PX_OK;
  for (int i = 0; i < n && st == PX_OK; i++) {
    const px_tensor_piece *p = &pieces[i];
    px_named_tensor *it = &sd->items[sd->count];
    const size_t whole = numel_of(p->ndim, p->shape);
    if (p->ndim < 0 || p->ndim > PX_MAX_DIMS || p->offset > whole || p->count > whole - p->offset) {
      st = px_error(PX_ERR_INVALID, "pieces: piece %d of \"%s\" covers [%zu, %zu) of a tensor of %zu elements", i,
                    p->key, p->offset, p->offset + p->count, whole);
      break;
    }
    int len = snprintf(it->name, sizeof it->name, "%s@%zu", p->key, p->offset);
    if (len < 0 || len >= (int)sizeof it->name) {
      st = px_error(PX_ERR_INVALID, "pieces: the name \"%s@%zu\" is longer than %d bytes", p->key, p->offset,
                    (int)sizeof it->name - 1);
      break;
    }
    if (cJSON_GetObjectItemCaseSensitive(root, it->name)) {
      st = px_error(PX_ERR_INVALID, "pieces: two pieces are named \"%s\"", it->name);
      break;
    }
    const int64_t len1 = (int64_t)p->count;
    it->tensor = px_tensor_view(p->data, PX_F32, 1, &len1);
    sd->count++;
    cJSON *e = cJSON_AddObjectToObject(root, it->name);
    if (!e) { st = px_error(PX_ERR_NOMEM, "pieces: out of memory"); break; }
    cJSON_AddStringToObject(e, "key", p->key);
    cJSON_AddStringToObject(e, "dtype", "F32");
    cJSON_AddItemToObject(e, "shape", shape_json(p->ndim, p->shape));
    cJSON_AddNumberToObject(e, "offset", (double)p->offset);
    cJSON_AddNumberToObject(e, "count", (double)p->count);
  }
  if (st == PX_OK && !(*pieces_json = cJSON_PrintUnformatted(root))) st = px_error(PX_ERR_NOMEM, "pieces: out of memory");
  cJSON_Delete(root);
  if (st != PX_OK) px_state_dict_free(sd);
  return st;
}

// One entry of a "pieces" table, read and checked for form.
typedef struct piece_entry {
  const char *name, *key;
  int         ndim;
  int64_t     shape[PX_MAX_DIMS];
  size_t      offset, count;
} piece_entry;

static bool json_count(const cJSON *v, size_t *out) {
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
      v->valuedouble != (double)(size_t)v->valuedouble)
    return false;
  *out = (size_t)v->valuedouble;
  return true;
}

static px_status read_entry(const cJSON *e, const char *file, piece_entry *out) {
  memset(out, 0, sizeof *out);
  out->name = e->string;
  const cJSON *key = cJSON_GetObjectItemCaseSensitive(e, "key"), *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
  if (!cJSON_IsObject(e) || !cJSON_IsString(key) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
      !json_count(cJSON_GetObjectItemCaseSensitive(e, "offset"), &out->offset) ||
      !json_count(cJSON_GetObjectItemCaseSensitive(e, "count"), &out->count))
    return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" in the \"pieces\" metadata lacks key, dtype, shape, offset or "
                    "count", file, e->string);
  if (strcmp(dt->valuestring, "F32") != 0)
    return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" has dtype %s; this plexus reads F32 pieces", file, e->string,
                    dt->valuestring);
  out->key = key->valuestring;
  out->ndim = cJSON_GetArraySize(shape);
  if (out->ndim > PX_MAX_DIMS)
    return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" has a shape of %d dimensions", file, e->string, out->ndim);
  int d = 0;
  for (const cJSON *v = shape->child; v; v = v->next, d++) {
    size_t dim;
    if (!json_count(v, &dim)) return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" has a bad shape", file, e->string);
    out->shape[d] = (int64_t)dim;
  }
  size_t whole = numel_of(out->ndim, out->shape);
  if (out->offset > whole || out->count > whole - out->offset)
    return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" covers [%zu, %zu) of a tensor of %zu elements", file, e->string,
                    out->offset, out->offset + out->count, whole);
  return PX_OK;
}

// The file's "pieces" table, checked against its format and version.
static px_status pieces_table(const px_safetensors *f, cJSON **out) {
  *out = NULL;
  const char *path = px_safetensors_path(f);
  const char *fmt = px_safetensors_metadata(f, "format"), *ver = px_safetensors_metadata(f, "version");
  const char *js = px_safetensors_metadata(f, "pieces");
  if (!fmt || strcmp(fmt, PX_PIECES_FORMAT) != 0 || !js)
    return px_error(PX_ERR_FORMAT, "%s: not a file of tensor pieces (its metadata lacks \"format\": \"%s\" or "
                    "\"pieces\")", path, PX_PIECES_FORMAT);
  if (!ver || strcmp(ver, PX_PIECES_VERSION) != 0)
    return px_error(PX_ERR_FORMAT, "%s: pieces version %s; this plexus reads version %s", path, ver ? ver : "(none)",
                    PX_PIECES_VERSION);
  cJSON *j = cJSON_Parse(js);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return px_error(PX_ERR_FORMAT, "%s: the \"pieces\" metadata is not a JSON object", path);
  }
  *out = j;
  return PX_OK;
}

// A checkpoint's file, read whole (checked against SHA256SUMS) and opened.
static px_status open_checked(const char *ckpt, const char *name, px_safetensors **f) {
  void *bytes;
  size_t n;
  px_status st = px_checkpoint_read_file(ckpt, name, &bytes, &n);
  if (st != PX_OK) return st;
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", ckpt, name);
  return px_st_open_buffer(path, bytes, n, f);  // owns bytes from here on
}

px_status px_checkpoint_load_pieces(const char *ckpt_path, const char *name, const px_tensor_piece *pieces, int n) {
  px_state_dict sd;
  char *json;
  px_status st = px_pieces_state_dict(pieces, n, &sd, &json);
  if (st != PX_OK) return st;
  free(json);
  px_safetensors *f = NULL;
  cJSON *table = NULL;
  if ((st = open_checked(ckpt_path, name, &f)) != PX_OK) goto done;
  if ((st = pieces_table(f, &table)) != PX_OK) goto done;
  const char *path = px_safetensors_path(f);
  if (cJSON_GetArraySize(table) != n) {
    st = px_error(PX_ERR_INVALID, "%s holds %d pieces; this run expects %d here (saved with another layout or model?)",
                  path, cJSON_GetArraySize(table), n);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    const px_tensor_piece *p = &pieces[i];
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(table, sd.items[i].name);
    piece_entry pe;
    if (!e) {
      st = px_error(PX_ERR_INVALID, "%s has no piece \"%s\" (%s [%zu, %zu)): saved with another layout or model?",
                    path, sd.items[i].name, p->key, p->offset, p->offset + p->count);
      goto done;
    }
    if ((st = read_entry(e, path, &pe)) != PX_OK) goto done;
    bool same = strcmp(pe.key, p->key) == 0 && pe.count == p->count && pe.ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = pe.shape[d] == p->shape[d];
    if (!same) {
      char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX];
      st = px_error(PX_ERR_INVALID, "%s: piece \"%s\" is %zu elements of %s %s; this run expects %zu of %s %s", path,
                    sd.items[i].name, pe.count, pe.key, px_shape_str(pe.ndim, pe.shape, a, sizeof a), p->count, p->key,
                    px_shape_str(p->ndim, p->shape, b, sizeof b));
      goto done;
    }
  }
  st = px_st_load_open(f, &sd, true);
done:
  cJSON_Delete(table);
  if (f) px_safetensors_close(f);
  px_state_dict_free(&sd);
  return st;
}

/* ---- assembling whole tensors --------------------------------------------- */

typedef struct cover {
  int    item;
  size_t offset, count;
  int    file;  // index into the list of files, for messages
} cover;

static int by_item_offset(const void *a, const void *b) {
  const cover *x = a, *y = b;
  if (x->item != y->item) return x->item < y->item ? -1 : 1;
  return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

static bool has_suffix(const char *s, const char *suf) {
  size_t n = strlen(s), k = strlen(suf);
  return n >= k && strcmp(s + n - k, suf) == 0;
}

px_status px_checkpoint_assemble(const char *ckpt_path, const char *prefix, const px_state_dict *sd, bool strict) {
  if (!ckpt_path || !prefix || !sd) return px_error(PX_ERR_INVALID, "checkpoint: assemble: NULL argument");
  px_ckpt_sums sums;
  px_status st = px_ckpt_sums_read(ckpt_path, &sums);
  if (st != PX_OK) return st;
  cover *cov = NULL;
  size_t n_cov = 0, cap_cov = 0;
  int files = 0;
  for (int s = 0; s < sums.n && st == PX_OK; s++) {
    const char *name = sums.items[s].name;
    if (strncmp(name, prefix, strlen(prefix)) != 0 || !has_suffix(name, ".safetensors")) continue;
    files++;
    px_safetensors *f = NULL;
    cJSON *table = NULL;
    if ((st = open_checked(ckpt_path, name, &f)) == PX_OK) st = pieces_table(f, &table);
    for (const cJSON *e = table ? table->child : NULL; st == PX_OK && e; e = e->next) {
      const char *path = px_safetensors_path(f);
      piece_entry pe;
      if ((st = read_entry(e, path, &pe)) != PX_OK) break;
      const px_named_tensor *t = px_safetensors_find(f, pe.name);
      if (!t || t->tensor.dtype != PX_F32 || t->tensor.ndim != 1 || (size_t)t->tensor.shape[0] != pe.count) {
        st = px_error(PX_ERR_FORMAT, "%s: piece \"%s\" is listed in the metadata but the file holds no F32 tensor "
                      "of %zu elements by that name", path, pe.name, pe.count);
        break;
      }
      int item = px_state_dict_find(sd, pe.key);
      if (item < 0) {
        if (strict) st = px_error(PX_ERR_INVALID, "%s: piece \"%s\" is of tensor \"%s\", which this model does not "
                                  "have (another model?)", path, pe.name, pe.key);
        continue;
      }
      const px_tensor *dst = &sd->items[item].tensor;
      bool same = dst->dtype == PX_F32 && dst->ndim == pe.ndim;
      for (int d = 0; same && d < pe.ndim; d++) same = dst->shape[d] == pe.shape[d];
      if (!same) {
        char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX];
        st = px_error(PX_ERR_SHAPE, "%s: tensor \"%s\" has shape %s in the checkpoint but the model expects %s %s; was "
                      "it saved from another model?", path, pe.key, px_shape_str(pe.ndim, pe.shape, a, sizeof a),
                      px_dtype_name(dst->dtype), px_shape_str(dst->ndim, dst->shape, b, sizeof b));
        break;
      }
      if (n_cov == cap_cov) {
        cap_cov = cap_cov ? 2 * cap_cov : 64;
        cover *grown = realloc(cov, cap_cov * sizeof *cov);
        if (!grown) { st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt_path); break; }
        cov = grown;
      }
      cov[n_cov++] = (cover){item, pe.offset, pe.count, s};
      // Pieces are little-endian F32 as stored; this machine is too (the
      // safetensors reader assumes it throughout).
      memcpy((float *)dst->data + pe.offset, t->tensor.data, pe.count * sizeof(float));
    }
    cJSON_Delete(table);
    if (f) px_safetensors_close(f);
  }
  if (st == PX_OK && files == 0)
    st = px_error(PX_ERR_NOT_FOUND, "checkpoint %s has no file \"%s*.safetensors\" of pieces", ckpt_path, prefix);
  // Every element of every tensor exactly once: sorted by (tensor, offset),
  // the pieces of a tensor must tile [0, numel) without gap or overlap.
  if (st == PX_OK) {
    if (n_cov) qsort(cov, n_cov, sizeof *cov, by_item_offset);
    size_t k = 0;
    for (int i = 0; i < sd->count && st == PX_OK; i++) {
      const size_t numel = (size_t)px_tensor_numel(&sd->items[i].tensor);
      size_t at = 0;
      for (; k < n_cov && cov[k].item == i; k++) {
        if (cov[k].offset != at) {
          st = px_error(PX_ERR_FORMAT, "checkpoint %s: tensor \"%s\": elements [%zu, %zu) are %s (%s)", ckpt_path,
                        sd->items[i].name, cov[k].offset < at ? cov[k].offset : at,
                        cov[k].offset < at ? at : cov[k].offset,
                        cov[k].offset < at ? "in two pieces" : "in no piece", sums.items[cov[k].file].name);
          break;
        }
        at += cov[k].count;
      }
      if (st == PX_OK && at != numel)
        st = px_error(PX_ERR_FORMAT, "checkpoint %s: tensor \"%s\": elements [%zu, %zu) are in no piece of the files "
                      "%s*.safetensors (a rank's file missing?)", ckpt_path, sd->items[i].name, at, numel, prefix);
    }
  }
  free(cov);
  px_ckpt_sums_free(&sums);
  return st;
}

/* ---- loading by intersection (any saved layout into any current one) ----- */

// One saved range copied into a wanted piece: elements [lo, hi) of the
// tensor, from file `file` (an index into SHA256SUMS, for messages).
typedef struct hit {
  int    want;
  size_t lo, hi;
  int    file;
} hit;

static int by_want_lo(const void *a, const void *b) {
  const hit *x = a, *y = b;
  if (x->want != y->want) return x->want < y->want ? -1 : 1;
  return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

// A saved range [offset, offset + count) of tensor `key` (whole shape
// ndim/shape), its elements at `data`: copy what overlaps each wanted piece
// of the same key into that piece's staging buffer and note the hit.
static px_status intersect(const px_tensor_piece *want, int n_want, float *const *stage, const char *path, int file,
                           const char *key, int ndim, const int64_t *shape, size_t offset, size_t count,
                           const float *data, hit **hits, size_t *n_hits, size_t *cap_hits) {
  for (int w = 0; w < n_want; w++) {
    const px_tensor_piece *p = &want[w];
    if (strcmp(p->key, key) != 0) continue;
    bool same = p->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = p->shape[d] == shape[d];
    if (!same) {
      char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX];
      return px_error(PX_ERR_SHAPE, "%s: tensor \"%s\" has shape %s in the checkpoint but this run expects %s; was it "
                      "saved from another model?", path, key, px_shape_str(ndim, shape, a, sizeof a),
                      px_shape_str(p->ndim, p->shape, b, sizeof b));
    }
    // [lo, hi) = [offset, offset + count) ∩ [p.offset, p.offset + p.count)
    const size_t lo = offset > p->offset ? offset : p->offset;
    const size_t hi = offset + count < p->offset + p->count ? offset + count : p->offset + p->count;
    if (hi <= lo) continue;
    if (*n_hits == *cap_hits) {
      *cap_hits = *cap_hits ? 2 * *cap_hits : 64;
      hit *grown = realloc(*hits, *cap_hits * sizeof **hits);
      if (!grown) return px_error(PX_ERR_NOMEM, "%s: out of memory", path);
      *hits = grown;
    }
    (*hits)[(*n_hits)++] = (hit){w, lo, hi, file};
    memcpy(stage[w] + (lo - p->offset), data + (lo - offset), (hi - lo) * sizeof(float));
  }
  return PX_OK;
}

px_status px_checkpoint_load_boxes(const char *ckpt_path, const char *prefix, const px_tensor_piece *want, int n) {
  if (!ckpt_path || !prefix || n < 0 || (n > 0 && !want))
    return px_error(PX_ERR_INVALID, "checkpoint: load_boxes: NULL argument");
  for (int w = 0; w < n; w++) {
    const px_tensor_piece *p = &want[w];
    const size_t whole = numel_of(p->ndim, p->shape);
    if (p->ndim < 0 || p->ndim > PX_MAX_DIMS || p->offset > whole || p->count > whole - p->offset ||
        (p->count && !p->data))
      return px_error(PX_ERR_INVALID, "checkpoint: load_boxes: wanted piece %d of \"%s\" covers [%zu, %zu) of a "
                      "tensor of %zu elements", w, p->key, p->offset, p->offset + p->count, whole);
  }
  px_ckpt_sums sums;
  px_status st = px_ckpt_sums_read(ckpt_path, &sums);
  if (st != PX_OK) return st;
  // Staging: what is read goes here first, and into the caller's memory
  // only once every wanted element is found exactly once (all or nothing).
  size_t total = 0;
  for (int w = 0; w < n; w++) total += want[w].count;
  float *buf = malloc((total ? total : 1) * sizeof(float));
  float **stage = calloc(n > 0 ? (size_t)n : 1, sizeof *stage);
  hit *hits = NULL;
  size_t n_hits = 0, cap_hits = 0;
  if (!buf || !stage) st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt_path);
  for (size_t w = 0, at = 0; st == PX_OK && w < (size_t)n; at += want[w].count, w++) stage[w] = buf + at;
  int files = 0;
  for (int s = 0; s < sums.n && st == PX_OK; s++) {
    const char *name = sums.items[s].name;
    if (strncmp(name, prefix, strlen(prefix)) != 0 || !has_suffix(name, ".safetensors")) continue;
    files++;
    if (n == 0) continue;
    px_safetensors *f = NULL;
    cJSON *table = NULL;
    if ((st = open_checked(ckpt_path, name, &f)) != PX_OK) break;
    const char *path = px_safetensors_path(f);
    const char *fmt = px_safetensors_metadata(f, "format");
    if (fmt && strcmp(fmt, PX_PIECES_FORMAT) == 0) {
      // A file of pieces: each tensor a flat range of a named tensor.
      st = pieces_table(f, &table);
      for (const cJSON *e = table ? table->child : NULL; st == PX_OK && e; e = e->next) {
        piece_entry pe;
        if ((st = read_entry(e, path, &pe)) != PX_OK) break;
        const px_named_tensor *t = px_safetensors_find(f, pe.name);
        if (!t || t->tensor.dtype != PX_F32 || t->tensor.ndim != 1 || (size_t)t->tensor.shape[0] != pe.count) {
          st = px_error(PX_ERR_FORMAT, "%s: piece \"%s\" is listed in the metadata but the file holds no F32 tensor "
                        "of %zu elements by that name", path, pe.name, pe.count);
          break;
        }
        st = intersect(want, n, stage, path, s, pe.key, pe.ndim, pe.shape, pe.offset, pe.count, t->tensor.data,
                       &hits, &n_hits, &cap_hits);
      }
    } else {
      // A whole state dict (DDP's model.safetensors, optim.safetensors): each
      // tensor is the piece [0, numel) of itself.
      for (int i = 0; st == PX_OK && i < px_safetensors_count(f); i++) {
        const px_named_tensor *t = px_safetensors_get(f, i);
        bool wanted = false;
        for (int w = 0; !wanted && w < n; w++) wanted = strcmp(want[w].key, t->name) == 0;
        if (!wanted) continue;
        if (t->tensor.dtype != PX_F32) {
          st = px_error(PX_ERR_FORMAT, "%s: tensor \"%s\" is %s; this plexus loads F32", path, t->name,
                        px_dtype_name(t->tensor.dtype));
          break;
        }
        st = intersect(want, n, stage, path, s, t->name, t->tensor.ndim, t->tensor.shape, 0,
                       (size_t)px_tensor_numel(&t->tensor), t->tensor.data, &hits, &n_hits, &cap_hits);
      }
    }
    cJSON_Delete(table);
    px_safetensors_close(f);
  }
  if (st == PX_OK && files == 0)
    st = px_error(PX_ERR_NOT_FOUND, "checkpoint %s has no file \"%s*.safetensors\"", ckpt_path, prefix);
  // Every wanted element exactly once: sorted by (piece, lo), the hits of a
  // wanted piece must tile it without gap or overlap.
  if (st == PX_OK) {
    if (n_hits) qsort(hits, n_hits, sizeof *hits, by_want_lo);
    size_t k = 0;
    for (int w = 0; w < n && st == PX_OK; w++) {
      const px_tensor_piece *p = &want[w];
      size_t at = p->offset;
      int last_file = -1;
      for (; k < n_hits && hits[k].want == w; k++) {
        if (hits[k].lo != at) {
          const bool two = hits[k].lo < at;
          st = px_error(PX_ERR_FORMAT, "checkpoint %s: tensor \"%s\": elements [%zu, %zu) are %s (%s%s%s)",
                        ckpt_path, p->key, two ? hits[k].lo : at, two ? at : hits[k].lo,
                        two ? "in two saved pieces" : "in no saved piece", sums.items[hits[k].file].name,
                        last_file >= 0 ? ", after " : "", last_file >= 0 ? sums.items[last_file].name : "");
          break;
        }
        at = hits[k].hi;
        last_file = hits[k].file;
      }
      if (st == PX_OK && at != p->offset + p->count)
        st = px_error(PX_ERR_FORMAT, "checkpoint %s: tensor \"%s\": elements [%zu, %zu) are in no saved piece of the "
                      "files %s*.safetensors (a rank's file missing, or another model?)", ckpt_path, p->key, at,
                      p->offset + p->count, prefix);
    }
  }
  if (st == PX_OK)
    for (int w = 0; w < n; w++) memcpy(want[w].data, stage[w], want[w].count * sizeof(float));
  free(hits);
  free(stage);
  free(buf);
  px_ckpt_sums_free(&sums);
  return st;
}
