// safetensors files: open (the whole file read into memory; tensors are
// views of its bytes), load a state dict (all checks first, then copies),
// save (the layout of Hugging Face's reference serializer, byte for byte when
// there is at most one metadata key).  The header parser is
// safetensors_header.c.
//
//   file: u64 little-endian N | N bytes of JSON header | body
//   each tensor holds body[begin, end), end - begin = numel · dtype size.
#define _POSIX_C_SOURCE 200809L
#include "io/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- opening: read, parse, cross-check -------------------------------------- */

static int cmp_named_ptr(const void *a, const void *b) {
  return strcmp((*(const px_named_tensor *const *)a)->name, (*(const px_named_tensor *const *)b)->name);
}

static int cmp_span_ptr(const void *a, const void *b) {
  const px_st_span *x = *(const px_st_span *const *)a, *y = *(const px_st_span *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return x < y ? -1 : x > y;
}

static int cmp_meta_key(const void *a, const void *b) {
  return strcmp(((const px_st_meta *)a)->key, ((const px_st_meta *)b)->key);
}

// Names are unique, tensors do not share bytes; builds the name index.
static px_status check_tensors(px_safetensors *f) {
  int n = f->count;
  if (f->n_meta > 1) {
    qsort(f->meta, (size_t)f->n_meta, sizeof *f->meta, cmp_meta_key);
    for (int i = 1; i < f->n_meta; i++)
      if (strcmp(f->meta[i - 1].key, f->meta[i].key) == 0)
        return px_error(PX_ERR_FORMAT, "safetensors: %s: \"__metadata__\" key \"%s\" appears twice", f->path,
                        f->meta[i].key);
  }
  if (n == 0) return PX_OK;
  const px_named_tensor **names = malloc((size_t)n * sizeof *names);
  const px_st_span **spans = malloc((size_t)n * sizeof *spans);
  f->by_name = malloc((size_t)n * sizeof *f->by_name);
  px_status st = PX_OK;
  if (!names || !spans || !f->by_name) {
    st = px_error(PX_ERR_NOMEM, "safetensors: %s: out of memory", f->path);
    goto done;
  }

  for (int i = 0; i < n; i++) names[i] = &f->tensors[i];
  qsort(names, (size_t)n, sizeof *names, cmp_named_ptr);
  for (int i = 0; i < n; i++) {
    f->by_name[i] = (int)(names[i] - f->tensors);
    if (i > 0 && strcmp(names[i - 1]->name, names[i]->name) == 0 && st == PX_OK)
      st = px_error(PX_ERR_FORMAT, "safetensors: tensor \"%s\" appears twice in the header of %s", names[i]->name,
                    f->path);
  }
  if (st != PX_OK) goto done;

  // Sorted by begin, a non-empty tensor overlaps an earlier one exactly when
  // it begins before the furthest end seen so far.
  for (int i = 0; i < n; i++) spans[i] = &f->spans[i];
  qsort(spans, (size_t)n, sizeof *spans, cmp_span_ptr);
  int far = -1;  // the non-empty tensor with the furthest end so far
  for (int i = 0; i < n && st == PX_OK; i++) {
    int k = (int)(spans[i] - f->spans);
    const px_st_span *s = spans[i];
    if (s->begin == s->end) continue;
    if (far >= 0 && s->begin < f->spans[far].end)
      st = px_error(PX_ERR_FORMAT,
                    "safetensors: tensors \"%s\" and \"%s\" in %s overlap: \"%s\" holds bytes [%" PRIu64 ", %" PRIu64
                    ") of the data and \"%s\" holds [%" PRIu64 ", %" PRIu64 "); expected disjoint ranges",
                    f->tensors[far].name, f->tensors[k].name, f->path, f->tensors[far].name, f->spans[far].begin,
                    f->spans[far].end, f->tensors[k].name, s->begin, s->end);
    if (far < 0 || s->end > f->spans[far].end) far = k;
  }
done:
  free(spans);
  free(names);
  return st;
}

static px_status read_whole_file(px_safetensors *f) {
  char why[128];
  FILE *fp = fopen(f->path, "rb");
  if (!fp) {
    int err = errno;
    return px_error(PX_ERR_IO, "safetensors: cannot open %s: %s", f->path, px_io_strerror(err, why, sizeof why));
  }
  struct stat sb;
  px_status st = PX_OK;
  if (fstat(fileno(fp), &sb) != 0) {
    int err = errno;
    st = px_error(PX_ERR_IO, "safetensors: cannot stat %s: %s", f->path, px_io_strerror(err, why, sizeof why));
  } else if (!S_ISREG(sb.st_mode)) {
    st = px_error(PX_ERR_IO, "safetensors: %s is not a regular file", f->path);
  } else if ((uint64_t)sb.st_size > SIZE_MAX - 1) {
    st = px_error(PX_ERR_NOMEM, "safetensors: %s is too large to read into memory", f->path);
  } else {
    f->size = (size_t)sb.st_size;
    f->bytes = malloc(f->size ? f->size : 1);
    if (!f->bytes) st = px_error(PX_ERR_NOMEM, "safetensors: cannot allocate %zu bytes to read %s", f->size, f->path);
    else if (fread(f->bytes, 1, f->size, fp) != f->size) {
      int err = errno;
      st = ferror(fp)
        ? px_error(PX_ERR_IO, "safetensors: reading %s failed: %s", f->path, px_io_strerror(err, why, sizeof why))
        : px_error(PX_ERR_IO, "safetensors: %s became shorter while being read", f->path);
    }
  }
  fclose(fp);
  return st;
}

// Parses and cross-checks f->bytes (f->size of them, already read).
static px_status parse_bytes(px_safetensors *f) {
  const char *path = f->path;
  if (f->size < 8)
    return px_error(PX_ERR_FORMAT,
                    "safetensors: %s is %zu bytes, too short for a safetensors file (8-byte header length, "
                    "then the JSON header); is it truncated?",
                    path, f->size);
  uint64_t n = 0;  // little-endian, whatever the host
  for (int i = 7; i >= 0; i--) n = n << 8 | f->bytes[i];
  if (n > PX_ST_MAX_HEADER)
    return px_error(PX_ERR_FORMAT,
                    "safetensors: %s declares a header of %" PRIu64 " bytes, over the 100 MB limit; "
                    "is this a safetensors file?",
                    path, n);
  if (n > f->size - 8)
    return px_error(PX_ERR_FORMAT,
                    "safetensors: %s declares a header of %" PRIu64 " bytes but only %zu bytes follow; "
                    "is the file truncated?",
                    path, n, f->size - 8);
  f->body = f->bytes + 8 + n;
  f->body_size = f->size - 8 - (size_t)n;
  px_status st = px_st_parse_header(f, f->bytes + 8, (size_t)n);
  if (st == PX_OK) st = check_tensors(f);
  return st;
}

static px_safetensors *new_file(const char *path) {
  px_safetensors *f = calloc(1, sizeof *f);
  if (f) f->path = strdup(path);
  if (f && !f->path) {
    free(f);
    f = NULL;
  }
  return f;
}

px_status px_safetensors_open(const char *path, px_safetensors **out) {
  if (!out) return px_error(PX_ERR_INVALID, "safetensors: open: out is NULL");
  *out = NULL;
  if (!path || !*path) return px_error(PX_ERR_INVALID, "safetensors: open: empty path");
  px_safetensors *f = new_file(path);
  if (!f) return px_error(PX_ERR_NOMEM, "safetensors: out of memory opening %s", path);
  px_status st = read_whole_file(f);
  if (st == PX_OK) st = parse_bytes(f);
  if (st != PX_OK) {
    px_safetensors_close(f);
    return st;
  }
  *out = f;
  return PX_OK;
}

px_status px_st_open_buffer(const char *path, unsigned char *bytes, size_t size, px_safetensors **out) {
  *out = NULL;
  px_safetensors *f = new_file(path);
  if (!f) {
    free(bytes);
    return px_error(PX_ERR_NOMEM, "safetensors: out of memory opening %s", path);
  }
  f->bytes = bytes;
  f->size = size;
  px_status st = parse_bytes(f);
  if (st != PX_OK) {
    px_safetensors_close(f);
    return st;
  }
  *out = f;
  return PX_OK;
}

void px_safetensors_close(px_safetensors *f) {
  if (!f) return;
  for (int i = 0; i < f->n_meta; i++) {
    free(f->meta[i].key);
    free(f->meta[i].value);
  }
  free(f->meta);
  free(f->by_name);
  free(f->spans);
  free(f->tensors);
  free(f->bytes);
  free(f->path);
  free(f);
}

int px_safetensors_count(const px_safetensors *f) { return f ? f->count : 0; }

const px_named_tensor *px_safetensors_get(const px_safetensors *f, int i) {
  return f && i >= 0 && i < f->count ? &f->tensors[i] : NULL;
}

const px_named_tensor *px_safetensors_find(const px_safetensors *f, const char *name) {
  if (!f || !name || !f->by_name) return NULL;
  int lo = 0, hi = f->count - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    const px_named_tensor *t = &f->tensors[f->by_name[mid]];
    int c = strcmp(name, t->name);
    if (c == 0) return t;
    if (c < 0) hi = mid - 1;
    else lo = mid + 1;
  }
  return NULL;
}

