// The safetensors header: a strict, bounds-checked JSON parser for exactly
// what the format needs, so no JSON library is required.
//
//   {"__metadata__": {str: str, ...} | null,
//    name: {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end], other: any}, ...}
//
// Nothing in the header is trusted: every read is bounds-checked against the
// header's length, numbers against 64-bit overflow, strings for valid UTF-8
// and escapes (\uXXXX with UTF-16 pairs).  Errors name the file, the tensor,
// what was expected and what was found.
#include "io/internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Nesting allowed in values we skip (unknown fields); ours nest 3 deep.
#define ST_MAX_DEPTH 64

// safetensors dtypes that are valid but have no px_dtype.
static bool dtype_known_unsupported(const char *name) {
  static const char *const names[] = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(name, names[i]) == 0) return true;
  return false;
}

#define ST_DTYPES_READ "F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL"

/* ---- small helpers -------------------------------------------------------- */

// A zero dimension makes the product zero whatever the others are.
bool px_st_nbytes(const int64_t *shape, int ndim, size_t elem, uint64_t *out) {
  uint64_t n = 1;
  bool overflow = false;
  for (int i = 0; i < ndim; i++) {
    uint64_t d = (uint64_t)shape[i];
    if (d == 0) {
      *out = 0;
      return true;
    }
    if (n > UINT64_MAX / d) overflow = true;
    else n *= d;
  }
  if (overflow || (elem && n > UINT64_MAX / elem)) return false;
  *out = n * elem;
  return true;
}

// Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), or 0.
static size_t utf8_seq_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  if (c < 0xC2 || c > 0xF4 || n < len) return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  if (c == 0xE0 && s[1] < 0xA0) return 0;   // overlong
  if (c == 0xED && s[1] >= 0xA0) return 0;  // UTF-16 surrogate
  if (c == 0xF0 && s[1] < 0x90) return 0;   // overlong
  if (c == 0xF4 && s[1] >= 0x90) return 0;  // past U+10FFFF
  return len;
}

bool px_st_utf8_valid(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq_len(u + i, n - i);
    if (!k) return false;
    i += k;
  }
  return true;
}

/* ---- the header parser ------------------------------------------------------ */

typedef struct jp {
  const unsigned char *s;
  size_t n, pos;
  px_safetensors *f;
  const char *tensor;  // name of the entry being parsed, for messages
} jp;

static px_status jp_fail(jp *p, px_status st, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 3, 4)))
#endif
  ;

static px_status jp_fail(jp *p, px_status st, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (p->tensor)
    px_error(st, "safetensors: tensor \"%s\" in %s: bad header at byte %zu: %s", p->tensor, p->f->path, p->pos, msg);
  else px_error(st, "safetensors: %s: bad header at byte %zu: %s", p->f->path, p->pos, msg);
  return st;
}

// A readable name for the byte at the cursor, for "expected X, found Y".
static const char *jp_found(const jp *p, char *buf, size_t len) {
  if (p->pos >= p->n) return "the end of the header";
  unsigned c = p->s[p->pos];
  if (c > 0x20 && c < 0x7f) snprintf(buf, len, "'%c'", (char)c);
  else snprintf(buf, len, "byte 0x%02x", c);
  return buf;
}

static void jp_ws(jp *p) {
  while (p->pos < p->n) {
    unsigned char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    p->pos++;
  }
}

static bool jp_peek(jp *p, unsigned char c) {
  jp_ws(p);
  return p->pos < p->n && p->s[p->pos] == c;
}

static px_status jp_expect(jp *p, unsigned char c, const char *what) {
  if (jp_peek(p, c)) {
    p->pos++;
    return PX_OK;
  }
  char buf[16];
  return jp_fail(p, PX_ERR_FORMAT, "expected %s, found %s", what, jp_found(p, buf, sizeof buf));
}

