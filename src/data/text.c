// Text to tokens and back (data.h): encoding and decoding with a vocabulary
// (words split by words.c), text files to token shards, and a token
// dataset straight from a text file.
#define _POSIX_C_SOURCE 200809L
#include "data/file.h"
#include "data/tokens.h"
#include "data/vocab.h"
#include "data/words.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// llm.c's shard size, when the caller gives none.
#define DEFAULT_SHARD_TOKENS 100000000u

px_status px_vocab_encode(const px_vocab *v, const char *text, size_t n, uint32_t **tokens, size_t *n_tokens) {
  if (!tokens || !n_tokens) return px_error(PX_ERR_INVALID, "encode: NULL output");
  *tokens = NULL;
  *n_tokens = 0;
  if (!v || (!text && n > 0)) return px_error(PX_ERR_INVALID, "encode: NULL vocabulary or text");
  if (px_vocab_kind(v) == PX_TOKENIZER_BYTE) {
    uint32_t *t = malloc((n ? n : 1) * sizeof *t);
    if (!t) return px_error(PX_ERR_NOMEM, "encode: out of memory for %zu tokens", n);
    for (size_t i = 0; i < n; i++) t[i] = (unsigned char)text[i];
    *tokens = t;
    *n_tokens = n;
    return PX_OK;
  }
  // Words are at least 1 byte plus a separator: n/2 + 1 tokens at most,
  // but start smaller (text is mostly longer words) and grow.
  size_t cap = n / 4 + 16, count = 0;
  uint32_t *t = malloc(cap * sizeof *t);
  if (!t) return px_error(PX_ERR_NOMEM, "encode: out of memory for %zu tokens", cap);
  uint32_t eos = px_vocab_eos_id(v);
  px_words it;
  px_words_init(&it, text, n);
  const char *w = NULL;
  size_t len = 0;
  px_word_kind k;
  while ((k = px_words_next(&it, &w, &len)) != PX_WORD_END) {
    if (count == cap) {
      uint32_t *g = realloc(t, 2 * cap * sizeof *t);
      if (!g) {
        free(t);
        return px_error(PX_ERR_NOMEM, "encode: out of memory for %zu tokens", 2 * cap);
      }
      t = g;
      cap *= 2;
    }
    t[count++] = k == PX_WORD_EOL ? eos : px_vocab_id(v, w, len);
  }
  *tokens = t;
  *n_tokens = count;
  return PX_OK;
}

px_status px_vocab_encode_file(const px_vocab *v, const char *path, uint32_t **tokens, size_t *n_tokens) {
  if (!tokens || !n_tokens) return px_error(PX_ERR_INVALID, "encode: NULL output");
  *tokens = NULL;
  *n_tokens = 0;
  if (!path || !*path) return px_error(PX_ERR_INVALID, "encode: empty path");
  void *text;
  size_t n;
  px_status st = px_data_read_file(path, "text", true, &text, &n);
  if (st != PX_OK) return st;
  st = px_vocab_encode(v, text, n, tokens, n_tokens);
  free(text);
  if (st != PX_OK) return px_error_wrap(st, "text %s", path);
  return PX_OK;
}

// Append s (n bytes) at *len of buf (cap bytes, the last kept for the NUL).
static void put(char *buf, size_t cap, size_t *len, const char *s, size_t n) {
  if (*len < cap) {
    size_t room = cap - 1 - *len;
    memcpy(buf + *len, s, n < room ? n : room);
  }
  *len += n;
}

size_t px_vocab_decode(const px_vocab *v, const uint32_t *tokens, size_t n, char *buf, size_t cap) {
  static const char bad[] = "\xEF\xBF\xBD";  // U+FFFD for an id outside the vocabulary
  if (!buf) cap = 0;
  size_t len = 0;
  bool word_kind = px_vocab_kind(v) == PX_TOKENIZER_WORD, mid_line = false;
  uint32_t eos = px_vocab_eos_id(v);
  for (size_t i = 0; i < n; i++) {
    uint32_t id = tokens[i];
    const char *s = px_vocab_token(v, id);
    if (!word_kind) {
      if (s) {
        char c = s[0];  // byte id: the token is that byte
        put(buf, cap, &len, &c, 1);
      } else {
        put(buf, cap, &len, bad, 3);
      }
      continue;
    }
    if (id == eos) {
      put(buf, cap, &len, "\n", 1);
      mid_line = false;
      continue;
    }
    if (mid_line) put(buf, cap, &len, " ", 1);
    if (s) put(buf, cap, &len, s, px_vocab_token_len(v, id));
    else put(buf, cap, &len, bad, 3);
    mid_line = true;
  }
  if (cap > 0) buf[len < cap ? len : cap - 1] = '\0';
  return len;
}

// ---- Text files to shards ----------------------------------------------------------

static char *shard_path(const char *prefix, size_t k) {
  size_t cap = strlen(prefix) + 32;
  char *p = malloc(cap);
  if (p) snprintf(p, cap, "%s_%06zu.bin", prefix, k);
  return p;
}