const char *px_safetensors_metadata(const px_safetensors *f, const char *key) {
  if (!f || !key || f->n_meta == 0) return NULL;
  px_st_meta k = {(char *)key, NULL};
  const px_st_meta *m = bsearch(&k, f->meta, (size_t)f->n_meta, sizeof *f->meta, cmp_meta_key);
  return m ? m->value : NULL;
}

const char *px_safetensors_path(const px_safetensors *f) { return f ? f->path : NULL; }

/* ---- loading a state dict: check everything, then copy ---------------------- */

static bool sorted_has(const px_named_tensor *const *sorted, int n, const char *name) {
  int lo = 0, hi = n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(name, sorted[mid]->name);
    if (c == 0) return true;
    if (c < 0) hi = mid - 1;
    else lo = mid + 1;
  }
  return false;
}

static bool has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

// The first problem is the message; the others are counted.
typedef struct problems {
  px_status status;
  int count;
  char first[1024];
} problems;

static void note(problems *pr, px_status st) {
  if (pr->count++ == 0) {
    pr->status = st;
    snprintf(pr->first, sizeof pr->first, "%s", px_last_error());
  }
}

static px_status check_state_dict(const px_state_dict *sd, const char *path, const char *verb) {
  if (!sd || sd->count < 0 || (sd->count > 0 && !sd->items))
    return px_error(PX_ERR_INVALID, "safetensors: %s %s: no state dict given", verb, path);
  for (int i = 0; i < sd->count; i++) {
    const px_named_tensor *nt = &sd->items[i];
    const px_tensor *t = &nt->tensor;
    if (strnlen(nt->name, PX_NAME_MAX) == PX_NAME_MAX)
      return px_error(PX_ERR_INVALID, "safetensors: %s %s: state dict entry %d has an unterminated name", verb, path,
                      i);
    if (t->ndim < 0 || t->ndim > PX_MAX_DIMS || px_dtype_size(t->dtype) == 0)
      return px_error(PX_ERR_INVALID,
                      "safetensors: %s %s: tensor \"%s\" has %d dimensions and dtype %d; expected 0-%d "
                      "dimensions and a valid dtype",
                      verb, path, nt->name, t->ndim, (int)t->dtype, PX_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++)
      if (t->shape[d] < 0)
        return px_error(PX_ERR_INVALID, "safetensors: %s %s: tensor \"%s\" has negative dimension %" PRId64, verb, path,
                        nt->name, t->shape[d]);
    uint64_t nbytes;
    if (!px_st_nbytes(t->shape, t->ndim, px_dtype_size(t->dtype), &nbytes) || nbytes > SIZE_MAX)
      return px_error(PX_ERR_INVALID, "safetensors: %s %s: tensor \"%s\" is too large", verb, path, nt->name);
    if (t->device != PX_CPU)
      return px_error(PX_ERR_UNSUPPORTED,
                      "safetensors: %s %s: tensor \"%s\" is not in CPU memory; copy it to the CPU first", verb, path,
                      nt->name);
    if (nbytes > 0 && !t->data)
      return px_error(PX_ERR_INVALID, "safetensors: %s %s: tensor \"%s\" has no data", verb, path, nt->name);
  }
  return PX_OK;
}