// After a member: ',' (returns true in *more) or the closing bracket.
static px_status jp_next(jp *p, unsigned char close, bool *more) {
  jp_ws(p);
  if (p->pos < p->n && p->s[p->pos] == ',') {
    p->pos++;
    *more = true;
    return PX_OK;
  }
  if (p->pos < p->n && p->s[p->pos] == close) {
    p->pos++;
    *more = false;
    return PX_OK;
  }
  char buf[16];
  return jp_fail(p, PX_ERR_FORMAT, "expected ',' or '%c', found %s", close, jp_found(p, buf, sizeof buf));
}

static int hex_val(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Four hex digits at s[pos..pos+4) into *cp.
static px_status jp_hex4(jp *p, size_t at, unsigned *cp) {
  if (at + 4 > p->n) return jp_fail(p, PX_ERR_FORMAT, "\\u escape cut short");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hex_val(p->s[at + (size_t)i]);
    if (h < 0) return jp_fail(p, PX_ERR_FORMAT, "\\u escape needs 4 hex digits");
    v = v * 16 + (unsigned)h;
  }
  *cp = v;
  return PX_OK;
}

static size_t utf8_put(char *o, unsigned cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | cp >> 12);
    o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | cp >> 18);
  o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

// A JSON string, decoded into a new NUL-terminated UTF-8 string.  NUL itself
// (\u0000) is refused: names and metadata are C strings here.
static px_status jp_string(jp *p, char **out) {
  *out = NULL;
  char buf[16];
  if (!jp_peek(p, '"')) return jp_fail(p, PX_ERR_FORMAT, "expected a string, found %s", jp_found(p, buf, sizeof buf));
  size_t start = ++p->pos, end = start;
  // The decoded string is never longer than its escaped form.
  while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
  if (end >= p->n) return jp_fail(p, PX_ERR_FORMAT, "string not terminated");
  char *o = malloc(end - start + 1);
  if (!o) return px_error(PX_ERR_NOMEM, "safetensors: %s: out of memory", p->f->path);
  size_t k = 0;
  px_status st = PX_OK;
  while (p->pos < end) {
    unsigned char c = p->s[p->pos];
    if (c < 0x20) {
      st = jp_fail(p, PX_ERR_FORMAT, "control byte 0x%02x inside a string", c);
      break;
    }
    if (c >= 0x80) {
      size_t len = utf8_seq_len(p->s + p->pos, end - p->pos);
      if (!len) {
        st = jp_fail(p, PX_ERR_FORMAT, "string is not valid UTF-8");
        break;
      }
      memcpy(o + k, p->s + p->pos, len);
      k += len;
      p->pos += len;
      continue;
    }
    if (c != '\\') {
      o[k++] = (char)c;
      p->pos++;
      continue;
    }
    unsigned char e = p->s[p->pos + 1];  // exists: end > pos + 1 after a backslash
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      static const char decoded[] = "\"\\/\b\f\n\r\t";
      o[k++] = decoded[simple - "\"\\/bfnrt"];
      p->pos += 2;
      continue;
    }
    if (e != 'u') {
      st = jp_fail(p, PX_ERR_FORMAT, "unknown escape \\%c in a string", e >= 0x20 && e < 0x7f ? e : '?');
      break;
    }
    unsigned cp = 0;
    if ((st = jp_hex4(p, p->pos + 2, &cp)) != PX_OK) break;
    size_t used = 6;
    if (cp >= 0xD800 && cp <= 0xDBFF) {  // a UTF-16 pair: \uD8xx\uDCxx
      unsigned lo;
      if (p->pos + 12 > end || p->s[p->pos + 6] != '\\' || p->s[p->pos + 7] != 'u' ||
          jp_hex4(p, p->pos + 8, &lo) != PX_OK || lo < 0xDC00 || lo > 0xDFFF) {
        st = jp_fail(p, PX_ERR_FORMAT, "\\u%04X is half of a UTF-16 pair whose other half is missing", cp);
        break;
      }
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      used = 12;
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
      st = jp_fail(p, PX_ERR_FORMAT, "\\u%04X is a lone UTF-16 low surrogate", cp);
      break;
    } else if (cp == 0) {
      st = jp_fail(p, PX_ERR_FORMAT, "\\u0000 (NUL) inside a string is not supported");
      break;
    }
    k += utf8_put(o + k, cp);
    p->pos += used;
  }
  if (st != PX_OK) {
    free(o);
    return st;
  }
  o[k] = '\0';
  p->pos = end + 1;
  *out = o;
  return PX_OK;
}

