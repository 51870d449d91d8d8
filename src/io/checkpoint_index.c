// The checkpoint's index, metadata.json: one file that says where every
// element of every tensor is, written last, by rank 0, after every rank's
// files are durable (px_checkpoint_write_all), and read first by every
// loader (px_checkpoint_load_boxes), which then opens only the files that
// hold something it needs and reads only those pieces' bytes.
//
//   {"format": "plexus-checkpoint-index", "version": 1, "step": 600, "world_size": 4,
//    "files": {"optim.rank00001-of-00004.safetensors":
//                {"rank": 1, "bytes": 123456, "header_bytes": 2048, "header_crc32c": "1c2d3e4f"}, ...},
//    "tensors": {"exp_avg.h.0.attn.c_attn.weight":
//                  {"dtype": "F32", "shape": [64, 192],
//                   "pieces": [{"file": "optim.rank00001-of-00004.safetensors",
//                               "tensor": "exp_avg.h.0.attn.c_attn.weight@3072",
//                               "box_offset": [0, 0], "box_size": [64, 192],
//                               "offset": 3072, "count": 3072,
//                               "data_offsets": [12288, 24576], "crc32c": "89abcdef"}, ...]}, ...}}
//
// data_offsets are the safetensors header's (relative to the end of the
// header); header_bytes is the 8-byte length plus the JSON header, whose
// CRC-32C is header_crc32c; a piece's crc32c is that of its bytes.  A plain
// state dict's tensors (model.safetensors under ZeRO 1-2) are listed as
// whole pieces of themselves.  The index is covered by SHA256SUMS like
// every other file; the per-piece checksums let a reader that skips most of
// a file still check every byte it uses.
#define _POSIX_C_SOURCE 200809L  // pread, posix_fadvise, mmap
#define _DEFAULT_SOURCE          // MAP_POPULATE
#include "io/checkpoint.h"
#include "io/internal.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static cJSON *ints_json(int ndim, const int64_t *v) {
  cJSON *a = cJSON_CreateArray();
  for (int d = 0; a && d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[d]));
  return a;
}

static void crc_hex(uint32_t c, char out[9]) { snprintf(out, 9, "%08" PRIx32, c); }

static bool json_u64(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
      v->valuedouble != (double)(uint64_t)v->valuedouble)
    return false;
  *out = (uint64_t)v->valuedouble;
  return true;
}

static const char *kv_find(const px_kv *kv, int n, const char *key) {
  for (int i = 0; i < n; i++)
    if (kv[i].key && strcmp(kv[i].key, key) == 0) return kv[i].value;
  return NULL;
}

static const px_named_tensor *sd_find(const px_state_dict *sd, const char *name) {
  for (int i = 0; i < sd->count; i++)
    if (strcmp(sd->items[i].name, name) == 0) return &sd->items[i];
  return NULL;
}

/* ---- writing: each rank's part, rank 0's whole --------------------------- */

// One piece of a part: where it is in its file and its checksum.
// The CRC-32C taken while writing the chunk holding these bytes, if any.
static bool known_crc(const px_ckpt_chunk_crc *crcs, int n, const void *data, size_t size, uint32_t *out) {
  for (int i = 0; i < n; i++)
    if (crcs[i].data == data && crcs[i].size == size) {
      *out = crcs[i].crc;
      return true;
    }
  return false;
}

static px_status add_piece(cJSON *pieces, const char *tensor, const px_ckpt_box *b, int shape_ndim, const char *dtype,
                           const cJSON *hdr, const px_named_tensor *t, const char *file, const px_ckpt_chunk_crc *crcs,
                           int n_crcs) {
  const cJSON *h = cJSON_GetObjectItemCaseSensitive(hdr, tensor);
  const cJSON *offs = h ? cJSON_GetObjectItemCaseSensitive(h, "data_offsets") : NULL;
  uint64_t begin, end;
  if (!t || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_u64(offs->child, &begin) ||
      !json_u64(offs->child->next, &end))
    return px_error(PX_ERR_INVALID,
                    "checkpoint index: %s: piece \"%s\" is listed in the \"pieces\" metadata but is "
                    "not a tensor of the file",
                    file, tensor);
  const uint64_t nbytes = px_tensor_nbytes(&t->tensor);
  if (end - begin != nbytes)
    return px_error(PX_ERR_INVALID,
                    "checkpoint index: %s: piece \"%s\" is %" PRIu64 " bytes in the file, %" PRIu64 " in the metadata",
                    file, tensor, end - begin, nbytes);
  cJSON *e = cJSON_CreateObject();
  if (!e || !cJSON_AddItemToArray(pieces, e)) {
    cJSON_Delete(e);
    return px_error(PX_ERR_NOMEM, "checkpoint index: out of memory");
  }
  char crc[9];
  uint32_t c;
  if (!known_crc(crcs, n_crcs, t->tensor.data, (size_t)nbytes, &c))
    c = px_ckpt_crc32c(0, t->tensor.data, (size_t)nbytes);
  crc_hex(c, crc);
  cJSON_AddStringToObject(e, "tensor", tensor);
  cJSON_AddStringToObject(e, "key", b->key);
  cJSON_AddStringToObject(e, "dtype", dtype);
  cJSON_AddItemToObject(e, "shape", ints_json(shape_ndim, b->shape));
  cJSON_AddItemToObject(e, "box_offset", ints_json(shape_ndim, b->off));
  cJSON_AddItemToObject(e, "box_size", ints_json(shape_ndim, b->size));
  cJSON_AddNumberToObject(e, "offset", (double)b->offset);
  cJSON_AddNumberToObject(e, "count", (double)b->count);
  const int64_t be[2] = {(int64_t)begin, (int64_t)end};
  cJSON_AddItemToObject(e, "data_offsets", ints_json(2, be));
  cJSON_AddStringToObject(e, "crc32c", crc);
  return PX_OK;
}