px_status px_safetensors_load(const char *path, const px_state_dict *sd, bool strict) {
  if (!path || !*path) return px_error(PX_ERR_INVALID, "safetensors: load: empty path");
  px_status st = check_state_dict(sd, path, "load into the model from");
  if (st != PX_OK) return st;
  px_safetensors *f;
  if ((st = px_safetensors_open(path, &f)) != PX_OK) return st;
  st = px_st_load_open(f, sd, strict);
  px_safetensors_close(f);
  return st;
}

px_status px_st_load_open(const px_safetensors *f, const px_state_dict *sd, bool strict) {
  const char *path = f->path;
  px_status st = check_state_dict(sd, path, "load into the model from");
  if (st != PX_OK) return st;
  problems pr = {PX_OK, 0, {0}};
  char want[PX_SHAPE_STR_MAX], got[PX_SHAPE_STR_MAX];
  for (int i = 0; i < sd->count; i++) {
    const px_named_tensor *m = &sd->items[i];
    const px_named_tensor *t = px_safetensors_find(f, m->name);
    if (!t) {
      note(&pr,
           px_error(PX_ERR_NOT_FOUND,
                    "safetensors: tensor \"%s\" is missing from %s (the file has %d tensors); "
                    "was it saved from another model?",
                    m->name, path, f->count));
    } else if (t->tensor.dtype != m->tensor.dtype) {
      note(&pr,
           px_error(PX_ERR_FORMAT, "safetensors: tensor \"%s\" in %s has dtype %s but the model expects %s", m->name,
                    path, px_dtype_name(t->tensor.dtype), px_dtype_name(m->tensor.dtype)));
    } else if (!px_tensor_same_shape(&t->tensor, &m->tensor)) {
      note(&pr,
           px_error(PX_ERR_SHAPE,
                    "safetensors: tensor \"%s\" in %s has shape %s but the model expects %s; "
                    "was it saved from another model?",
                    m->name, path, px_shape_str(t->tensor.ndim, t->tensor.shape, got, sizeof got),
                    px_shape_str(m->tensor.ndim, m->tensor.shape, want, sizeof want)));
    }
  }
  if (strict && f->count > 0) {
    const px_named_tensor **sorted = malloc((size_t)(sd->count ? sd->count : 1) * sizeof *sorted);
    if (!sorted) return px_error(PX_ERR_NOMEM, "safetensors: load %s: out of memory", path);
    for (int i = 0; i < sd->count; i++) sorted[i] = &sd->items[i];
    qsort(sorted, (size_t)sd->count, sizeof *sorted, cmp_named_ptr);
    for (int i = 0; i < f->count; i++) {
      const char *name = f->tensors[i].name;
      // PyTorch's BatchNorm step counter: plexus keeps no such buffer.
      if (has_suffix(name, ".num_batches_tracked") || sorted_has(sorted, sd->count, name)) continue;
      note(&pr,
           px_error(PX_ERR_FORMAT,
                    "safetensors: unexpected tensor \"%s\" in %s (not in the model); "
                    "load non-strictly to ignore it",
                    name, path));
    }
    free(sorted);
  }
  if (pr.count > 0) {
    if (pr.count == 1) return px_error(pr.status, "%s", pr.first);
    return px_error(pr.status, "%s (and %d more mismatch%s)", pr.first, pr.count - 1, pr.count > 2 ? "es" : "");
  }
  // All checked: copy.  Views may be unaligned for their dtype, so memcpy.
  for (int i = 0; i < sd->count; i++) {
    const px_named_tensor *m = &sd->items[i];
    size_t nbytes = px_tensor_nbytes(&m->tensor);
    if (nbytes) memcpy(m->tensor.data, px_safetensors_find(f, m->name)->tensor.data, nbytes);
  }
  return PX_OK;
}