// A non-negative integer (shape dims, offsets); `what` names it in messages.
static px_status jp_uint(jp *p, uint64_t *out, const char *what) {
  jp_ws(p);
  size_t at = p->pos;
  bool neg = at < p->n && p->s[at] == '-';
  if (neg) at++;
  char buf[16];
  if (at >= p->n || p->s[at] < '0' || p->s[at] > '9')
    return jp_fail(p, PX_ERR_FORMAT, "%s: expected a non-negative integer, found %s", what,
                   jp_found(p, buf, sizeof buf));
  if (p->s[at] == '0' && at + 1 < p->n && p->s[at + 1] >= '0' && p->s[at + 1] <= '9')
    return jp_fail(p, PX_ERR_FORMAT, "%s: a number with a leading zero is not JSON", what);
  uint64_t v = 0;
  bool big = false;
  for (; at < p->n && p->s[at] >= '0' && p->s[at] <= '9'; at++) {
    unsigned d = p->s[at] - '0';
    if (v > (UINT64_MAX - d) / 10) big = true;
    else v = v * 10 + d;
  }
  if (at < p->n && (p->s[at] == '.' || p->s[at] == 'e' || p->s[at] == 'E'))
    return jp_fail(p, PX_ERR_FORMAT, "%s: expected an integer, found a number with a fraction or exponent", what);
  if (neg && (v || big))
    return jp_fail(p, PX_ERR_FORMAT, "%s: expected a non-negative integer, found -%s%" PRIu64, what, big ? ">" : "", v);
  if (big) return jp_fail(p, PX_ERR_FORMAT, "%s: number does not fit in 64 bits", what);
  p->pos = at;
  *out = v;
  return PX_OK;
}

// [a, b, ...] of non-negative integers: all are counted in *count, the first
// `cap` stored.
static px_status jp_uint_array(jp *p, uint64_t *vals, int cap, int *count, const char *what) {
  *count = 0;
  px_status st = jp_expect(p, '[', "'[' (an array of integers)");
  if (st != PX_OK) return st;
  if (jp_peek(p, ']')) {
    p->pos++;
    return PX_OK;
  }
  for (bool more = true; more;) {
    char label[48];
    snprintf(label, sizeof label, "%s[%d]", what, *count);
    uint64_t v = 0;
    if ((st = jp_uint(p, &v, label)) != PX_OK) return st;
    if (*count < cap) vals[*count] = v;
    if (*count == 1 << 20) return jp_fail(p, PX_ERR_FORMAT, "%s has more than 2^20 entries", what);
    (*count)++;
    if ((st = jp_next(p, ']', &more)) != PX_OK) return st;
  }
  return PX_OK;
}

static bool jp_literal(jp *p, const char *lit) {
  size_t k = strlen(lit);
  if (p->pos + k > p->n || memcmp(p->s + p->pos, lit, k) != 0) return false;
  p->pos += k;
  return true;
}

