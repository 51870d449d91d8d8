// Vocabularies (data.h): the table from tokens to ids and back, built from
// a training text, or read from and written to a versioned text file:
//
//   plexus-vocab 1 word 33278      kind "word": N tokens follow, one a line,
//   <eos>                          id = line number - 2
//   =
//   ...
//
//   plexus-vocab 1 byte 256        kind "byte": nothing follows
//
// A word vocabulary always holds "<eos>" (ends every line) and "<unk>"
// (stands for every word outside it).  Tokens are stored NUL-terminated in
// one growing block of characters and found through an open-addressing hash
// table of ids; lookups read only, so any number of threads may share a
// vocabulary.
#define _POSIX_C_SOURCE 200809L
#include "data/file.h"
#include "data/vocab.h"
#include "data/words.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB_MAGIC "plexus-vocab"
#define VOCAB_VERSION 1
// Ids become int32 tokens in a batch.
#define VOCAB_MAX ((size_t)INT32_MAX)

struct px_vocab {
  px_tokenizer_kind kind;
  size_t n;
  char *chars;  // every token, NUL-terminated, back to back
  size_t chars_len, chars_cap;
  size_t *offset;    // (n,) token id's start in chars
  size_t *len;       // (n,) its length in bytes
  size_t cap;        // rows allocated in offset and len
  uint32_t *table;   // (table_cap,) id + 1, 0 = empty slot
  size_t table_cap;  // a power of two, at least 2n
  uint32_t eos, unk;
};

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

static bool token_is(const px_vocab *v, uint32_t id, const char *w, size_t n) {
  return v->len[id] == n && memcmp(v->chars + v->offset[id], w, n) == 0;
}

// The slot holding w, or the empty slot where it would go.
static size_t find_slot(const px_vocab *v, const char *w, size_t n) {
  size_t mask = v->table_cap - 1, k = (size_t)hash_bytes(w, n) & mask;
  while (v->table[k] && !token_is(v, v->table[k] - 1, w, n)) k = (k + 1) & mask;
  return k;
}

static px_status grow_table(px_vocab *v) {
  size_t cap = v->table_cap ? v->table_cap * 2 : 1024;
  uint32_t *t = calloc(cap, sizeof *t);
  if (!t) return px_error(PX_ERR_NOMEM, "vocabulary: out of memory for %zu entries", cap);
  free(v->table);
  v->table = t;
  v->table_cap = cap;
  for (size_t id = 0; id < v->n; id++) v->table[find_slot(v, v->chars + v->offset[id], v->len[id])] = (uint32_t)id + 1;
  return PX_OK;
}

static px_vocab *vocab_new(px_tokenizer_kind kind) {
  px_vocab *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  v->kind = kind;
  v->eos = v->unk = UINT32_MAX;
  if (grow_table(v) != PX_OK) {
    free(v);
    return NULL;
  }
  return v;
}

// Append token w (absent) as the next id.
static px_status append(px_vocab *v, const char *w, size_t n) {
  if (v->n >= VOCAB_MAX) return px_error(PX_ERR_INVALID, "vocabulary: more than %zu tokens", VOCAB_MAX);
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 1024;
    size_t *o = realloc(v->offset, cap * sizeof *o);
    if (o) v->offset = o;
    size_t *l = o ? realloc(v->len, cap * sizeof *l) : NULL;
    if (!o || !l) return px_error(PX_ERR_NOMEM, "vocabulary: out of memory for %zu tokens", cap);
    v->len = l;
    v->cap = cap;
  }
  if (v->chars_cap - v->chars_len < n + 1) {
    size_t cap = v->chars_cap ? v->chars_cap : 1 << 16;
    while (cap - v->chars_len < n + 1) cap *= 2;
    char *c = realloc(v->chars, cap);
    if (!c) return px_error(PX_ERR_NOMEM, "vocabulary: out of memory for %zu bytes of tokens", cap);
    v->chars = c;
    v->chars_cap = cap;
  }
  memcpy(v->chars + v->chars_len, w, n);
  v->chars[v->chars_len + n] = '\0';
  v->offset[v->n] = v->chars_len;
  v->len[v->n] = n;
  v->chars_len += n + 1;
  v->n++;
  if (2 * v->n > v->table_cap) return grow_table(v);  // re-inserts every id
  v->table[find_slot(v, w, n)] = (uint32_t)v->n;
  return PX_OK;
}