static px_status part_of_item(const px_ckpt_item *it, cJSON *files, const px_ckpt_chunk_crc *crcs, int n_crcs) {
  px_st_image img;
  px_status st = px_st_image_build(it->name, it->tensors, it->metadata, it->n_metadata, &img);
  if (st != PX_OK) return st;
  cJSON *hdr = cJSON_ParseWithLength(img.header, img.chunks[1].size), *table = NULL;
  cJSON *f = cJSON_CreateObject(), *pieces = cJSON_CreateArray();
  if (!hdr || !f || !pieces || !cJSON_AddItemToArray(files, f)) {
    cJSON_Delete(f);
    f = NULL;
    st = px_error(PX_ERR_NOMEM, "checkpoint index: %s: out of memory", it->name);
    goto done;
  }
  uint64_t bytes = 0;
  for (int c = 0; c < img.n_chunks; c++) bytes += img.chunks[c].size;
  char crc[9];
  crc_hex(px_ckpt_crc32c(px_ckpt_crc32c(0, img.chunks[0].data, 8), img.chunks[1].data, img.chunks[1].size), crc);
  cJSON_AddStringToObject(f, "name", it->name);
  cJSON_AddNumberToObject(f, "bytes", (double)bytes);
  cJSON_AddNumberToObject(f, "header_bytes", (double)(8 + img.chunks[1].size));
  cJSON_AddStringToObject(f, "header_crc32c", crc);
  cJSON_AddItemToObject(f, "pieces", pieces);
  const char *fmt = kv_find(it->metadata, it->n_metadata, "format");
  if (fmt && strcmp(fmt, PX_PIECES_FORMAT) == 0) {
    const char *ver = kv_find(it->metadata, it->n_metadata, "version");
    if ((st = px_ckpt_pieces_table_json(it->name, fmt, ver, kv_find(it->metadata, it->n_metadata, "pieces"), &table)) !=
        PX_OK)
      goto done;
    const int version = strcmp(ver, "1") == 0 ? 1 : 2;
    for (const cJSON *e = table->child; e && st == PX_OK; e = e->next) {
      px_ckpt_piece_entry pe;
      if ((st = px_ckpt_piece_entry_read(e, it->name, version, &pe)) != PX_OK) break;
      const cJSON *nd = cJSON_GetObjectItemCaseSensitive(e, "shape");
      st = add_piece(pieces, pe.name, &pe.box, cJSON_GetArraySize(nd), "F32", hdr, sd_find(it->tensors, pe.name),
                     it->name, crcs, n_crcs);
    }
    if (st == PX_OK && cJSON_GetArraySize(table) != it->tensors->count)
      st = px_error(PX_ERR_INVALID, "checkpoint index: %s holds %d tensors but its \"pieces\" metadata lists %d",
                    it->name, it->tensors->count, cJSON_GetArraySize(table));
  } else {
    for (int i = 0; i < it->tensors->count && st == PX_OK; i++) {
      const px_named_tensor *t = &it->tensors->items[i];
      px_ckpt_box b;
      memset(&b, 0, sizeof b);
      b.key = t->name;
      b.ndim = t->tensor.ndim;
      for (int d = 0; d < t->tensor.ndim; d++) b.shape[d] = b.size[d] = t->tensor.shape[d];
      b.count = (size_t)px_tensor_numel(&t->tensor);
      st = add_piece(pieces, t->name, &b, t->tensor.ndim, px_dtype_name(t->tensor.dtype), hdr, t, it->name, crcs,
                     n_crcs);
    }
  }
done:
  cJSON_Delete(table);
  cJSON_Delete(hdr);
  px_st_image_free(&img);
  return st;
}

px_status px_ckpt_index_part(const px_ckpt_item *items, int n_items, int rank, char **json) {
  return px_ckpt_index_part_crc(items, n_items, rank, NULL, NULL, json);
}