static bool is_digit(const jp *p) { return p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9'; }

// Any JSON value, checked and thrown away (fields this reader does not use).
static px_status jp_skip(jp *p, int depth) {
  char buf[16];
  if (depth > ST_MAX_DEPTH) return jp_fail(p, PX_ERR_FORMAT, "values nested more than %d deep", ST_MAX_DEPTH);
  jp_ws(p);
  if (p->pos >= p->n) return jp_fail(p, PX_ERR_FORMAT, "expected a value, found the end of the header");
  unsigned char c = p->s[p->pos];
  px_status st;
  if (c == '"') {
    char *s;
    if ((st = jp_string(p, &s)) == PX_OK) free(s);
    return st;
  }
  if (c == '{' || c == '[') {
    unsigned char close = c == '{' ? '}' : ']';
    p->pos++;
    if (jp_peek(p, close)) {
      p->pos++;
      return PX_OK;
    }
    for (bool more = true; more;) {
      if (c == '{') {
        char *key;
        if ((st = jp_string(p, &key)) != PX_OK) return st;
        free(key);
        if ((st = jp_expect(p, ':', "':'")) != PX_OK) return st;
      }
      if ((st = jp_skip(p, depth + 1)) != PX_OK) return st;
      if ((st = jp_next(p, close, &more)) != PX_OK) return st;
    }
    return PX_OK;
  }
  if (jp_literal(p, "true") || jp_literal(p, "false") || jp_literal(p, "null")) return PX_OK;
  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  if (c == '-') p->pos++;
  if (!is_digit(p)) return jp_fail(p, PX_ERR_FORMAT, "expected a value, found %s", jp_found(p, buf, sizeof buf));
  if (p->s[p->pos] == '0') p->pos++;
  else
    while (is_digit(p)) p->pos++;
  if (p->pos < p->n && p->s[p->pos] == '.') {
    p->pos++;
    if (!is_digit(p)) return jp_fail(p, PX_ERR_FORMAT, "expected a digit after '.'");
    while (is_digit(p)) p->pos++;
  }
  if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    p->pos++;
    if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
    if (!is_digit(p)) return jp_fail(p, PX_ERR_FORMAT, "expected a digit in an exponent");
    while (is_digit(p)) p->pos++;
  }
  return PX_OK;
}

// "__metadata__": {"key": "value", ...} or null.
static px_status jp_metadata(jp *p) {
  px_safetensors *f = p->f;
  if (f->has_meta) return jp_fail(p, PX_ERR_FORMAT, "\"__metadata__\" appears twice");
  f->has_meta = true;
  jp_ws(p);
  if (jp_literal(p, "null")) return PX_OK;
  px_status st = jp_expect(p, '{', "'{' (\"__metadata__\" maps strings to strings)");
  if (st != PX_OK) return st;
  if (jp_peek(p, '}')) {
    p->pos++;
    return PX_OK;
  }
  for (bool more = true; more;) {
    if (f->n_meta == f->meta_cap) {
      int cap = f->meta_cap ? 2 * f->meta_cap : 8;
      px_st_meta *m = realloc(f->meta, (size_t)cap * sizeof *m);
      if (!m) return px_error(PX_ERR_NOMEM, "safetensors: %s: out of memory", f->path);
      f->meta = m;
      f->meta_cap = cap;
    }
    px_st_meta *m = &f->meta[f->n_meta];
    if ((st = jp_string(p, &m->key)) != PX_OK) return st;
    char buf[16];
    if ((st = jp_expect(p, ':', "':'")) != PX_OK || !jp_peek(p, '"')) {
      if (st == PX_OK)
        st = jp_fail(p, PX_ERR_FORMAT, "\"__metadata__\" value of \"%s\": expected a string, found %s", m->key,
                     jp_found(p, buf, sizeof buf));
      free(m->key);
      return st;
    }
    if ((st = jp_string(p, &m->value)) != PX_OK) {
      free(m->key);
      return st;
    }
    f->n_meta++;
    if ((st = jp_next(p, '}', &more)) != PX_OK) return st;
  }
  return PX_OK;
}