// Id of w or UINT32_MAX.
static uint32_t lookup(const px_vocab *v, const char *w, size_t n) {
  uint32_t e = v->table[find_slot(v, w, n)];
  return e ? e - 1 : UINT32_MAX;
}

static void note_specials(px_vocab *v) {
  v->eos = lookup(v, PX_VOCAB_EOS, strlen(PX_VOCAB_EOS));
  v->unk = lookup(v, PX_VOCAB_UNK, strlen(PX_VOCAB_UNK));
}

void px_vocab_free(px_vocab *v) {
  if (!v) return;
  free(v->chars);
  free(v->offset);
  free(v->len);
  free(v->table);
  free(v);
}

px_status px_vocab_byte(px_vocab **out) {
  if (!out) return px_error(PX_ERR_INVALID, "vocabulary: NULL output");
  px_vocab *v = vocab_new(PX_TOKENIZER_BYTE);
  px_status st = v ? PX_OK : px_error(PX_ERR_NOMEM, "vocabulary: out of memory");
  for (int b = 0; b < 256 && st == PX_OK; b++) {
    char c = (char)b;
    st = append(v, &c, 1);
  }
  if (st != PX_OK) {
    px_vocab_free(v);
    *out = NULL;
    return st;
  }
  *out = v;
  return PX_OK;
}

px_status px_vocab_build_text(px_vocab **out, const char *text, size_t n, const char *name) {
  *out = NULL;
  if (!name) name = "(memory)";
  px_vocab *v = vocab_new(PX_TOKENIZER_WORD);
  if (!v) return px_error(PX_ERR_NOMEM, "text %s: out of memory for a vocabulary", name);
  if (memchr(text, '\0', n)) {
    const char *z = memchr(text, '\0', n);
    size_t line = 1;
    for (const char *p = text; p < z; p++) line += *p == '\n';
    px_vocab_free(v);
    return px_error(PX_ERR_FORMAT, "text %s line %zu: a NUL byte (byte %zu); is it a text file?", name, line,
                    (size_t)(z - text));
  }
  px_words it;
  px_words_init(&it, text, n);
  const char *w;
  size_t len;
  px_word_kind k;
  px_status st = PX_OK;
  // Ids in order of first appearance, "<eos>" included where a line first
  // ends: what word_language_model's Dictionary assigns.
  while (st == PX_OK && (k = px_words_next(&it, &w, &len)) != PX_WORD_END) {
    if (k == PX_WORD_EOL) {
      w = PX_VOCAB_EOS;
      len = strlen(w);
    }
    if (lookup(v, w, len) == UINT32_MAX) st = append(v, w, len);
  }
  if (st == PX_OK && v->n == 0)
    st = px_error(PX_ERR_FORMAT, "text %s: empty; no words to build a vocabulary from", name);
  // WikiText-2 holds "<unk>" itself; any other text gets it as the last id.
  if (st == PX_OK && lookup(v, PX_VOCAB_UNK, strlen(PX_VOCAB_UNK)) == UINT32_MAX)
    st = append(v, PX_VOCAB_UNK, strlen(PX_VOCAB_UNK));
  if (st != PX_OK) {
    px_vocab_free(v);
    return st;
  }
  note_specials(v);
  *out = v;
  return PX_OK;
}

px_status px_vocab_build(px_vocab **out, const char *text_path) {
  if (!out) return px_error(PX_ERR_INVALID, "vocabulary: NULL output");
  *out = NULL;
  if (!text_path || !*text_path) return px_error(PX_ERR_INVALID, "vocabulary: no text file given");
  void *text;
  size_t n;
  px_status st = px_data_read_file(text_path, "text", true, &text, &n);
  if (st != PX_OK) return st;
  st = px_vocab_build_text(out, text, n, text_path);
  free(text);
  return st;
}

// ---- The file ------------------------------------------------------------------

// Line [*pos, eol) of text; *pos moves past its "\n".  false at the end.
static bool next_line(const char *text, size_t n, size_t *pos, const char **line, size_t *len) {
  if (*pos >= n) return false;
  const char *s = text + *pos;
  const char *nl = memchr(s, '\n', n - *pos);
  *line = s;
  *len = nl ? (size_t)(nl - s) : n - *pos;
  *pos += *len + (nl ? 1 : 0);
  return true;
}