px_status px_ckpt_index_part_crc(const px_ckpt_item *items, int n_items, int rank, px_ckpt_chunk_crc *const *crcs,
                                 const int *n_crcs, char **json) {
  *json = NULL;
  cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateArray();
  if (!root || !files || !cJSON_AddItemToObject(root, "files", files)) {
    cJSON_Delete(root);
    cJSON_Delete(files);
    return px_error(PX_ERR_NOMEM, "checkpoint index: out of memory");
  }
  cJSON_AddNumberToObject(root, "rank", rank);
  px_status st = PX_OK;
  for (int i = 0; i < n_items && st == PX_OK; i++)
    if (items[i].tensors) st = part_of_item(&items[i], files, crcs ? crcs[i] : NULL, crcs && n_crcs ? n_crcs[i] : 0);
  if (st == PX_OK && !(*json = cJSON_PrintUnformatted(root)))
    st = px_error(PX_ERR_NOMEM, "checkpoint index: out of memory");
  cJSON_Delete(root);
  return st;
}

static bool same_ints(const cJSON *a, const cJSON *b) {
  if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b)) return false;
  for (const cJSON *x = a->child, *y = b->child; x && y; x = x->next, y = y->next)
    if (!cJSON_IsNumber(x) || !cJSON_IsNumber(y) || x->valuedouble != y->valuedouble) return false;
  return true;
}

px_status px_ckpt_index_write(const char *tmp, const char *final, char *const *parts, int world, int64_t step,
                              char hex[PX_SHA256_HEX]) {
  cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateObject(), *tensors = cJSON_CreateObject();
  px_status st = PX_OK;
  if (!root || !files || !tensors) st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory for the index", final);
  if (st == PX_OK) {
    cJSON_AddStringToObject(root, "format", PX_CKPT_INDEX_FORMAT);
    cJSON_AddNumberToObject(root, "version", PX_CKPT_INDEX_VERSION);
    cJSON_AddNumberToObject(root, "step", (double)step);
    cJSON_AddNumberToObject(root, "world_size", world);
    cJSON_AddItemToObject(root, "files", files);
    cJSON_AddItemToObject(root, "tensors", tensors);
    files = tensors = NULL;
  }
  cJSON *F = cJSON_GetObjectItemCaseSensitive(root, "files"), *T = cJSON_GetObjectItemCaseSensitive(root, "tensors");
  for (int r = 0; r < world && st == PX_OK; r++) {
    cJSON *part = cJSON_Parse(parts[r]);
    const cJSON *pf = cJSON_GetObjectItemCaseSensitive(part, "files");
    if (!cJSON_IsArray(pf)) st = px_error(PX_ERR_INVALID, "checkpoint %s: rank %d sent no index part", final, r);
    for (const cJSON *f = pf ? pf->child : NULL; f && st == PX_OK; f = f->next) {
      const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f, "name"));
      cJSON *fe = cJSON_AddObjectToObject(F, name);
      if (!fe) {
        st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory for the index", final);
        break;
      }
      cJSON_AddNumberToObject(fe, "rank", r);
      static const char *const copy[] = {"bytes", "header_bytes", "header_crc32c"};
      for (int k = 0; k < 3; k++)
        cJSON_AddItemToObject(fe, copy[k], cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(f, copy[k]), 1));
      const cJSON *ps = cJSON_GetObjectItemCaseSensitive(f, "pieces");
      for (const cJSON *p = ps ? ps->child : NULL; p && st == PX_OK; p = p->next) {
        const char *key = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "key"));
        const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(p, "dtype"),
                    *shape = cJSON_GetObjectItemCaseSensitive(p, "shape");
        cJSON *te = cJSON_GetObjectItemCaseSensitive(T, key);
        if (!te) {
          te = cJSON_AddObjectToObject(T, key);
          if (te) {
            cJSON_AddItemToObject(te, "dtype", cJSON_Duplicate(dtype, 1));
            cJSON_AddItemToObject(te, "shape", cJSON_Duplicate(shape, 1));
            cJSON_AddArrayToObject(te, "pieces");
          }
        } else if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(te, "dtype")), dtype->valuestring) !=
                     0 ||
                   !same_ints(cJSON_GetObjectItemCaseSensitive(te, "shape"), shape)) {
          char *a = cJSON_PrintUnformatted(shape),
               *b = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(te, "shape"));
          st = px_error(PX_ERR_INVALID, "checkpoint %s: tensor \"%s\" is %s %s in %s but %s %s in an earlier file",
                        final, key, dtype->valuestring, a ? a : "?", name,
                        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(te, "dtype")), b ? b : "?");
          free(a);
          free(b);
          break;
        }
        cJSON *pe = cJSON_CreateObject();
        if (!te || !pe) {
          cJSON_Delete(pe);
          st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", final);
          break;
        }
        cJSON_AddStringToObject(pe, "file", name);
        static const char *const keep[] = {"tensor", "box_offset",   "box_size", "offset",
                                           "count",  "data_offsets", "crc32c"};
        for (int k = 0; k < 7; k++)
          cJSON_AddItemToObject(pe, keep[k], cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(p, keep[k]), 1));
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(te, "pieces"), pe);
      }
    }
    cJSON_Delete(part);
  }
  char *text = st == PX_OK ? cJSON_Print(root) : NULL;
  if (st == PX_OK && !text) st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory for the index", final);
  if (st == PX_OK) {
    const px_ckpt_item it = {.name = PX_CKPT_INDEX, .bytes = text, .n_bytes = strlen(text)};
    st = px_ckpt_write_item(tmp, final, &it, hex);
  }
  free(text);
  cJSON_Delete(files);
  cJSON_Delete(tensors);
  cJSON_Delete(root);
  return st;
}

