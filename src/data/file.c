// Whole-file reads and gzip inflation for the data sources (file.h).
#define _POSIX_C_SOURCE 200809L
#include "data/file.h"

#include "data/s3.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

// zlib counts in uInt (32 bits): feed it at most this much at a time.
#define ZCHUNK ((size_t)1 << 30)

px_status px_data_gunzip(const void *buf, size_t n, const char *what, const char *name, void **out, size_t *out_n) {
  *out = NULL;
  *out_n = 0;
  const unsigned char *in = buf;
  // gzip's trailer ends with the (last member's) length mod 2^32: a good
  // first guess of the output size, if it is possible at all — deflate
  // expands at most ~1032:1, and a damaged trailer must not make us ask for
  // gigabytes before the data turns out to be bad.
  size_t cap = 1 << 16;
  if (n >= 18) {
    size_t isize = (size_t)in[n - 4] | (size_t)in[n - 3] << 8 | (size_t)in[n - 2] << 16 | (size_t)in[n - 1] << 24;
    size_t most = n < SIZE_MAX / 1032 - 1 ? 1032 * n : SIZE_MAX - 1;
    if (isize + 1 > cap && isize <= most) cap = isize + 1;
  }
  unsigned char *o = malloc(cap);
  if (!o) return px_error(PX_ERR_NOMEM, "%s %s: out of memory for %zu inflated bytes", what, name, cap);
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
    free(o);
    return px_error(PX_ERR_NOMEM, "%s %s: zlib could not start inflating", what, name);
  }
  px_status st = PX_OK;
  size_t in_pos = 0, len = 0;
  for (;;) {
    if (len == cap) {
      if (cap > SIZE_MAX / 2) {
        st = px_error(PX_ERR_NOMEM, "%s %s: inflated data too large", what, name);
        break;
      }
      unsigned char *p = realloc(o, cap * 2);
      if (!p) {
        st = px_error(PX_ERR_NOMEM, "%s %s: out of memory for %zu inflated bytes", what, name, cap * 2);
        break;
      }
      o = p;
      cap *= 2;
    }
    size_t in_left = n - in_pos, out_left = cap - len;
    z.next_in = (unsigned char *)in + in_pos;
    z.avail_in = (uInt)(in_left < ZCHUNK ? in_left : ZCHUNK);
    z.next_out = o + len;
    z.avail_out = (uInt)(out_left < ZCHUNK ? out_left : ZCHUNK);
    uInt ain = z.avail_in, aout = z.avail_out;
    int ret = inflate(&z, Z_NO_FLUSH);
    in_pos += ain - z.avail_in;
    len += aout - z.avail_out;
    if (ret == Z_STREAM_END) {
      if (in_pos == n) break;
      // gzip(1) concatenates members (`cat a.gz b.gz`); anything else after
      // the end is not gzip data.
      if (px_data_is_gzip(in + in_pos, n - in_pos) && inflateReset(&z) == Z_OK) continue;
      st = px_error(PX_ERR_FORMAT, "%s %s: corrupt gzip: %zu bytes after the end of the compressed data", what, name,
                    n - in_pos);
      break;
    }
    if (ret == Z_OK) continue;
    if (ret == Z_BUF_ERROR && in_pos < n) continue;  // output full: grow
    if (ret == Z_BUF_ERROR) {
      st = px_error(PX_ERR_FORMAT,
                    "%s %s: corrupt gzip: the compressed data ends early after %zu bytes "
                    "(%zu inflated; was the file cut short?)",
                    what, name, n, len);
    } else if (ret == Z_MEM_ERROR) {
      st = px_error(PX_ERR_NOMEM, "%s %s: out of memory inflating", what, name);
    } else {
      st = px_error(PX_ERR_FORMAT, "%s %s: corrupt gzip at compressed byte %zu: zlib says \"%s\"", what, name, in_pos,
                    z.msg ? z.msg : "invalid data");
    }
    break;
  }
  inflateEnd(&z);
  if (st != PX_OK) {
    free(o);
    return st;
  }
  *out = o;
  *out_n = len;
  return PX_OK;
}

px_status px_data_read_file(const char *path, const char *what, bool gunzip, void **out, size_t *out_n) {
  *out = NULL;
  *out_n = 0;
  if (px_s3_is_url(path)) {
    void *buf;
    size_t len;
    px_status st = px_s3_read(path, what, &buf, &len);
    if (st != PX_OK || !gunzip || !px_data_is_gzip(buf, len)) {
      if (st == PX_OK) {
        *out = buf;
        *out_n = len;
      }
      return st;
    }
    st = px_data_gunzip(buf, len, what, path, out, out_n);
    free(buf);
    return st;
  }
  FILE *f = fopen(path, "rb");
  if (!f)
    return px_error(errno == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "%s %s: cannot open: %s", what, path,
                    strerror(errno));
  struct stat sb;
  size_t cap = 1 << 16;
  if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size < SIZE_MAX - 1)
    cap = (size_t)sb.st_size + 1;  // +1: see EOF without a realloc
  if (cap == 0) cap = 1;
  unsigned char *buf = malloc(cap);
  size_t len = 0;
  px_status st = buf ? PX_OK : px_error(PX_ERR_NOMEM, "%s %s: out of memory for %zu bytes", what, path, cap);
  while (st == PX_OK) {
    if (len == cap) {
      unsigned char *p = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
      if (!p) {
        st = px_error(PX_ERR_NOMEM, "%s %s: out of memory", what, path);
        break;
      }
      buf = p;
      cap *= 2;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) {
      if (ferror(f)) st = px_error(PX_ERR_IO, "%s %s: read failed after %zu bytes", what, path, len);
      break;
    }
  }
  fclose(f);
  if (st == PX_OK && gunzip && px_data_is_gzip(buf, len)) {
    void *plain;
    size_t plain_n;
    st = px_data_gunzip(buf, len, what, path, &plain, &plain_n);
    free(buf);
    buf = NULL;
    if (st == PX_OK) {
      buf = plain;
      len = plain_n;
    }
  }
  if (st != PX_OK) {
    free(buf);
    return st;
  }
  *out = buf;
  *out_n = len;
  return PX_OK;
}