// Checks one entry against the body and appends it.
static px_status add_tensor(px_safetensors *f, const char *name, const char *dtype_name, const uint64_t *dims, int ndim,
                            const uint64_t *offs, int n_offs) {
  const char *path = f->path;
  px_dtype dtype;
  if (px_dtype_parse(dtype_name, &dtype) != PX_OK) {
    if (dtype_known_unsupported(dtype_name))
      return px_error(PX_ERR_UNSUPPORTED,
                      "safetensors: tensor \"%s\" in %s has dtype %s, which plexus does not support; it "
                      "reads " ST_DTYPES_READ,
                      name, path, dtype_name);
    return px_error(PX_ERR_FORMAT,
                    "safetensors: tensor \"%s\" in %s has unknown dtype \"%.32s\"; expected one of " ST_DTYPES_READ,
                    name, path, dtype_name);
  }
  if (ndim > PX_MAX_DIMS)
    return px_error(PX_ERR_UNSUPPORTED,
                    "safetensors: tensor \"%s\" in %s has %d dimensions; plexus tensors have at most %d", name, path,
                    ndim, PX_MAX_DIMS);
  int64_t shape[PX_MAX_DIMS] = {0};
  for (int i = 0; i < ndim; i++) {
    if (dims[i] > (uint64_t)INT64_MAX)
      return px_error(PX_ERR_FORMAT,
                      "safetensors: tensor \"%s\" in %s has shape[%d] = %" PRIu64 ", larger than 2^63 - 1", name, path,
                      i, dims[i]);
    shape[i] = (int64_t)dims[i];
  }
  if (n_offs != 2)
    return px_error(PX_ERR_FORMAT, "safetensors: tensor \"%s\" in %s has %d data_offsets; expected 2 ([begin, end])",
                    name, path, n_offs);
  uint64_t begin = offs[0], end = offs[1];
  if (begin > end)
    return px_error(PX_ERR_FORMAT,
                    "safetensors: tensor \"%s\" in %s has data_offsets [%" PRIu64 ", %" PRIu64
                    "]: expected begin <= end",
                    name, path, begin, end);
  if (end > f->body_size)
    return px_error(PX_ERR_FORMAT,
                    "safetensors: tensor \"%s\" in %s has data_offsets [%" PRIu64 ", %" PRIu64
                    "] but the data section is only %zu bytes; is the file truncated?",
                    name, path, begin, end, f->body_size);
  char sbuf[PX_SHAPE_STR_MAX];
  uint64_t nbytes;
  if (!px_st_nbytes(shape, ndim, px_dtype_size(dtype), &nbytes))
    return px_error(PX_ERR_FORMAT,
                    "safetensors: tensor \"%s\" in %s has shape %s, whose size in bytes overflows 64 bits", name, path,
                    px_shape_str(ndim, shape, sbuf, sizeof sbuf));
  if (end - begin != nbytes)
    return px_error(PX_ERR_FORMAT,
                    "safetensors: tensor \"%s\" in %s has data_offsets [%" PRIu64 ", %" PRIu64 "] (%" PRIu64
                    " bytes) but dtype %s and shape %s need %" PRIu64 " bytes",
                    name, path, begin, end, end - begin, px_dtype_name(dtype),
                    px_shape_str(ndim, shape, sbuf, sizeof sbuf), nbytes);

  if (f->count == f->cap) {
    if (f->cap > (1 << 28)) return px_error(PX_ERR_FORMAT, "safetensors: %s has too many tensors", path);
    int cap = f->cap ? 2 * f->cap : 16;
    px_named_tensor *t = realloc(f->tensors, (size_t)cap * sizeof *t);
    if (t) f->tensors = t;
    px_st_span *s = t ? realloc(f->spans, (size_t)cap * sizeof *s) : NULL;
    if (s) f->spans = s;
    if (!t || !s) return px_error(PX_ERR_NOMEM, "safetensors: %s: out of memory", path);
    f->cap = cap;
  }
  px_named_tensor *t = &f->tensors[f->count];
  memset(t, 0, sizeof *t);
  memcpy(t->name, name, strlen(name) + 1);  // length checked by the caller
  t->tensor = px_tensor_view(f->body + begin, dtype, ndim, shape);
  f->spans[f->count] = (px_st_span){begin, end};
  f->count++;
  return PX_OK;
}

