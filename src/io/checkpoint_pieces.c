// Pieces of named tensors in checkpoint files (io.h): how a sharded model
// (ZeRO, tensor parallel) is saved without ever being gathered on one rank,
// and put back.
//
// A piece is the flat range [offset, offset + count) of a box of the
// row-major tensor `key` of a given whole shape.  A file of pieces is a
// safetensors file whose tensors are the pieces, 1-D, named
// "<key>@<offset>" (a whole-tensor box) or "<key>[a:b, c:d]@<offset>", with
// __metadata__:
//
//   "format":  "plexus-pieces"      "version": "2"
//   "pieces":  {"h.0.ln_1.weight@0": {"key": "h.0.ln_1.weight", "dtype": "F32",
//               "shape": [256], "offset": 0, "count": 128},
//               "h.0.attn.c_attn.weight[0:64, 64:128]@0": {..., "shape": [64, 192],
//               "box_offset": [0, 64], "box_size": [64, 64], "offset": 0, "count": 4096}, ...}
//
// Version 1 had no boxes (every piece a flat range of the whole tensor);
// its files read as version 2 files whose boxes are all whole, which is
// also how version 2 writes a whole-tensor piece (box_offset and box_size
// omitted).  The key and whole shape make a piece mean the same thing under
// any layout (DESIGN decision 8), so loading into another layout only has
// to intersect (checkpoint_boxes.c).
#include "io/checkpoint.h"
#include "io/internal.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *ints_json(int ndim, const int64_t *v) {
  cJSON *a = cJSON_CreateArray();
  for (int d = 0; a && d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[d]));
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
    px_ckpt_box b;
    char why[160], box[256];
    if (!px_ckpt_box_of(p, &b, why, sizeof why)) {
      st = px_error(PX_ERR_INVALID, "pieces: piece %d of \"%s\" is %s", i, p->key, why);
      break;
    }
    // An empty piece holds nothing, and two of a key would share a name.
    if (p->count == 0) continue;
    const bool whole = px_ckpt_box_whole(&b);
    px_ckpt_box_str(&b, box, sizeof box);
    int len = snprintf(it->name, sizeof it->name, "%s%s@%zu", p->key, box, p->offset);
    if (len < 0 || len >= (int)sizeof it->name) {
      st = px_error(PX_ERR_INVALID, "pieces: the name \"%s%s@%zu\" is longer than %d bytes", p->key, box, p->offset,
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
    if (!e) {
      st = px_error(PX_ERR_NOMEM, "pieces: out of memory");
      break;
    }
    cJSON_AddStringToObject(e, "key", p->key);
    cJSON_AddStringToObject(e, "dtype", "F32");
    cJSON_AddItemToObject(e, "shape", ints_json(p->ndim, p->shape));
    if (!whole) {
      cJSON_AddItemToObject(e, "box_offset", ints_json(p->ndim, p->box_offset));
      cJSON_AddItemToObject(e, "box_size", ints_json(p->ndim, p->box_size));
    }
    cJSON_AddNumberToObject(e, "offset", (double)p->offset);
    cJSON_AddNumberToObject(e, "count", (double)p->count);
  }
  if (st == PX_OK && !(*pieces_json = cJSON_PrintUnformatted(root)))
    st = px_error(PX_ERR_NOMEM, "pieces: out of memory");
  cJSON_Delete(root);
  if (st != PX_OK) px_state_dict_free(sd);
  return st;
}

static bool json_count(const cJSON *v, size_t *out) {
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
      v->valuedouble != (double)(size_t)v->valuedouble)
    return false;
  *out = (size_t)v->valuedouble;
  return true;
}

// A JSON array of at most PX_MAX_DIMS counts into v; its length into *n.
static bool json_ints(const cJSON *a, int64_t *v, int *n) {
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > PX_MAX_DIMS) return false;
  int d = 0;
  for (const cJSON *x = a->child; x; x = x->next, d++) {
    size_t k;
    if (!json_count(x, &k)) return false;
    v[d] = (int64_t)k;
  }
  *n = d;
  return true;
}

