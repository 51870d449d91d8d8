// Token shards (llm.c's format) and the token dataset (data.h).
//
// A shard: 256 little-endian int32 — [0] magic, [1] version, [2] token
// count, the rest zero — then the tokens, little-endian uint16 (magic
// 20240520, version 1) or uint32 (20240801, version 7).
//
// The dataset cuts every shard into windows of T+1 tokens: sample i is
// window j of shard k (shards in sorted order, samples numbered shard after
// shard), starting at s = j·T (+ an offset o in [0, T) with random_offset):
//
//   x = tokens[s .. s+T)      y = tokens[s+1 .. s+T]      (T i32 each)
//
// Without offsets shard k holds floor((n_k - 1) / T) windows; with them
// floor((n_k - T) / T), so that the last window still fits for o = T - 1.
// A window never crosses into the next shard: shards are separate documents
// in llm.c's data, and that keeps a sample a single read.
//
// Shards stay on disk.  Open reads each header and checks the file size;
// get reads its T+1 tokens with pread(2) on a descriptor kept open per shard
// (pread has no shared file position, so workers read at once) and checks
// each token against the vocabulary, so a corrupt token is reported with its
// shard and position when a batch needs it, not by a scan of billions of
// tokens at start-up.
//
// Shards may be S3 objects: a pattern "s3://bucket/prefix" (or with glob
// characters in the key) lists the bucket (data/s3.h).  Open then reads
// each header with one ranged GET, and get reads a window with one more
// ("Range: bytes=a-b" of exactly its T+1 tokens).  With PX_S3_CACHE set,
// open instead copies each shard into the cache once (verified by size)
// and reads it there like a local file.
#define _POSIX_C_SOURCE 200809L
#include "data/tokens.h"

#include "data/s3.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}

// ---- The shard format --------------------------------------------------------

px_status px_shard_parse_header(const void *header, size_t header_bytes, uint64_t file_size, const char *name,
                                px_shard_info *out) {
  memset(out, 0, sizeof *out);
  if (!name) name = "(memory)";
  if (!header && header_bytes > 0) return px_error(PX_ERR_INVALID, "tokens %s: NULL header", name);
  if (header_bytes < PX_SHARD_HEADER_BYTES || file_size < PX_SHARD_HEADER_BYTES)
    return px_error(PX_ERR_FORMAT,
                    "tokens %s: truncated header: a shard starts with a %d-byte header, the file has %llu bytes", name,
                    PX_SHARD_HEADER_BYTES, (unsigned long long)(file_size < header_bytes ? file_size : header_bytes));
  const unsigned char *h = header;
  int32_t magic = (int32_t)le32(h), version = (int32_t)le32(h + 4), count = (int32_t)le32(h + 8);
  int token_bytes, want_version;
  if (magic == PX_SHARD_MAGIC_U16) {
    token_bytes = 2;
    want_version = PX_SHARD_VERSION_U16;
  } else if (magic == PX_SHARD_MAGIC_U32) {
    token_bytes = 4;
    want_version = PX_SHARD_VERSION_U32;
  } else {
    return px_error(PX_ERR_FORMAT,
                    "tokens %s: bad magic %d: a token shard starts with %d (uint16 tokens) or %d (uint32 tokens) as "
                    "a little-endian int32",
                    name, magic, PX_SHARD_MAGIC_U16, PX_SHARD_MAGIC_U32);
  }
  if (version != want_version)
    return px_error(PX_ERR_FORMAT, "tokens %s: version %d with magic %d; expected version %d", name, version, magic,
                    want_version);
  if (count < 0) return px_error(PX_ERR_FORMAT, "tokens %s: negative token count %d in the header", name, count);
  uint64_t body = file_size - PX_SHARD_HEADER_BYTES;
  uint64_t want = (uint64_t)count * (uint64_t)token_bytes;
  if (body < want)
    return px_error(PX_ERR_FORMAT,
                    "tokens %s: truncated body: the header says %d tokens (%llu bytes), the file has %llu bytes after "
                    "the header (%llu tokens missing)",
                    name, count, (unsigned long long)want, (unsigned long long)body,
                    (unsigned long long)((want - body + (uint64_t)token_bytes - 1) / (uint64_t)token_bytes));
  if (body > want)
    return px_error(PX_ERR_FORMAT,
                    "tokens %s: count mismatch: the header says %d tokens (%llu bytes), but the file has %llu bytes "
                    "after the header (%llu bytes extra)",
                    name, count, (unsigned long long)want, (unsigned long long)body, (unsigned long long)(body - want));
  out->token_bytes = token_bytes;
  out->num_tokens = (uint64_t)count;
  return PX_OK;
}