// name: {"dtype": ..., "shape": [...], "data_offsets": [b, e]}; other fields
// are allowed and skipped, as the reference reader does.
static px_status jp_tensor(jp *p, const char *name) {
  char *dtype = NULL;
  uint64_t dims[PX_MAX_DIMS], offs[2];
  int ndim = -1, n_offs = -1;
  px_status st = jp_expect(p, '{', "'{' (a tensor's dtype, shape and data_offsets)");
  if (st != PX_OK) return st;
  bool more = !jp_peek(p, '}');
  if (!more) p->pos++;
  while (more && st == PX_OK) {
    char *key;
    if ((st = jp_string(p, &key)) != PX_OK) break;
    size_t key_pos = p->pos;
    if ((st = jp_expect(p, ':', "':'")) == PX_OK) {
      bool dup = false;
      if (strcmp(key, "dtype") == 0) {
        if (!(dup = dtype != NULL)) {
          jp_ws(p);
          char buf[16];
          if (!jp_peek(p, '"'))
            st = jp_fail(p, PX_ERR_FORMAT, "dtype: expected a string, found %s", jp_found(p, buf, sizeof buf));
          else st = jp_string(p, &dtype);
        }
      } else if (strcmp(key, "shape") == 0) {
        if (!(dup = ndim >= 0)) st = jp_uint_array(p, dims, PX_MAX_DIMS, &ndim, "shape");
      } else if (strcmp(key, "data_offsets") == 0) {
        if (!(dup = n_offs >= 0)) st = jp_uint_array(p, offs, 2, &n_offs, "data_offsets");
      } else {
        st = jp_skip(p, 2);
      }
      if (dup) {
        p->pos = key_pos;
        st = jp_fail(p, PX_ERR_FORMAT, "field \"%s\" appears twice", key);
      }
    }
    free(key);
    if (st == PX_OK) st = jp_next(p, '}', &more);
  }
  if (st == PX_OK) {
    const char *missing = !dtype ? "dtype" : ndim < 0 ? "shape" : n_offs < 0 ? "data_offsets" : NULL;
    if (missing)
      st = px_error(PX_ERR_FORMAT, "safetensors: tensor \"%s\" in %s has no \"%s\" in the header", name, p->f->path,
                    missing);
    else st = add_tensor(p->f, name, dtype, dims, ndim, offs, n_offs);
  }
  free(dtype);
  return st;
}

static px_status jp_header(jp *p) {
  char buf[16];
  jp_ws(p);
  if (p->pos >= p->n || p->s[p->pos] != '{')
    return jp_fail(p, PX_ERR_FORMAT,
                   "expected '{' (the header is a JSON object), found %s; is this a safetensors file?",
                   jp_found(p, buf, sizeof buf));
  p->pos++;
  px_status st = PX_OK;
  bool more = !jp_peek(p, '}');
  if (!more) p->pos++;
  while (more && st == PX_OK) {
    char *name;
    if ((st = jp_string(p, &name)) != PX_OK) break;
    if ((st = jp_expect(p, ':', "':'")) == PX_OK) {
      if (strcmp(name, "__metadata__") == 0) {
        st = jp_metadata(p);
      } else if (strlen(name) >= PX_NAME_MAX) {
        st = px_error(PX_ERR_UNSUPPORTED,
                      "safetensors: tensor \"%.64s...\" in %s has a name of %zu bytes; plexus allows at most %d", name,
                      p->f->path, strlen(name), PX_NAME_MAX - 1);
      } else {
        p->tensor = name;
        st = jp_tensor(p, name);
        p->tensor = NULL;
      }
    }
    free(name);
    if (st == PX_OK) st = jp_next(p, '}', &more);
  }
  if (st != PX_OK) return st;
  jp_ws(p);  // writers pad the header with spaces
  if (p->pos != p->n)
    return jp_fail(p, PX_ERR_FORMAT, "expected only spaces after the header object, found %s",
                   jp_found(p, buf, sizeof buf));
  return PX_OK;
}

px_status px_st_parse_header(px_safetensors *f, const unsigned char *json, size_t n) {
  jp p = {.s = json, .n = n, .pos = 0, .f = f, .tensor = NULL};
  return jp_header(&p);
}
