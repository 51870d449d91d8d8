// IDX files (data.h): LeCun's format for MNIST and its descendants.
//
//   bytes 0-1  zero
//   byte  2    type code: 08 u8, 09 i8, 0B i16, 0C i32, 0D f32, 0E f64
//   byte  3    number of dims D
//   4·D bytes  dims, big-endian u32
//   the data, row-major, big-endian
//
// The data is converted to host order element by element with shifts, so
// the code is the same on either byte order.
#include "data/file.h"
#include "plexus/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct idx_type {
  unsigned code;
  px_dtype dtype;
  size_t size;
  const char *name;
} idx_type;

static const idx_type idx_types[] = {
  {0x08, PX_U8, 1, "u8"},   {0x09, PX_I8, 1, "i8"},   {0x0B, PX_I16, 2, "i16"},
  {0x0C, PX_I32, 4, "i32"}, {0x0D, PX_F32, 4, "f32"}, {0x0E, PX_F64, 8, "f64"},
};

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

// "(60000, 28, 28)" into buf.
static const char *dims_text(const int64_t *dims, int ndim, char *buf, size_t cap) {
  size_t k = 0;
  buf[k++] = '(';
  for (int i = 0; i < ndim && k < cap; i++) {
    int w = snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)dims[i]);
    k = w < 0 ? cap : k + (size_t)w;
  }
  if (k < cap - 1) {
    buf[k++] = ')';
    buf[k] = '\0';
  }
  buf[cap - 1] = '\0';
  return buf;
}

px_status px_idx_parse(const void *buf, size_t n, const char *name, px_idx *out) {
  memset(out, 0, sizeof *out);
  if (!name) name = "(memory)";
  const unsigned char *b = buf;
  if (!b && n > 0) return px_error(PX_ERR_INVALID, "idx %s: NULL buffer", name);
  if (n < 4) return px_error(PX_ERR_FORMAT, "idx %s: %zu bytes, too short for the 4-byte IDX magic", name, n);
  if (b[0] != 0 || b[1] != 0)
    return px_error(PX_ERR_FORMAT,
                    "idx %s: bad magic %02X %02X %02X %02X: an IDX file starts with two zero bytes, a type code "
                    "and the number of dims (00 00 08 03 for MNIST images)",
                    name, b[0], b[1], b[2], b[3]);
  const idx_type *t = NULL;
  for (size_t k = 0; k < sizeof idx_types / sizeof idx_types[0]; k++)
    if (idx_types[k].code == b[2]) t = &idx_types[k];
  if (!t)
    return px_error(PX_ERR_FORMAT,
                    "idx %s: unsupported type code 0x%02X (expected 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, "
                    "0x0D f32 or 0x0E f64)",
                    name, b[2]);
  int ndim = b[3];
  if (ndim < 1 || ndim > 8)
    return px_error(PX_ERR_FORMAT, "idx %s: %d dims; plexus reads IDX arrays of 1 to 8 dims", name, ndim);
  size_t head = 4 + 4 * (size_t)ndim;
  if (n < head)
    return px_error(PX_ERR_FORMAT, "idx %s: truncated header: %d dims need %zu header bytes, the file has %zu", name,
                    ndim, head, n);
  // numel · size, refusing overflow: the product must fit in the file anyway.
  uint64_t count = 1;
  bool overflow = false;
  for (int i = 0; i < ndim; i++) {
    out->dims[i] = be32(b + 4 + 4 * i);
    uint64_t d = (uint64_t)out->dims[i];
    if (d != 0 && count > UINT64_MAX / d) overflow = true;
    else count *= d;
  }
  char dt[160];
  if (overflow || count > (UINT64_MAX - head) / t->size || count * t->size > SIZE_MAX - head)
    return px_error(PX_ERR_FORMAT, "idx %s: dims %s of %s describe more data than any file holds", name,
                    dims_text(out->dims, ndim, dt, sizeof dt), t->name);
  size_t nbytes = (size_t)(count * t->size);
  if (n - head != nbytes) {
    bool cut = n - head < nbytes;
    px_status st = px_error(PX_ERR_FORMAT,
                            "idx %s: %s: dims %s of %s need %zu bytes of data after the %zu-byte header, the file "
                            "has %zu (%zu %s)",
                            name, cut ? "truncated" : "trailing bytes", dims_text(out->dims, ndim, dt, sizeof dt),
                            t->name, nbytes, head, n - head, cut ? nbytes - (n - head) : (n - head) - nbytes,
                            cut ? "missing" : "extra");
    memset(out, 0, sizeof *out);
    return st;
  }
  void *data = malloc(nbytes ? nbytes : 1);
  if (!data) {
    memset(out, 0, sizeof *out);
    return px_error(PX_ERR_NOMEM, "idx %s: out of memory for %zu bytes", name, nbytes);
  }
  const unsigned char *src = b + head;
  size_t m = (size_t)count;
  switch (t->size) {
  case 1: memcpy(data, src, nbytes); break;
  case 2:
    for (size_t i = 0; i < m; i++) {
      uint16_t v = (uint16_t)(src[2 * i] << 8 | src[2 * i + 1]);
      memcpy((char *)data + 2 * i, &v, 2);
    }
    break;
  case 4:
    for (size_t i = 0; i < m; i++) {
      uint32_t v = be32(src + 4 * i);
      memcpy((char *)data + 4 * i, &v, 4);
    }
    break;
  default:
    for (size_t i = 0; i < m; i++) {
      uint64_t v = (uint64_t)be32(src + 8 * i) << 32 | be32(src + 8 * i + 4);
      memcpy((char *)data + 8 * i, &v, 8);
    }
    break;
  }
  out->dtype = t->dtype;
  out->ndim = ndim;
  out->data = data;
  out->nbytes = nbytes;
  return PX_OK;
}

px_status px_idx_read(const char *path, px_idx *out) {
  memset(out, 0, sizeof *out);
  if (!path || !*path) return px_error(PX_ERR_INVALID, "idx: empty path");
  void *buf;
  size_t n;
  px_status st = px_data_read_file(path, "idx", true, &buf, &n);
  if (st != PX_OK) return st;
  st = px_idx_parse(buf, n, path, out);
  free(buf);
  return st;
}

void px_idx_free(px_idx *idx) {
  if (!idx) return;
  free(idx->data);
  memset(idx, 0, sizeof *idx);
}