px_status px_ckpt_piece_entry_read(const cJSON *e, const char *file, int version, px_ckpt_piece_entry *out) {
  memset(out, 0, sizeof *out);
  out->name = e->string;
  const cJSON *key = cJSON_GetObjectItemCaseSensitive(e, "key"), *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *bo = cJSON_GetObjectItemCaseSensitive(e, "box_offset"),
              *bs = cJSON_GetObjectItemCaseSensitive(e, "box_size");
  px_tensor_piece p;
  memset(&p, 0, sizeof p);
  if (!cJSON_IsObject(e) || !cJSON_IsString(key) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
      !json_count(cJSON_GetObjectItemCaseSensitive(e, "offset"), &p.offset) ||
      !json_count(cJSON_GetObjectItemCaseSensitive(e, "count"), &p.count))
    return px_error(PX_ERR_FORMAT,
                    "%s: piece \"%s\" in the \"pieces\" metadata lacks key, dtype, shape, offset or "
                    "count",
                    file, e->string);
  if (strcmp(dt->valuestring, "F32") != 0)
    return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" has dtype %s; this plexus reads F32 pieces", file, e->string,
                    dt->valuestring);
  if (!json_ints(shape, p.shape, &p.ndim))
    return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" has a bad shape (at most %d non-negative integers)", file,
                    e->string, PX_MAX_DIMS);
  if ((bo || bs) && version < 2)
    return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" has a box in a version-%d file (boxes came with version 2)", file,
                    e->string, version);
  if (bo || bs) {
    int n1 = -1, n2 = -1;
    if (!json_ints(bo, p.box_offset, &n1) || !json_ints(bs, p.box_size, &n2) || n1 != p.ndim || n2 != p.ndim)
      return px_error(PX_ERR_FORMAT,
                      "%s: piece \"%s\": box_offset and box_size must both be given, %d non-negative "
                      "integers each",
                      file, e->string, p.ndim);
    // An explicit box of all-zero sizes would read as "the whole tensor".
    bool zero = p.ndim > 0;
    for (int d = 0; d < p.ndim; d++) zero = zero && p.box_size[d] == 0;
    if (zero && p.count != 0)
      return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" holds %zu elements of an empty box", file, e->string, p.count);
  }
  snprintf(p.key, sizeof p.key, "%s", key->valuestring);
  char why[160];
  if (strlen(key->valuestring) >= sizeof p.key || !px_ckpt_box_of(&p, &out->box, why, sizeof why))
    return px_error(PX_ERR_FORMAT, "%s: piece \"%s\" is %s", file, e->string,
                    strlen(key->valuestring) >= sizeof p.key ? "named by too long a key" : why);
  out->box.key = key->valuestring;
  return PX_OK;
}

px_status px_ckpt_pieces_table_json(const char *path, const char *fmt, const char *ver, const char *js, cJSON **out) {
  *out = NULL;
  if (!fmt || strcmp(fmt, PX_PIECES_FORMAT) != 0 || !js)
    return px_error(PX_ERR_FORMAT,
                    "%s: not a file of tensor pieces (its metadata lacks \"format\": \"%s\" or "
                    "\"pieces\")",
                    path, PX_PIECES_FORMAT);
  if (!ver || (strcmp(ver, "1") != 0 && strcmp(ver, "2") != 0))
    return px_error(PX_ERR_FORMAT,
                    "%s: pieces version %s; this plexus reads versions 1 and %s (a newer plexus wrote "
                    "it?)",
                    path, ver ? ver : "(none)", PX_PIECES_VERSION);
  cJSON *j = cJSON_Parse(js);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return px_error(PX_ERR_FORMAT, "%s: the \"pieces\" metadata is not a JSON object", path);
  }
  *out = j;
  return PX_OK;
}

px_status px_ckpt_pieces_table(const px_safetensors *f, cJSON **out) {
  return px_ckpt_pieces_table_json(px_safetensors_path(f), px_safetensors_metadata(f, "format"),
                                   px_safetensors_metadata(f, "version"), px_safetensors_metadata(f, "pieces"), out);
}