static px_status parse_header(const char *line, size_t len, const char *name, px_tokenizer_kind *kind, size_t *count) {
  char buf[96];
  size_t m = len < sizeof buf - 1 ? len : sizeof buf - 1;
  memcpy(buf, line, m);
  buf[m] = '\0';
  size_t magic_len = strlen(VOCAB_MAGIC);
  if (len < magic_len + 1 || memcmp(line, VOCAB_MAGIC " ", magic_len + 1) != 0)
    return px_error(PX_ERR_FORMAT,
                    "vocabulary %s line 1: not a plexus vocabulary: expected \"%s %d word N\" or \"%s %d byte 256\", "
                    "found \"%.60s\"",
                    name, VOCAB_MAGIC, VOCAB_VERSION, VOCAB_MAGIC, VOCAB_VERSION, buf);
  // "plexus-vocab <version> <kind> <N>", single spaces, decimal numbers.
  const char *p = buf + magic_len + 1;
  char *end;
  if (!(*p >= '0' && *p <= '9'))
    return px_error(PX_ERR_FORMAT, "vocabulary %s line 1: no version number in \"%s\"", name, buf);
  unsigned long version = strtoul(p, &end, 10);
  if (version != VOCAB_VERSION || *end != ' ')
    return px_error(PX_ERR_FORMAT, "vocabulary %s line 1: version %.*s; this plexus reads version %d (\"%s\")", name,
                    (int)(end - p), p, VOCAB_VERSION, buf);
  p = end + 1;
  if (strncmp(p, "word ", 5) == 0) *kind = PX_TOKENIZER_WORD;
  else if (strncmp(p, "byte ", 5) == 0) *kind = PX_TOKENIZER_BYTE;
  else return px_error(PX_ERR_FORMAT, "vocabulary %s line 1: kind must be \"word\" or \"byte\" (\"%s\")", name, buf);
  p += 5;
  if (!(*p >= '1' && *p <= '9') || strlen(p) > 10 || len >= sizeof buf - 1)
    return px_error(PX_ERR_FORMAT, "vocabulary %s line 1: bad token count in \"%s\"", name, buf);
  unsigned long long c = strtoull(p, &end, 10);
  if (*end != '\0' || c > VOCAB_MAX)
    return px_error(PX_ERR_FORMAT, "vocabulary %s line 1: bad token count in \"%s\" (at most %zu)", name, buf,
                    VOCAB_MAX);
  if (*kind == PX_TOKENIZER_BYTE && c != 256)
    return px_error(PX_ERR_FORMAT, "vocabulary %s line 1: a byte vocabulary has 256 tokens, not %llu", name, c);
  *count = (size_t)c;
  return PX_OK;
}