px_status px_shard_write(const char *path, const uint32_t *tokens, size_t n, int token_bytes) {
  if (!path || !*path) return px_error(PX_ERR_INVALID, "tokens: empty shard path");
  if (token_bytes != 2 && token_bytes != 4)
    return px_error(PX_ERR_INVALID, "tokens %s: token_bytes must be 2 or 4, got %d", path, token_bytes);
  if (n > INT32_MAX)
    return px_error(PX_ERR_INVALID, "tokens %s: %zu tokens; a shard holds at most %d (its count is an int32)", path, n,
                    INT32_MAX);
  if (n > 0 && !tokens) return px_error(PX_ERR_INVALID, "tokens %s: NULL tokens", path);
  if (token_bytes == 2)
    for (size_t i = 0; i < n; i++)
      if (tokens[i] > 0xFFFF)
        return px_error(PX_ERR_INVALID,
                        "tokens %s: token %u at position %zu does not fit a uint16 shard; write uint32 tokens "
                        "(token_bytes 4) for vocabularies past 65,536",
                        path, tokens[i], i);
  size_t total = PX_SHARD_HEADER_BYTES + n * (size_t)token_bytes;
  unsigned char *buf = calloc(1, total);
  if (!buf) return px_error(PX_ERR_NOMEM, "tokens %s: out of memory for %zu bytes", path, total);
  put_le32(buf, token_bytes == 2 ? PX_SHARD_MAGIC_U16 : PX_SHARD_MAGIC_U32);
  put_le32(buf + 4, token_bytes == 2 ? PX_SHARD_VERSION_U16 : PX_SHARD_VERSION_U32);
  put_le32(buf + 8, (uint32_t)n);
  unsigned char *body = buf + PX_SHARD_HEADER_BYTES;
  if (token_bytes == 2) {
    for (size_t i = 0; i < n; i++) {
      body[2 * i] = (unsigned char)tokens[i];
      body[2 * i + 1] = (unsigned char)(tokens[i] >> 8);
    }
  } else {
    for (size_t i = 0; i < n; i++) put_le32(body + 4 * i, tokens[i]);
  }
  px_status st = px_write_file_atomic(path, buf, total);
  free(buf);
  return st;
}

// ---- The dataset ---------------------------------------------------------------

typedef struct tok_shard {
  char *path;
  char *url;            // an S3 object read by ranges (fd -1), or NULL
  int fd;               // -1: tokens in memory or in S3
  const uint32_t *mem;  // (num_tokens,) when in memory
  int token_bytes;      // on disk: 2 or 4
  uint64_t num_tokens;
  size_t first;  // dataset index of the shard's first window
  size_t windows;
} tok_shard;

typedef struct tok_source {
  tok_shard *shards;
  size_t n_shards;
  int64_t T;
  bool random_offset;
  size_t vocab_size;  // 0: unchecked
  uint32_t *owned;    // in-memory tokens, freed with the source
} tok_source;

static size_t windows_of(uint64_t n, int64_t T, bool random_offset) {
  uint64_t t = (uint64_t)T;
  if (random_offset) return n >= t ? (size_t)((n - t) / t) : 0;
  return n >= 1 ? (size_t)((n - 1) / t) : 0;
}