/* ---- reading through the index ---------------------------------------------- */

// A piece the loader needs: its entry in the index.
typedef struct need {
  const cJSON *entry;
  px_ckpt_box box;
  uint64_t begin, end;
  uint32_t crc;
  float *direct;  // where in staging its bytes go straight (px_ckpt_loader_direct), or NULL
  int w;          // then: the wanted piece
} need;

static bool has_suffix(const char *s, const char *suf) {
  size_t n = strlen(s), k = strlen(suf);
  return n >= k && strcmp(s + n - k, suf) == 0;
}

static bool crc_of(const cJSON *v, uint32_t *out) {
  const char *s = cJSON_GetStringValue(v);
  char *end;
  if (!s || strlen(s) != 8) return false;
  unsigned long x = strtoul(s, &end, 16);
  *out = (uint32_t)x;
  return *end == '\0';
}

// A piece's entry of the index as a box; its byte range and checksum.
static px_status read_need(const char *ckpt, const char *key, const cJSON *te, const cJSON *pe, need *out) {
  px_tensor_piece p;
  memset(&p, 0, sizeof p);
  memset(out, 0, sizeof *out);
  out->entry = pe;
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(te, "shape");
  const cJSON *bo = cJSON_GetObjectItemCaseSensitive(pe, "box_offset"),
              *bs = cJSON_GetObjectItemCaseSensitive(pe, "box_size");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(pe, "data_offsets");
  uint64_t off, cnt;
  bool ok = cJSON_IsArray(shape) && cJSON_GetArraySize(shape) <= PX_MAX_DIMS && cJSON_IsArray(bo) &&
    cJSON_IsArray(bs) && cJSON_GetArraySize(bo) == cJSON_GetArraySize(shape) &&
    cJSON_GetArraySize(bs) == cJSON_GetArraySize(shape) &&
    json_u64(cJSON_GetObjectItemCaseSensitive(pe, "offset"), &off) &&
    json_u64(cJSON_GetObjectItemCaseSensitive(pe, "count"), &cnt) && cJSON_IsArray(offs) &&
    cJSON_GetArraySize(offs) == 2 && json_u64(offs->child, &out->begin) && json_u64(offs->child->next, &out->end) &&
    out->end >= out->begin && crc_of(cJSON_GetObjectItemCaseSensitive(pe, "crc32c"), &out->crc) &&
    strlen(key) < sizeof p.key;
  p.ndim = ok ? cJSON_GetArraySize(shape) : 0;
  int d = 0;
  for (const cJSON *a = ok ? shape->child : NULL, *b = ok ? bo->child : NULL, *c = ok ? bs->child : NULL; a && b && c;
       a = a->next, b = b->next, c = c->next, d++) {
    uint64_t x = 0, y = 0, z = 0;
    ok = ok && json_u64(a, &x) && json_u64(b, &y) && json_u64(c, &z);
    p.shape[d] = (int64_t)x;
    p.box_offset[d] = (int64_t)y;
    p.box_size[d] = (int64_t)z;
  }
  char why[160] = "malformed";
  if (ok) {
    snprintf(p.key, sizeof p.key, "%s", key);
    p.offset = (size_t)off;
    p.count = (size_t)cnt;
    ok = px_ckpt_box_of(&p, &out->box, why, sizeof why);
  }
  if (!ok)
    return px_error(PX_ERR_FORMAT, "checkpoint %s: %s: a piece of tensor \"%s\" in file \"%s\" is %s", ckpt,
                    PX_CKPT_INDEX, key, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pe, "file")), why);
  out->box.key = key;
  return PX_OK;
}

static const char *str_or(const cJSON *v) {
  const char *s = cJSON_GetStringValue(v);
  return s ? s : "";
}

static px_status pread_all(int fd, void *buf, size_t n, uint64_t at) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r == 0 ? PX_ERR_FORMAT : PX_ERR_IO;
    got += (size_t)r;
  }
  return PX_OK;
}