px_status px_vocab_parse(px_vocab **out, const char *text, size_t n, const char *name) {
  if (!out) return px_error(PX_ERR_INVALID, "vocabulary: NULL output");
  *out = NULL;
  if (!name) name = "(memory)";
  if (!text && n > 0) return px_error(PX_ERR_INVALID, "vocabulary %s: NULL text", name);
  size_t pos = 0, len;
  const char *line;
  if (!next_line(text, n, &pos, &line, &len)) return px_error(PX_ERR_FORMAT, "vocabulary %s: empty file", name);
  px_tokenizer_kind kind = PX_TOKENIZER_WORD;
  size_t count = 0;
  px_status st = parse_header(line, len, name, &kind, &count);
  if (st != PX_OK) return st;
  if (kind == PX_TOKENIZER_BYTE) {
    if (next_line(text, n, &pos, &line, &len))
      return px_error(PX_ERR_FORMAT, "vocabulary %s line 2: a byte vocabulary lists no tokens; found \"%.*s\"", name,
                      (int)(len < 40 ? len : 40), line);
    return px_vocab_byte(out);
  }
  px_vocab *v = vocab_new(PX_TOKENIZER_WORD);
  if (!v) return px_error(PX_ERR_NOMEM, "vocabulary %s: out of memory", name);
  size_t line_no = 1;
  while (st == PX_OK && next_line(text, n, &pos, &line, &len)) {
    line_no++;
    if (v->n == count) {
      st = px_error(PX_ERR_FORMAT, "vocabulary %s line %zu: more tokens than the %zu the header says", name, line_no,
                    count);
      break;
    }
    if (len == 0) {
      st = px_error(PX_ERR_FORMAT, "vocabulary %s line %zu: empty token", name, line_no);
      break;
    }
    // A token is one word of the splitter: no whitespace, no NUL.
    for (size_t k = 0; k < len && st == PX_OK; k++) {
      size_t sp = px_text_space_len(line + k, line + len);
      if (line[k] == '\0' || sp)
        st = px_error(PX_ERR_FORMAT,
                      "vocabulary %s line %zu: token \"%.*s\" holds %s at byte %zu; tokens are words, split on "
                      "whitespace%s",
                      name, line_no, (int)(len < 40 ? len : 40), line, line[k] == '\0' ? "a NUL" : "whitespace", k,
                      line[k] == '\r' ? " (CRLF line ends?)" : "");
    }
    if (st != PX_OK) break;
    uint32_t dup = lookup(v, line, len);
    if (dup != UINT32_MAX) {
      st = px_error(PX_ERR_FORMAT, "vocabulary %s line %zu: token \"%.*s\" repeats line %u", name, line_no,
                    (int)(len < 40 ? len : 40), line, dup + 2);
      break;
    }
    st = append(v, line, len);
  }
  if (st == PX_OK && v->n != count)
    st = px_error(PX_ERR_FORMAT, "vocabulary %s: the header says %zu tokens, the file lists %zu", name, count, v->n);
  if (st == PX_OK) {
    note_specials(v);
    if (v->eos == UINT32_MAX || v->unk == UINT32_MAX)
      st = px_error(PX_ERR_FORMAT,
                    "vocabulary %s: no \"%s\" token; a word vocabulary needs \"%s\" (end of line) and "
                    "\"%s\" (unknown word)",
                    name, v->eos == UINT32_MAX ? PX_VOCAB_EOS : PX_VOCAB_UNK, PX_VOCAB_EOS, PX_VOCAB_UNK);
  }
  if (st != PX_OK) {
    px_vocab_free(v);
    return st;
  }
  *out = v;
  return PX_OK;
}

px_status px_vocab_load(px_vocab **out, const char *path) {
  if (!out) return px_error(PX_ERR_INVALID, "vocabulary: NULL output");
  *out = NULL;
  if (!path || !*path) return px_error(PX_ERR_INVALID, "vocabulary: empty path");
  void *text;
  size_t n;
  px_status st = px_data_read_file(path, "vocabulary", false, &text, &n);
  if (st != PX_OK) return st;
  st = px_vocab_parse(out, text, n, path);
  free(text);
  return st;
}

px_status px_vocab_save(const px_vocab *v, const char *path) {
  if (!v || !path || !*path) return px_error(PX_ERR_INVALID, "vocabulary: NULL vocabulary or empty path");
  char head[96];
  int hn = snprintf(head, sizeof head, "%s %d %s %zu\n", VOCAB_MAGIC, VOCAB_VERSION,
                    v->kind == PX_TOKENIZER_BYTE ? "byte" : "word", v->n);
  size_t total = (size_t)hn + (v->kind == PX_TOKENIZER_WORD ? v->chars_len : 0);
  char *buf = malloc(total);
  if (!buf) return px_error(PX_ERR_NOMEM, "vocabulary %s: out of memory", path);
  memcpy(buf, head, (size_t)hn);
  if (v->kind == PX_TOKENIZER_WORD) {
    // The character block is the tokens in id order, each followed by a NUL:
    // with NULs as newlines it is the file's body.
    memcpy(buf + hn, v->chars, v->chars_len);
    for (size_t k = (size_t)hn; k < total; k++)
      if (buf[k] == '\0') buf[k] = '\n';
  }
  px_status st = px_write_file_atomic(path, buf, total);
  free(buf);
  return st;
}

px_tokenizer_kind px_vocab_kind(const px_vocab *v) { return v->kind; }

size_t px_vocab_size(const px_vocab *v) { return v->n; }

uint32_t px_vocab_id(const px_vocab *v, const char *word, size_t len) {
  if (v->kind == PX_TOKENIZER_BYTE) return len == 1 ? (unsigned char)word[0] : UINT32_MAX;
  uint32_t id = lookup(v, word, len);
  return id == UINT32_MAX ? v->unk : id;
}

const char *px_vocab_token(const px_vocab *v, uint32_t id) { return id < v->n ? v->chars + v->offset[id] : NULL; }

uint32_t px_vocab_eos_id(const px_vocab *v) { return v->eos; }

size_t px_vocab_token_len(const px_vocab *v, uint32_t id) { return id < v->n ? v->len[id] : 0; }