// Read tokens [s, s + count) of a shard on disk into dst (raw, little-endian).
static px_status read_span(const tok_shard *sh, uint64_t s, size_t count, unsigned char *dst, size_t sample) {
  size_t want = count * (size_t)sh->token_bytes, got = 0;
  off_t at = (off_t)(PX_SHARD_HEADER_BYTES + s * (uint64_t)sh->token_bytes);
  if (sh->url) {
    px_status st = px_s3_read_range(sh->url, "tokens", (uint64_t)at, want, dst);
    if (st != PX_OK)
      return px_error_wrap(st, "sample %zu (tokens %llu..%llu)", sample, (unsigned long long)s,
                           (unsigned long long)(s + count - 1));
    return PX_OK;
  }
  while (got < want) {
    ssize_t r = pread(sh->fd, dst + got, want - got, at + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      char why[128];  // strerror_r: get runs on several threads
      if (strerror_r(errno, why, sizeof why) != 0) snprintf(why, sizeof why, "error %d", errno);
      return px_error(PX_ERR_IO, "tokens %s: sample %zu: reading tokens %llu..%llu failed: %s", sh->path, sample,
                      (unsigned long long)s, (unsigned long long)(s + count - 1), why);
    }
    if (r == 0)
      return px_error(PX_ERR_IO,
                      "tokens %s: sample %zu: the file ends at byte %llu, before tokens %llu..%llu (it held %llu "
                      "tokens at open: cut short since?)",
                      sh->path, sample, (unsigned long long)(at + (off_t)got), (unsigned long long)s,
                      (unsigned long long)(s + count - 1), (unsigned long long)sh->num_tokens);
    got += (size_t)r;
  }
  return PX_OK;
}

static px_status tok_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  const tok_source *src = d->impl;
  // The shard holding sample i: the last with first <= i.
  size_t lo = 0, hi = src->n_shards;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (src->shards[mid].first <= i) lo = mid;
    else hi = mid;
  }
  const tok_shard *sh = &src->shards[lo];
  size_t T = (size_t)src->T;
  uint64_t s = (uint64_t)(i - sh->first) * T;
  if (src->random_offset && rng) s += px_rng_below(rng, T);
  int32_t *x = (int32_t *)b->x.data + slot * T;
  int32_t *y = (int32_t *)b->y.data + slot * T;

  // T+1 tokens as u32: in memory, or read into a buffer (on the stack when
  // small).
  uint32_t small[2048];
  uint32_t *buf = NULL;
  const uint32_t *tok = sh->mem ? sh->mem + s : NULL;
  px_status st = PX_OK;
  if (!tok) {
    buf = T + 1 <= 2048 ? small : malloc((T + 1) * sizeof *buf);
    if (!buf) return px_error(PX_ERR_NOMEM, "tokens %s: out of memory for a window of %zu tokens", sh->path, T + 1);
    // The raw bytes go to the tail of buf and are widened front to back:
    // token k's bytes lie at or after where its u32 goes, and after every
    // u32 written before it.
    unsigned char *raw = (unsigned char *)buf + (T + 1) * (4 - (size_t)sh->token_bytes);
    st = read_span(sh, s, T + 1, raw, i);
    if (st == PX_OK) {
      if (sh->token_bytes == 2)
        for (size_t k = 0; k <= T; k++) buf[k] = (uint32_t)raw[2 * k] | (uint32_t)raw[2 * k + 1] << 8;
      else
        for (size_t k = 0; k <= T; k++) buf[k] = le32(raw + 4 * k);
    }
    tok = buf;
  }
  if (st == PX_OK) {
    uint64_t bound = src->vocab_size ? src->vocab_size : (uint64_t)INT32_MAX + 1;
    for (size_t k = 0; k <= T; k++) {
      if (tok[k] >= bound) {
        st = px_error(PX_ERR_FORMAT, "tokens %s: token at position %llu (sample %zu) is %u, outside %s %llu", sh->path,
                      (unsigned long long)(s + k), i, tok[k],
                      src->vocab_size ? "the vocabulary of" : "the int32 range: at most",
                      (unsigned long long)(src->vocab_size ? bound : bound - 1));
        break;
      }
    }
  }
  // x = tokens[s .. s+T),  y = tokens[s+1 .. s+T]
  if (st == PX_OK) {
    for (size_t k = 0; k < T; k++) {
      x[k] = (int32_t)tok[k];
      y[k] = (int32_t)tok[k + 1];
    }
  }
  if (buf != small) free(buf);
  return st;
}

static void source_free(tok_source *src) {
  if (!src) return;
  for (size_t k = 0; k < src->n_shards; k++) {
    if (src->shards[k].fd >= 0) close(src->shards[k].fd);
    free(src->shards[k].path);
    free(src->shards[k].url);
  }
  free(src->shards);
  free(src->owned);
  free(src);
}

static void tok_destroy(px_dataset *d) {
  source_free(d->impl);
  free(d);
}

static const px_dataset_ops tok_ops = {tok_get, tok_destroy};