/* ---- saving ------------------------------------------------------------------ */

typedef struct sbuf {
  char *buf;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->buf, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->buf = p;
    b->cap = cap;
  }
  memcpy(b->buf + b->len, s, n);
  b->len += n;
  b->buf[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

// A JSON string as serde_json writes it: short escapes where JSON has them,
// \u00XX for other control bytes, everything else (UTF-8 included) as is.
static void sb_json_string(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const char *c = s; *c; c++) {
    unsigned char u = (unsigned char)*c;
    char esc[8];
    const char *short_esc = u == '"' ? "\\\""
      : u == '\\'                    ? "\\\\"
      : u == '\b'                    ? "\\b"
      : u == '\f'                    ? "\\f"
      : u == '\n'                    ? "\\n"
      : u == '\r'                    ? "\\r"
      : u == '\t'                    ? "\\t"
                                     : NULL;
    if (short_esc) sb_str(b, short_esc);
    else if (u < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", u);
      sb_str(b, esc);
    } else sb_put(b, c, 1);
  }
  sb_put(b, "\"", 1);
}

static void sb_u64(sbuf *b, uint64_t v) {
  char num[24];
  snprintf(num, sizeof num, "%" PRIu64, v);
  sb_str(b, num);
}

// Rank in the reference serializer's dtype order (its alignment order); files
// lay tensors out by descending rank, then by name, so every tensor starts at
// a multiple of its element size.
static int dtype_rank(px_dtype t) {
  switch (t) {
  case PX_BOOL: return 0;
  case PX_U8: return 1;
  case PX_I8: return 2;
  case PX_I16: return 5;  // 3, 4: F8_E5M2, F8_E4M3
  case PX_U16: return 6;
  case PX_F16: return 7;
  case PX_BF16: return 8;
  case PX_I32: return 9;
  case PX_U32: return 10;
  case PX_F32: return 11;
  case PX_F64: return 12;
  case PX_I64: return 13;
  case PX_U64: return 14;
  default: return -1;
  }
}