// The index disagrees with file `name` about piece pe: the message.
static px_status disagree(const char *ckpt, const char *name, const char *key, const char *what) {
  return px_error(PX_ERR_FORMAT,
                  "checkpoint %s: file \"%s\", tensor \"%s\": %s disagrees with the file (%s); the "
                  "checkpoint was altered after it was written",
                  ckpt, name, key, PX_CKPT_INDEX, what);
}

// The file's header agrees with the index about piece q (where its F32
// bytes are; for a file of pieces, its key, shape, box and range).
static px_status check_need(const px_ckpt_loader *L, const char *name, const char *path, const cJSON *h,
                            const cJSON *table, bool of_pieces, const char *ver, const need *q) {
  const char *tensor = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q->entry, "tensor"));
  const cJSON *t = tensor ? cJSON_GetObjectItemCaseSensitive(h, tensor) : NULL;
  const cJSON *offs = t ? cJSON_GetObjectItemCaseSensitive(t, "data_offsets") : NULL;
  uint64_t b = 0, e = 0;
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_u64(offs->child, &b) ||
      !json_u64(offs->child->next, &e) || b != q->begin || e != q->end || q->end - q->begin != q->box.count * 4 ||
      strcmp(str_or(cJSON_GetObjectItemCaseSensitive(t, "dtype")), "F32") != 0) {
    return disagree(L->ckpt, name, q->box.key, "where the piece's F32 bytes are");
  }
  if (of_pieces) {
    // The file's own description of the piece must be the index's.
    const cJSON *e2 = cJSON_GetObjectItemCaseSensitive(table, tensor);
    px_ckpt_piece_entry fe2;
    if (!e2 || px_ckpt_piece_entry_read(e2, path, ver && strcmp(ver, "1") == 0 ? 1 : 2, &fe2) != PX_OK ||
        strcmp(fe2.box.key, q->box.key) != 0 || fe2.box.ndim != q->box.ndim || fe2.box.offset != q->box.offset ||
        fe2.box.count != q->box.count ||
        memcmp(fe2.box.shape, q->box.shape, sizeof q->box.shape[0] * (size_t)q->box.ndim) != 0 ||
        memcmp(fe2.box.off, q->box.off, sizeof q->box.off[0] * (size_t)q->box.ndim) != 0 ||
        memcmp(fe2.box.size, q->box.size, sizeof q->box.size[0] * (size_t)q->box.ndim) != 0) {
      return disagree(L->ckpt, name, q->box.key, "the piece's key, shape, box or range");
    }
  } else if (strcmp(tensor, q->box.key) != 0) {
    return disagree(L->ckpt, name, q->box.key, "the tensor's name");
  }
  return PX_OK;
}