// Number the shards' windows and wrap the source as a dataset; on error
// the source is freed.
static px_status finish(px_dataset **out, tok_source *src, const char *what) {
  size_t total = 0;
  uint64_t tokens = 0;
  for (size_t k = 0; k < src->n_shards; k++) {
    tok_shard *sh = &src->shards[k];
    sh->first = total;
    sh->windows = windows_of(sh->num_tokens, src->T, src->random_offset);
    total += sh->windows;
    tokens += sh->num_tokens;
  }
  px_dataset *d = calloc(1, sizeof *d);
  px_status st = PX_OK;
  if (!d) st = px_error(PX_ERR_NOMEM, "tokens %s: out of memory", what);
  else if (total == 0)
    st = px_error(PX_ERR_INVALID,
                  "tokens %s: %zu shard%s of %llu tokens in all give no sample: a window needs %lld + 1 tokens in one "
                  "shard%s",
                  what, src->n_shards, src->n_shards == 1 ? "" : "s", (unsigned long long)tokens, (long long)src->T,
                  src->random_offset ? ", 2·T with random offsets" : "");
  if (st != PX_OK) {
    free(d);
    source_free(src);
    return st;
  }
  d->ops = &tok_ops;
  d->kind = "tokens";
  d->length = total;
  d->x_dtype = PX_I32;
  d->y_dtype = PX_I32;
  d->x_ndim = 1;
  d->x_shape[0] = src->T;
  d->y_ndim = 1;
  d->y_shape[0] = src->T;
  d->num_classes = src->vocab_size;
  d->impl = src;
  *out = d;
  return PX_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static px_status open_shard(tok_shard *sh, const char *path) {
  sh->fd = -1;
  sh->path = strdup(path);
  if (!sh->path) return px_error(PX_ERR_NOMEM, "tokens %s: out of memory", path);
  sh->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (sh->fd < 0) {
    int err = errno;
    return px_error(PX_ERR_IO, "tokens %s: cannot open: %s%s", path, strerror(err),
                    err == EMFILE ? " (each shard keeps a descriptor open: raise `ulimit -n` or merge shards)" : "");
  }
  struct stat sb;
  if (fstat(sh->fd, &sb) != 0) return px_error(PX_ERR_IO, "tokens %s: cannot stat: %s", path, strerror(errno));
  if (!S_ISREG(sb.st_mode)) return px_error(PX_ERR_FORMAT, "tokens %s: not a regular file", path);
  unsigned char head[PX_SHARD_HEADER_BYTES];
  size_t got = 0;
  while (got < sizeof head) {
    ssize_t r = pread(sh->fd, head + got, sizeof head - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return px_error(PX_ERR_IO, "tokens %s: cannot read the header: %s", path, strerror(errno));
    if (r == 0) break;
    got += (size_t)r;
  }
  px_shard_info info;
  px_status st = px_shard_parse_header(head, got, (uint64_t)sb.st_size, path, &info);
  if (st != PX_OK) return st;
  sh->token_bytes = info.token_bytes;
  sh->num_tokens = info.num_tokens;
  return PX_OK;
}

// A shard in S3 of `size` bytes (from the listing): through the cache when
// there is one, else its header by one ranged GET.
static px_status open_s3_shard(tok_shard *sh, const char *url, uint64_t size) {
  sh->fd = -1;
  char *cached = px_s3_cache_path(url);
  if (cached) {
    free(cached);
    char *local;
    px_status st = px_s3_cache_fetch(url, "tokens", size, &local);
    if (st != PX_OK) return st;
    st = open_shard(sh, local);
    free(local);
    return st;
  }
  sh->path = strdup(url);
  sh->url = strdup(url);
  if (!sh->path || !sh->url) return px_error(PX_ERR_NOMEM, "tokens %s: out of memory", url);
  unsigned char head[PX_SHARD_HEADER_BYTES];
  size_t n = size < sizeof head ? (size_t)size : sizeof head;
  px_status st = px_s3_read_range(url, "tokens", 0, n, head);
  px_shard_info info;
  if (st == PX_OK) st = px_shard_parse_header(head, n, size, url, &info);
  if (st != PX_OK) return st;
  sh->token_bytes = info.token_bytes;
  sh->num_tokens = info.num_tokens;
  return PX_OK;
}

static px_status open_s3(px_dataset **out, const char *pattern, int64_t T, bool random_offset, size_t vocab_size) {
  char **urls;
  uint64_t *sizes;
  size_t n;
  px_status st = px_s3_list(pattern, "tokens", &urls, &sizes, &n);
  if (st != PX_OK) return st;
  tok_source *src = calloc(1, sizeof *src);
  tok_shard *shards = calloc(n, sizeof *shards);
  if (!src || !shards) {
    free(src);
    free(shards);
    px_s3_list_free(urls, sizes, n);
    return px_error(PX_ERR_NOMEM, "tokens %s: out of memory", pattern);
  }
  src->shards = shards;
  src->T = T;
  src->random_offset = random_offset;
  src->vocab_size = vocab_size;
  for (size_t k = 0; k < n && st == PX_OK; k++) {
    src->n_shards = k + 1;
    st = open_s3_shard(&shards[k], urls[k], sizes[k]);
  }
  px_s3_list_free(urls, sizes, n);
  if (st != PX_OK) {
    source_free(src);
    return st;
  }
  return finish(out, src, pattern);
}

px_status px_token_dataset_open(px_dataset **out, const char *pattern, int64_t T, bool random_offset,
                                size_t vocab_size) {
  if (!out) return px_error(PX_ERR_INVALID, "tokens: NULL output");
  *out = NULL;
  if (!pattern || !*pattern) return px_error(PX_ERR_INVALID, "tokens: no shard pattern given");
  if (T < 1 || T > (1 << 24))
    return px_error(PX_ERR_INVALID, "tokens %s: sequence length T = %lld; expected 1 .. 2^24", pattern, (long long)T);
  if (vocab_size > (size_t)INT32_MAX + 1)
    return px_error(PX_ERR_INVALID, "tokens %s: vocab_size %zu does not fit int32 tokens", pattern, vocab_size);
  if (px_s3_is_url(pattern)) return open_s3(out, pattern, T, random_offset, vocab_size);
  glob_t g;
  memset(&g, 0, sizeof g);
  int rc = glob(pattern, 0, NULL, &g);
  if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
    globfree(&g);
    return px_error(PX_ERR_NOT_FOUND, "tokens: no file matches \"%s\"", pattern);
  }
  if (rc != 0) {
    globfree(&g);
    return px_error(rc == GLOB_NOSPACE ? PX_ERR_NOMEM : PX_ERR_IO, "tokens: cannot expand \"%s\" (glob error %d)",
                    pattern, rc);
  }
  // Sorted bytewise, not by the locale's collation: the same order everywhere.
  qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
  tok_source *src = calloc(1, sizeof *src);
  tok_shard *shards = calloc(g.gl_pathc, sizeof *shards);
  if (!src || !shards) {
    free(src);
    free(shards);
    globfree(&g);
    return px_error(PX_ERR_NOMEM, "tokens %s: out of memory", pattern);
  }
  src->shards = shards;
  src->T = T;
  src->random_offset = random_offset;
  src->vocab_size = vocab_size;
  px_status st = PX_OK;
  for (size_t k = 0; k < g.gl_pathc && st == PX_OK; k++) {
    src->n_shards = k + 1;
    st = open_shard(&shards[k], g.gl_pathv[k]);
  }
  globfree(&g);
  if (st != PX_OK) {
    source_free(src);
    return st;
  }
  return finish(out, src, pattern);
}

px_status px_token_dataset_from_memory(px_dataset **out, const char *name, uint32_t *tokens, size_t n, int64_t T,
                                       bool random_offset, size_t vocab_size) {
  *out = NULL;
  if (T < 1 || T > (1 << 24)) {
    free(tokens);
    return px_error(PX_ERR_INVALID, "tokens %s: sequence length T = %lld; expected 1 .. 2^24", name, (long long)T);
  }
  tok_source *src = calloc(1, sizeof *src);
  tok_shard *sh = calloc(1, sizeof *sh);
  char *path = strdup(name);
  if (!src || !sh || !path) {
    free(src);
    free(sh);
    free(path);
    free(tokens);
    return px_error(PX_ERR_NOMEM, "tokens %s: out of memory", name);
  }
  *sh = (tok_shard){.path = path, .fd = -1, .mem = tokens, .token_bytes = 4, .num_tokens = n};
  src->shards = sh;
  src->n_shards = 1;
  src->T = T;
  src->random_offset = random_offset;
  src->vocab_size = vocab_size;
  src->owned = tokens;
  return finish(out, src, name);
}