// Layout order: descending dtype rank (so each tensor stays aligned to its
// element size), then name.
static int cmp_layout(const void *a, const void *b) {
  const px_named_tensor *x = *(const px_named_tensor *const *)a, *y = *(const px_named_tensor *const *)b;
  int rx = dtype_rank(x->tensor.dtype), ry = dtype_rank(y->tensor.dtype);
  if (rx != ry) return ry - rx;
  return strcmp(x->name, y->name);
}

static int cmp_kv_ptr(const void *a, const void *b) {
  return strcmp((*(const px_kv *const *)a)->key, (*(const px_kv *const *)b)->key);
}

px_status px_st_image_build(const char *path, const px_state_dict *sd, const px_kv *metadata, int n_metadata,
                            px_st_image *img) {
  memset(img, 0, sizeof *img);
  if (!path || !*path) return px_error(PX_ERR_INVALID, "safetensors: save: empty path");
  px_status st = check_state_dict(sd, path, "save to");
  if (st != PX_OK) return st;
  if (n_metadata < 0 || (n_metadata > 0 && !metadata))
    return px_error(PX_ERR_INVALID, "safetensors: save %s: %d metadata pairs but no array", path, n_metadata);
  int n = sd->count;
  const px_named_tensor **order = malloc((size_t)(n ? n : 1) * sizeof *order);
  const px_kv **meta = malloc((size_t)(n_metadata ? n_metadata : 1) * sizeof *meta);
  px_io_chunk *chunks = malloc((size_t)(n + 2) * sizeof *chunks);
  sbuf h = {0};
  if (!order || !meta || !chunks) {
    st = px_error(PX_ERR_NOMEM, "safetensors: save %s: out of memory", path);
    goto done;
  }
  for (int i = 0; i < n_metadata; i++) {
    meta[i] = &metadata[i];
    if (!metadata[i].key || !metadata[i].value) {
      st = px_error(PX_ERR_INVALID, "safetensors: save %s: metadata pair %d has a NULL key or value", path, i);
      goto done;
    }
    if (!px_st_utf8_valid(metadata[i].key) || !px_st_utf8_valid(metadata[i].value)) {
      st = px_error(PX_ERR_INVALID, "safetensors: save %s: metadata \"%s\" is not valid UTF-8", path, metadata[i].key);
      goto done;
    }
  }
  qsort(meta, (size_t)n_metadata, sizeof *meta, cmp_kv_ptr);
  for (int i = 1; i < n_metadata; i++)
    if (strcmp(meta[i - 1]->key, meta[i]->key) == 0) {
      st = px_error(PX_ERR_INVALID, "safetensors: save %s: metadata key \"%s\" given twice", path, meta[i]->key);
      goto done;
    }

  for (int i = 0; i < n; i++) {
    order[i] = &sd->items[i];
    const char *name = order[i]->name;
    if (strcmp(name, "__metadata__") == 0 || !px_st_utf8_valid(name)) {
      st = px_error(PX_ERR_INVALID, "safetensors: save %s: \"%s\" cannot be a tensor name", path, name);
      goto done;
    }
  }
  qsort(order, (size_t)n, sizeof *order, cmp_named_ptr);
  for (int i = 1; i < n; i++)
    if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
      st = px_error(PX_ERR_INVALID, "safetensors: save %s: tensor \"%s\" appears twice in the state dict", path,
                    order[i]->name);
      goto done;
    }
  qsort(order, (size_t)n, sizeof *order, cmp_layout);

  // {"__metadata__":{"k":"v"},"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...}
  sb_put(&h, "{", 1);
  if (n_metadata > 0) {
    sb_str(&h, "\"__metadata__\":{");
    for (int i = 0; i < n_metadata; i++) {
      if (i) sb_put(&h, ",", 1);
      sb_json_string(&h, meta[i]->key);
      sb_put(&h, ":", 1);
      sb_json_string(&h, meta[i]->value);
    }
    sb_put(&h, "}", 1);
  }
  uint64_t offset = 0;
  for (int i = 0; i < n; i++) {
    const px_tensor *t = &order[i]->tensor;
    uint64_t nbytes = px_tensor_nbytes(t);
    if (i || n_metadata > 0) sb_put(&h, ",", 1);
    sb_json_string(&h, order[i]->name);
    sb_str(&h, ":{\"dtype\":");
    sb_json_string(&h, px_dtype_name(t->dtype));
    sb_str(&h, ",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      if (d) sb_put(&h, ",", 1);
      sb_u64(&h, (uint64_t)t->shape[d]);
    }
    sb_str(&h, "],\"data_offsets\":[");
    sb_u64(&h, offset);
    sb_put(&h, ",", 1);
    sb_u64(&h, offset + nbytes);
    sb_str(&h, "]}");
    chunks[2 + i] = (px_io_chunk){t->data, (size_t)nbytes};
    offset += nbytes;
  }
  sb_put(&h, "}", 1);
  // Pad with spaces to a multiple of 8 so the body starts 8-aligned.
  while (!h.oom && h.len % 8) sb_put(&h, " ", 1);
  if (h.oom) {
    st = px_error(PX_ERR_NOMEM, "safetensors: save %s: out of memory building the header", path);
    goto done;
  }
  if (h.len > PX_ST_MAX_HEADER) {
    st = px_error(PX_ERR_INVALID, "safetensors: save %s: header of %zu bytes is over the 100 MB limit readers accept",
                  path, h.len);
    goto done;
  }

  for (int i = 0; i < 8; i++) img->len_le[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
  chunks[0] = (px_io_chunk){img->len_le, 8};
  chunks[1] = (px_io_chunk){h.buf, h.len};
  img->chunks = chunks;
  img->n_chunks = n + 2;
  img->header = h.buf;
  chunks = NULL;
  h.buf = NULL;

done:
  free(h.buf);
  free(chunks);
  free(meta);
  free(order);
  return st;
}

void px_st_image_free(px_st_image *img) {
  free(img->chunks);
  free(img->header);
  memset(img, 0, sizeof *img);
}

px_status px_safetensors_save(const char *path, const px_state_dict *sd, const px_kv *metadata, int n_metadata) {
  px_st_image img;
  px_status st = px_st_image_build(path, sd, metadata, n_metadata, &img);
  if (st != PX_OK) return st;
  st = px_io_write_chunks_atomic(path, img.chunks, img.n_chunks);
  px_st_image_free(&img);
  return st;
}