// Shards "<prefix>_NNNNNN.bin" numbered `from` or more are left from an
// earlier conversion with this prefix that made more shards: a glob would
// read them as part of this text.  Remove them.
static px_status remove_stale_shards(const char *prefix, size_t from) {
  const char *slash = strrchr(prefix, '/');
  const char *base = slash ? slash + 1 : prefix;
  size_t dir_len = slash ? (size_t)(slash - prefix) : 0, base_len = strlen(base);
  char *dirname = malloc(dir_len + 2);
  if (!dirname) return px_error(PX_ERR_NOMEM, "text to shards: out of memory");
  if (!slash) strcpy(dirname, ".");
  else if (dir_len == 0) strcpy(dirname, "/");
  else {
    memcpy(dirname, prefix, dir_len);
    dirname[dir_len] = '\0';
  }
  DIR *d = opendir(dirname);
  free(dirname);
  if (!d) return PX_OK;  // the shards were just written there; nothing to list is nothing stale
  px_status st = PX_OK;
  struct dirent *e;
  while (st == PX_OK && (e = readdir(d))) {
    const char *name = e->d_name;
    if (strncmp(name, base, base_len) != 0 || name[base_len] != '_') continue;
    const char *digits = name + base_len + 1, *p = digits;
    while (*p >= '0' && *p <= '9') p++;
    if (p - digits < 6 || p - digits > 18 || strcmp(p, ".bin") != 0) continue;
    if ((size_t)strtoull(digits, NULL, 10) < from) continue;
    size_t cap = (slash ? (size_t)(slash - prefix) + 1 : 0) + strlen(name) + 1;
    char *path = malloc(cap);
    if (!path) {
      st = px_error(PX_ERR_NOMEM, "text to shards: out of memory");
      break;
    }
    snprintf(path, cap, "%.*s%s", slash ? (int)(slash - prefix) + 1 : 0, prefix, name);
    if (unlink(path) != 0 && errno != ENOENT)
      st = px_error(PX_ERR_IO, "text to shards: cannot remove %s, a stale shard of an earlier conversion: %s", path,
                    strerror(errno));
    free(path);
  }
  closedir(d);
  return st;
}

px_status px_text_to_shards(const char *text_path, const char *out_prefix, px_tokenizer_kind kind,
                            const char *vocab_path, size_t shard_tokens) {
  if (!text_path || !*text_path || !out_prefix || !*out_prefix)
    return px_error(PX_ERR_INVALID, "text to shards: need a text file and an output prefix");
  if (kind != PX_TOKENIZER_WORD && kind != PX_TOKENIZER_BYTE)
    return px_error(PX_ERR_INVALID, "text to shards %s: unknown tokenizer kind %d", text_path, (int)kind);
  if (shard_tokens == 0) shard_tokens = DEFAULT_SHARD_TOKENS;
  if (shard_tokens > INT32_MAX)
    return px_error(PX_ERR_INVALID, "text to shards %s: shard_tokens %zu; a shard holds at most %d tokens", text_path,
                    shard_tokens, INT32_MAX);
  void *text = NULL;
  size_t n = 0;
  px_vocab *v = NULL;
  uint32_t *tokens = NULL;
  size_t count = 0;
  char *path = NULL;
  px_status st = px_data_read_file(text_path, "text", true, &text, &n);
  if (st == PX_OK && vocab_path) {
    st = px_vocab_load(&v, vocab_path);
    if (st == PX_OK && px_vocab_kind(v) != kind)
      st = px_error(PX_ERR_INVALID,
                    "text to shards %s: vocabulary %s is a %s vocabulary, but the %s tokenizer was asked for",
                    text_path, vocab_path, px_vocab_kind(v) == PX_TOKENIZER_WORD ? "word" : "byte",
                    kind == PX_TOKENIZER_WORD ? "word" : "byte");
  } else if (st == PX_OK) {
    st = kind == PX_TOKENIZER_WORD ? px_vocab_build_text(&v, text, n, text_path) : px_vocab_byte(&v);
  }
  if (st == PX_OK) st = px_vocab_encode(v, text, n, &tokens, &count);
  free(text);
  if (st == PX_OK && count == 0) st = px_error(PX_ERR_FORMAT, "text %s: empty; no tokens to write", text_path);
  if (st == PX_OK) {
    size_t cap = strlen(out_prefix) + 8;
    path = malloc(cap);
    if (!path) st = px_error(PX_ERR_NOMEM, "text to shards: out of memory");
    else snprintf(path, cap, "%s.vocab", out_prefix);
  }
  // The vocabulary first: a shard is never there without it.
  if (st == PX_OK) st = px_vocab_save(v, path);
  int token_bytes = v && px_vocab_size(v) <= 65536 ? 2 : 4;
  size_t shards = 0;
  for (size_t at = 0; st == PX_OK && at < count; at += shard_tokens, shards++) {
    free(path);
    path = shard_path(out_prefix, shards);
    if (!path) st = px_error(PX_ERR_NOMEM, "text to shards: out of memory");
    else st = px_shard_write(path, tokens + at, count - at < shard_tokens ? count - at : shard_tokens, token_bytes);
  }
  if (st == PX_OK) st = remove_stale_shards(out_prefix, shards);
  free(path);
  free(tokens);
  px_vocab_free(v);
  return st;
}

px_status px_text_dataset_open(px_dataset **out, const char *text_path, const px_vocab *v, int64_t T,
                               bool random_offset) {
  if (!out) return px_error(PX_ERR_INVALID, "text dataset: NULL output");
  *out = NULL;
  if (!v) return px_error(PX_ERR_INVALID, "text dataset %s: no vocabulary given", text_path ? text_path : "");
  uint32_t *tokens;
  size_t n;
  px_status st = px_vocab_encode_file(v, text_path, &tokens, &n);
  if (st != PX_OK) return st;
  return px_token_dataset_from_memory(out, text_path, tokens, n, T, random_offset, px_vocab_size(v));
}