int px_ckpt_pieces_version(const px_safetensors *f) {
  const char *v = px_safetensors_metadata(f, "version");
  return v && strcmp(v, "1") == 0 ? 1 : 2;
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
  if ((st = px_ckpt_pieces_table(f, &table)) != PX_OK) goto done;
  const char *path = px_safetensors_path(f);
  const int version = px_ckpt_pieces_version(f);
  if (cJSON_GetArraySize(table) != sd.count) {
    st = px_error(PX_ERR_INVALID, "%s holds %d pieces; this run expects %d here (saved with another layout or model?)",
                  path, cJSON_GetArraySize(table), sd.count);
    goto done;
  }
  // sd.items[i] is the i-th non-empty piece (px_pieces_state_dict skips
  // empty ones).
  for (int i = 0, k = 0; i < sd.count; i++, k++) {
    while (pieces[k].count == 0) k++;
    const px_tensor_piece *p = &pieces[k];
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(table, sd.items[i].name);
    px_ckpt_piece_entry pe;
    if (!e) {
      st = px_error(PX_ERR_INVALID, "%s has no piece \"%s\" (%s [%zu, %zu)): saved with another layout or model?", path,
                    sd.items[i].name, p->key, p->offset, p->offset + p->count);
      goto done;
    }
    if ((st = px_ckpt_piece_entry_read(e, path, version, &pe)) != PX_OK) goto done;
    px_ckpt_box mine;
    char why[160];
    px_ckpt_box_of(p, &mine, why, sizeof why);  // checked by px_pieces_state_dict
    bool same = strcmp(pe.box.key, p->key) == 0 && pe.box.count == p->count && pe.box.ndim == mine.ndim;
    for (int d = 0; same && d < mine.ndim; d++)
      same = pe.box.shape[d] == mine.shape[d] && pe.box.off[d] == mine.off[d] && pe.box.size[d] == mine.size[d];
    if (!same) {
      char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX];
      st = px_error(PX_ERR_INVALID, "%s: piece \"%s\" is %zu elements of %s %s; this run expects %zu of %s %s", path,
                    sd.items[i].name, pe.box.count, pe.box.key, px_shape_str(pe.box.ndim, pe.box.shape, a, sizeof a),
                    p->count, p->key, px_shape_str(p->ndim, p->shape, b, sizeof b));
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

static bool has_suffix(const char *s, const char *suf) {
  size_t n = strlen(s), k = strlen(suf);
  return n >= k && strcmp(s + n - k, suf) == 0;
}

static px_status load_boxes(const char *ckpt_path, const char *prefix, const px_tensor_piece *want, int n, bool strict,
                            bool pieces_only);

px_status px_checkpoint_assemble(const char *ckpt_path, const char *prefix, const px_state_dict *sd, bool strict) {
  if (!ckpt_path || !prefix || !sd) return px_error(PX_ERR_INVALID, "checkpoint: assemble: NULL argument");
  // Every tensor of sd whole: the loader's wanted pieces.
  px_tensor_piece *want = calloc(sd->count > 0 ? (size_t)sd->count : 1, sizeof *want);
  if (!want) return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt_path);
  px_status st = PX_OK;
  for (int i = 0; i < sd->count && st == PX_OK; i++) {
    const px_named_tensor *t = &sd->items[i];
    px_tensor_piece *p = &want[i];
    if (t->tensor.dtype != PX_F32 || strlen(t->name) >= sizeof p->key) {
      st = px_error(PX_ERR_INVALID, "checkpoint %s: assemble: tensor \"%s\" is %s; pieces are F32", ckpt_path, t->name,
                    px_dtype_name(t->tensor.dtype));
      break;
    }
    memcpy(p->key, t->name, strlen(t->name) + 1);
    p->ndim = t->tensor.ndim;
    memcpy(p->shape, t->tensor.shape, sizeof p->shape);
    p->count = (size_t)px_tensor_numel(&t->tensor);
    p->data = t->tensor.data;
  }
  if (st == PX_OK) st = load_boxes(ckpt_path, prefix, want, sd->count, strict, true);
  free(want);
  return st;
}

/* ---- loading by intersection (any saved layout into any current one) ----- */

px_status px_checkpoint_load_boxes(const char *ckpt_path, const char *prefix, const px_tensor_piece *want, int n) {
  if (!ckpt_path || !prefix || n < 0 || (n > 0 && !want))
    return px_error(PX_ERR_INVALID, "checkpoint: load_boxes: NULL argument");
  return load_boxes(ckpt_path, prefix, want, n, false, false);
}

// Without an index: every file "<prefix>*.safetensors" is read whole
// (checked against SHA256SUMS) and each of its pieces (or, in a plain state
// dict, each wanted tensor whole) is fed to the loader.
static px_status load_whole_files(px_ckpt_loader *L, const px_ckpt_sums *sums, bool pieces_only, int *files) {
  px_status st = PX_OK;
  for (int s = 0; s < sums->n && st == PX_OK; s++) {
    const char *name = sums->items[s].name;
    if (strncmp(name, L->prefix, strlen(L->prefix)) != 0 || !has_suffix(name, ".safetensors")) continue;
    (*files)++;
    if (L->n == 0 && !L->strict) continue;
    px_safetensors *f = NULL;
    cJSON *table = NULL;
    if ((st = open_checked(L->ckpt, name, &f)) != PX_OK) break;
    const char *path = px_safetensors_path(f);
    const char *fmt = px_safetensors_metadata(f, "format");
    if (pieces_only || (fmt && strcmp(fmt, PX_PIECES_FORMAT) == 0)) {
      // A file of pieces: each tensor a flat range of a box of a named tensor.
      st = px_ckpt_pieces_table(f, &table);
      const int version = px_ckpt_pieces_version(f);
      for (const cJSON *e = table ? table->child : NULL; st == PX_OK && e; e = e->next) {
        px_ckpt_piece_entry pe;
        if ((st = px_ckpt_piece_entry_read(e, path, version, &pe)) != PX_OK) break;
        const px_named_tensor *t = px_safetensors_find(f, pe.name);
        if (!t || t->tensor.dtype != PX_F32 || t->tensor.ndim != 1 || (size_t)t->tensor.shape[0] != pe.box.count) {
          st = px_error(PX_ERR_FORMAT,
                        "%s: piece \"%s\" is listed in the metadata but the file holds no F32 tensor "
                        "of %zu elements by that name",
                        path, pe.name, pe.box.count);
          break;
        }
        st = px_ckpt_loader_add(L, path, name, &pe.box, t->tensor.data);
      }
    } else {
      // A whole state dict (DDP's model.safetensors, optim.safetensors): each
      // tensor is the piece [0, numel) of itself.
      for (int i = 0; st == PX_OK && i < px_safetensors_count(f); i++) {
        const px_named_tensor *t = px_safetensors_get(f, i);
        bool wanted = false;
        for (int w = 0; !wanted && w < L->n; w++) wanted = strcmp(L->want[w].key, t->name) == 0;
        if (!wanted) continue;
        if (t->tensor.dtype != PX_F32) {
          st = px_error(PX_ERR_FORMAT, "%s: tensor \"%s\" is %s; this plexus loads F32", path, t->name,
                        px_dtype_name(t->tensor.dtype));
          break;
        }
        px_tensor_piece whole;
        memset(&whole, 0, sizeof whole);
        snprintf(whole.key, sizeof whole.key, "%s", t->name);
        whole.ndim = t->tensor.ndim;
        memcpy(whole.shape, t->tensor.shape, sizeof whole.shape);
        whole.count = (size_t)px_tensor_numel(&t->tensor);
        px_ckpt_box b;
        char why[160];
        if (!px_ckpt_box_of(&whole, &b, why, sizeof why)) {
          st = px_error(PX_ERR_FORMAT, "%s: tensor \"%s\" is %s", path, t->name, why);
          break;
        }
        b.key = t->name;
        st = px_ckpt_loader_add(L, path, name, &b, t->tensor.data);
      }
    }
    cJSON_Delete(table);
    px_safetensors_close(f);
  }
  return st;
}

static px_status load_boxes(const char *ckpt_path, const char *prefix, const px_tensor_piece *want, int n, bool strict,
                            bool pieces_only) {
  px_ckpt_sums sums;
  px_status st = px_ckpt_sums_read(ckpt_path, &sums);
  if (st != PX_OK) return st;
  px_ckpt_loader L;
  int files = 0;
  bool indexed = false;
  st = px_ckpt_loader_init(&L, ckpt_path, prefix, want, n, strict);
  if (st == PX_OK) st = px_ckpt_index_load(&L, &sums, &indexed, &files);
  if (st == PX_OK && !indexed) st = load_whole_files(&L, &sums, pieces_only, &files);
  if (st == PX_OK && files == 0)
    st = px_error(PX_ERR_NOT_FOUND, "checkpoint %s has no file \"%s*.safetensors\"%s", ckpt_path, prefix,
                  pieces_only ? " of pieces" : "");
  if (st == PX_OK) st = px_ckpt_loader_finish(&L);
  px_ckpt_loader_free(&L);
  px_ckpt_sums_free(&sums);
  return st;
}