static int by_begin(const void *a, const void *b) {
  const need *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

// One pread covers adjacent pieces up to this many bytes: fewer system calls,
// while the buffer stays small enough to be in cache when the CRC and the
// copy read it back (64 MiB runs made warm loads slower).
#define READ_RUN_MAX ((uint64_t)4 << 20)
// How far past the run being read the disk is asked to read ahead.
#define READ_AHEAD ((uint64_t)32 << 20)

// The pieces of one file that the loader needs: header checked against the
// index, then each piece read and checked against its CRC-32C, and fed.
static px_status read_file_pieces(px_ckpt_loader *L, const char *name, const cJSON *fe, need *needs, int n_needs) {
  // name is SHA256SUMS's copy, which outlives the index (the loader keeps it).
  char path[4400], why[128];
  snprintf(path, sizeof path, "%s/%s", L->ckpt, name);
  const char *first = needs[0].box.key;
  uint64_t bytes, hbytes;
  uint32_t hcrc;
  if (!json_u64(cJSON_GetObjectItemCaseSensitive(fe, "bytes"), &bytes) ||
      !json_u64(cJSON_GetObjectItemCaseSensitive(fe, "header_bytes"), &hbytes) ||
      !crc_of(cJSON_GetObjectItemCaseSensitive(fe, "header_crc32c"), &hcrc) || hbytes < 8 || hbytes > PX_ST_MAX_HEADER)
    return px_error(PX_ERR_FORMAT, "checkpoint %s: %s: the entry of file \"%s\" is malformed", L->ckpt, PX_CKPT_INDEX,
                    name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return px_error(err == ENOENT ? PX_ERR_FORMAT : PX_ERR_IO,
                    "checkpoint %s: cannot read file \"%s\" (it holds tensor "
                    "\"%s\"): %s",
                    L->ckpt, name, first, px_io_strerror(err, why, sizeof why));
  }
  px_status st = PX_OK;
  unsigned char *hdr = NULL, *data = NULL;
  cJSON *h = NULL, *table = NULL;
  struct stat sb;
  if (fstat(fd, &sb) != 0) sb.st_size = -1;
  if (sb.st_size < 0 || (uint64_t)sb.st_size != bytes) {
    char what[96];
    snprintf(what, sizeof what, "%" PRIu64 " bytes in the index, %lld on disk", bytes, (long long)sb.st_size);
    st = disagree(L->ckpt, name, first, what);
    goto done;
  }
  if (!(hdr = malloc(hbytes + 1))) {
    st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", L->ckpt);
    goto done;
  }
  if ((st = pread_all(fd, hdr, hbytes, 0)) != PX_OK) {
    st = px_error(st, "checkpoint %s: reading the header of \"%s\" failed", L->ckpt, name);
    goto done;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | hdr[i];
  if (n + 8 != hbytes || px_ckpt_crc32c(0, hdr, hbytes) != hcrc) {
    st = disagree(L->ckpt, name, first, "the safetensors header's CRC-32C or length");
    goto done;
  }
  hdr[hbytes] = '\0';
  if (!(h = cJSON_ParseWithLength((const char *)hdr + 8, (size_t)n))) {
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: the header of \"%s\" is not JSON", L->ckpt, name);
    goto done;
  }
  const cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
  const char *fmt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "format"));
  const bool of_pieces = fmt && strcmp(fmt, PX_PIECES_FORMAT) == 0;
  const char *ver = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "version"));
  if (of_pieces &&
      (st = px_ckpt_pieces_table_json(path, fmt, ver,
                                      cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(meta, "pieces")),
                                      &table)) != PX_OK)
    goto done;
  // Pieces in file order, adjacent ones read together: one pread per run of
  // neighbours (a rank's pieces of one file are usually all adjacent).  A
  // piece that lands whole in one wanted piece of the same layout is read
  // straight into staging (a run of them when their staging addresses follow
  // each other too), checked there and recorded; the others go through a
  // buffer reused across runs and are fed to px_ckpt_loader_add.  Before
  // each run is read, the disk is asked for the bytes up to READ_AHEAD past
  // it (POSIX_FADV_WILLNEED), so a cold load's disk reads overlap its CRCs
  // and copies.
  //
  // The file is mapped read-only instead (where mmap works), and its pieces are checked in
  // place, in the page cache: a direct piece is then not staged at all (the
  // loader keeps the mapping and copies from it into the caller's memory
  // once every wanted element is found, px_ckpt_loader_took_from), and the
  // others are fed to px_ckpt_loader_add from the mapping.  That saves, per
  // byte, the kernel's copy into staging and the zeroing of staging's fresh
  // pages, two of the four passes over memory of a load (docs/PERFORMANCE.md,
  // "Figures behind code comments").  The file's size was checked against
  // the index above; checkpoint files are never rewritten in place (a save
  // writes a new directory), so the mapping reads what was checked.  Where
  // mmap fails, the file is read as above.  When the rank needs at least
  // half of the file's data (every load at the world size it was saved
  // with), the mapping is populated at once (MAP_POPULATE): the kernel reads
  // the file in large requests and maps it without a fault per page (the
  // cold load's time and CPU in docs/PERFORMANCE.md, "Figures behind code
  // comments"); a rank that needs less of it maps it lazily and reads
  // ahead only what it needs.
  qsort(needs, (size_t)n_needs, sizeof *needs, by_begin);
  for (int i = 0; i < n_needs && st == PX_OK; i++) {
    if ((st = check_need(L, name, path, h, table, of_pieces, ver, &needs[i])) != PX_OK) break;
    needs[i].direct = px_ckpt_loader_direct(L, &needs[i].box, &needs[i].w);
  }
  unsigned char *map = NULL;
  if (st == PX_OK && bytes > hbytes && bytes <= (uint64_t)SIZE_MAX) {
    uint64_t wanted = 0;
    for (int i = 0; i < n_needs; i++) wanted += needs[i].end - needs[i].begin;
    int flags = MAP_SHARED;
#ifdef MAP_POPULATE
    if (2 * wanted >= bytes - hbytes) flags |= MAP_POPULATE;
#endif
    void *m = mmap(NULL, (size_t)bytes, PROT_READ, flags, fd, 0);
    if (m != MAP_FAILED) {
      if (px_ckpt_loader_keep_map(L, m, (size_t)bytes) == PX_OK) map = m;
      else munmap(m, (size_t)bytes);
    }  // else: read as below
  }
  size_t cap = 0;
  int ahead = 0;  // the bytes of needs[ahead] from ahead_at on are not advised yet
  uint64_t ahead_at = 0;
  for (int i = 0; i < n_needs && st == PX_OK;) {
    int j = i + 1;
    uint64_t run = needs[i].end - needs[i].begin;
    unsigned char *into = (unsigned char *)needs[i].direct;
    while (j < n_needs && needs[j].begin == needs[j - 1].end && run + (needs[j].end - needs[j].begin) <= READ_RUN_MAX &&
           (map || (into ? (unsigned char *)needs[j].direct == into + run : !needs[j].direct))) {
      run += needs[j].end - needs[j].begin;
      j++;
    }
#ifdef POSIX_FADV_WILLNEED
    // Asked for so far: up to needs[ahead] at ahead_at; keep that READ_AHEAD
    // bytes (of needed pieces) past this run's end.
    if (ahead < j) {
      ahead = j;
      ahead_at = ahead < n_needs ? needs[ahead].begin : 0;
    }
    for (uint64_t budget = READ_AHEAD; ahead < n_needs && budget > 0;) {
      uint64_t len = needs[ahead].end - ahead_at;
      if (len > budget) len = budget;
      if (len) (void)posix_fadvise(fd, (off_t)(hbytes + ahead_at), (off_t)len, POSIX_FADV_WILLNEED);  // a hint
      budget -= len;
      ahead_at += len;
      if (ahead_at == needs[ahead].end && ++ahead < n_needs) ahead_at = needs[ahead].begin;
    }
#endif
    if (map) {
      into = map + hbytes + needs[i].begin;
    } else if (!into) {
      if (run > cap || !data) {
        free(data);
        cap = (size_t)run;
        if (!(data = malloc(cap ? cap : 1))) {
          st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory reading \"%s\"", L->ckpt, name);
          break;
        }
      }
      into = data;
    }
    if (!map && (st = pread_all(fd, into, (size_t)run, hbytes + needs[i].begin)) != PX_OK) {
      st = px_error(st, "checkpoint %s: reading tensor \"%s\" from \"%s\" failed (truncated?)", L->ckpt,
                    needs[i].box.key, name);
      break;
    }
    for (int k = i; k < j && st == PX_OK; k++) {
      const need *q = &needs[k];
      const unsigned char *at = into + (q->begin - needs[i].begin);
      const size_t len = (size_t)(q->end - q->begin);
      const uint32_t got = px_ckpt_crc32c_wide(at, len);
      if (got != q->crc) {
        const char *tensor = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(q->entry, "tensor"));
        st = px_error(PX_ERR_FORMAT,
                      "checkpoint %s: file \"%s\", tensor \"%s\" (piece \"%s\"): CRC-32C %08" PRIx32
                      " but %s says %08" PRIx32 "; the file is corrupted",
                      L->ckpt, name, q->box.key, tensor, got, PX_CKPT_INDEX, q->crc);
        break;
      }
      if (!q->direct) st = px_ckpt_loader_add(L, path, name, &q->box, at);
      else if (map) st = px_ckpt_loader_took_from(L, q->w, &q->box, name, at);
      else st = px_ckpt_loader_took(L, q->w, &q->box, name);
    }
    i = j;
  }
done:
  cJSON_Delete(table);
  cJSON_Delete(h);
  free(data);
  free(hdr);
  close(fd);
  return st;
}

px_status px_ckpt_index_load(px_ckpt_loader *L, const px_ckpt_sums *sums, bool *used, int *files) {
  *used = false;
  bool listed = false;
  for (int s = 0; s < sums->n && !listed; s++) listed = strcmp(sums->items[s].name, PX_CKPT_INDEX) == 0;
  if (!listed) return PX_OK;
  *used = true;
  void *bytes;
  size_t nb;
  px_status st = px_checkpoint_read_file(L->ckpt, PX_CKPT_INDEX, &bytes, &nb);
  if (st != PX_OK) return st;
  cJSON *ix = cJSON_ParseWithLength(bytes, nb);
  free(bytes);
  const cJSON *ver = cJSON_GetObjectItemCaseSensitive(ix, "version");
  const cJSON *F = cJSON_GetObjectItemCaseSensitive(ix, "files"), *T = cJSON_GetObjectItemCaseSensitive(ix, "tensors");
  if (!cJSON_IsObject(ix) ||
      strcmp(str_or(cJSON_GetObjectItemCaseSensitive(ix, "format")), PX_CKPT_INDEX_FORMAT) != 0 || !cJSON_IsNumber(ver))
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: %s is not a plexus checkpoint index (\"format\": \"%s\")", L->ckpt,
                  PX_CKPT_INDEX, PX_CKPT_INDEX_FORMAT);
  else if (ver->valuedouble != PX_CKPT_INDEX_VERSION)
    st = px_error(PX_ERR_FORMAT,
                  "checkpoint %s: %s has version %g; this plexus reads version %d (a newer plexus wrote "
                  "it?)",
                  L->ckpt, PX_CKPT_INDEX, ver->valuedouble, PX_CKPT_INDEX_VERSION);
  else if (!cJSON_IsObject(F) || !cJSON_IsObject(T))
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: %s lacks \"files\" or \"tensors\"", L->ckpt, PX_CKPT_INDEX);
  // The index and SHA256SUMS list the same files of the prefix.
  for (int s = 0; s < sums->n && st == PX_OK; s++) {
    const char *name = sums->items[s].name;
    if (strncmp(name, L->prefix, strlen(L->prefix)) != 0 || !has_suffix(name, ".safetensors")) continue;
    (*files)++;
    if (!cJSON_GetObjectItemCaseSensitive(F, name))
      st = px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS lists \"%s\" but %s does not", L->ckpt, name,
                    PX_CKPT_INDEX);
  }
  for (const cJSON *f = F ? F->child : NULL; f && st == PX_OK; f = f->next) {
    bool in_sums = false;
    for (int s = 0; s < sums->n && !in_sums; s++) in_sums = strcmp(sums->items[s].name, f->string) == 0;
    if (!in_sums)
      st = px_error(PX_ERR_FORMAT, "checkpoint %s: %s lists file \"%s\", which SHA256SUMS does not", L->ckpt,
                    PX_CKPT_INDEX, f->string);
  }
  // Per file of the prefix, the pieces the loader needs.
  const int n_files = st == PX_OK ? cJSON_GetArraySize(F) : 0;
  need **by_file = calloc(n_files > 0 ? (size_t)n_files : 1, sizeof *by_file);
  int *count = calloc(n_files > 0 ? (size_t)n_files : 1, sizeof *count),
      *cap = calloc(n_files > 0 ? (size_t)n_files : 1, sizeof *cap);
  if (st == PX_OK && (!by_file || !count || !cap)) st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", L->ckpt);
  for (const cJSON *te = T ? T->child : NULL; te && st == PX_OK; te = te->next) {
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(te, "pieces");
    const char *dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(te, "dtype"));
    for (const cJSON *pe = ps ? ps->child : NULL; pe && st == PX_OK; pe = pe->next) {
      const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pe, "file"));
      if (!file || strncmp(file, L->prefix, strlen(L->prefix)) != 0 || !has_suffix(file, ".safetensors")) continue;
      int fi = 0;
      for (const cJSON *f = F->child; f && strcmp(f->string, file) != 0; f = f->next) fi++;
      if (fi == n_files) {
        st = px_error(PX_ERR_FORMAT, "checkpoint %s: %s: tensor \"%s\" has a piece in \"%s\", which it does not list",
                      L->ckpt, PX_CKPT_INDEX, te->string, file);
        break;
      }
      need q;
      if ((st = read_need(L->ckpt, te->string, te, pe, &q)) != PX_OK) break;
      bool known;
      if (!px_ckpt_loader_needs(L, &q.box, &known)) {
        if (!known && L->strict)
          st = px_error(PX_ERR_INVALID,
                        "checkpoint %s: file \"%s\" holds a piece of tensor \"%s\", which this model "
                        "does not have (another model?)",
                        L->ckpt, file, te->string);
        continue;
      }
      if (!dt || strcmp(dt, "F32") != 0) {
        st = px_error(PX_ERR_FORMAT, "checkpoint %s: file \"%s\": tensor \"%s\" is %s; this plexus loads F32", L->ckpt,
                      file, te->string, dt ? dt : "(no dtype)");
        break;
      }
      if (count[fi] == cap[fi]) {
        cap[fi] = cap[fi] ? 2 * cap[fi] : 16;
        need *g = realloc(by_file[fi], (size_t)cap[fi] * sizeof *g);
        if (!g) {
          st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", L->ckpt);
          break;
        }
        by_file[fi] = g;
      }
      by_file[fi][count[fi]++] = q;
    }
  }
#ifdef POSIX_FADV_WILLNEED
  // Before the first file is read, the disk is asked for every file this
  // rank needs most of (a hint; as MAP_POPULATE in read_file_pieces): their
  // reads then queue together instead of one file's after the other's
  // checks.
  if (st == PX_OK) {
    int k = 0;
    for (const cJSON *f = F ? F->child : NULL; f; f = f->next, k++) {
      if (!count[k]) continue;
      uint64_t file_bytes = 0, wanted = 0;
      if (!json_u64(cJSON_GetObjectItemCaseSensitive(f, "bytes"), &file_bytes)) continue;
      for (int i = 0; i < count[k]; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(by_file[k][i].entry, "data_offsets");
        uint64_t b = 0, e = 0;
        if (cJSON_GetArraySize(o) == 2 && json_u64(cJSON_GetArrayItem(o, 0), &b) &&
            json_u64(cJSON_GetArrayItem(o, 1), &e) && e > b)
          wanted += e - b;
      }
      if (2 * wanted < file_bytes) continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", L->ckpt, f->string);
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;  // read_file_pieces says why
      (void)posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
      close(fd);
    }
  }
#endif
  int fi = 0;
  for (const cJSON *f = F ? F->child : NULL; f && st == PX_OK; f = f->next, fi++) {
    if (!count[fi]) continue;
    const char *name = NULL;
    for (int s = 0; s < sums->n && !name; s++)
      if (strcmp(sums->items[s].name, f->string) == 0) name = sums->items[s].name;
    st = read_file_pieces(L, name, f, by_file[fi], count[fi]);
  }
  for (int i = 0; by_file && i < n_files; i++) free(by_file[i]);
  free(by_file);
  free(count);
  free(cap);
  cJSON_Delete(ix);
  return st;
}
