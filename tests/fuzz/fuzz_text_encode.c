// libFuzzer target: the text tokenizers (src/data/text.c, src/data/vocab.c).
// Any text must build a word vocabulary or fail with a message; with it:
//   - every id is inside the vocabulary, and "<unk>" appears only where the
//     text itself says "<unk>" (every other word is in the vocabulary);
//   - decoding and encoding again gives the same ids (words hold no
//     whitespace, so joining them with spaces and newlines loses nothing);
//   - the vocabulary written in the file format ("plexus-vocab 1 word N" and
//     one token a line) parses back to the same ids.
// With the byte tokenizer, decoding gives back the text exactly.
//
// The first byte picks the tokenizer: odd for bytes, even for words.
#define _GNU_SOURCE  // memmem
#include "data/vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *decode_all(const px_vocab *v, const uint32_t *ids, size_t n, size_t *len) {
  *len = px_vocab_decode(v, ids, n, NULL, 0);
  char *buf = malloc(*len + 1);
  if (!buf || px_vocab_decode(v, ids, n, buf, *len + 1) != *len || buf[*len] != '\0') abort();
  return buf;
}

static void words(const char *text, size_t n) {
  px_vocab *v;
  px_clear_error();
  if (px_vocab_build_text(&v, text, n, "fuzz.txt") != PX_OK) {
    if (!px_last_error()[0] || v) abort();
    return;
  }
  uint32_t *ids, *again;
  size_t count, count2, len;
  if (px_vocab_encode(v, text, n, &ids, &count) != PX_OK) abort();
  uint32_t unk = px_vocab_id(v, "<unk>", 5);
  bool text_has_unk = memmem(text, n, "<unk>", 5) != NULL;
  for (size_t k = 0; k < count; k++)
    if (ids[k] >= px_vocab_size(v) || (ids[k] == unk && !text_has_unk)) abort();
  char *dec = decode_all(v, ids, count, &len);
  if (px_vocab_encode(v, dec, len, &again, &count2) != PX_OK) abort();
  if (count2 != count || memcmp(ids, again, count * sizeof *ids) != 0) abort();
  free(again);
  free(dec);

  // The vocabulary through its file format.
  size_t cap = 64;
  for (uint32_t id = 0; id < px_vocab_size(v); id++) cap += strlen(px_vocab_token(v, id)) + 1;
  char *file = malloc(cap);
  size_t at = (size_t)snprintf(file, cap, "plexus-vocab 1 word %zu\n", px_vocab_size(v));
  for (uint32_t id = 0; id < px_vocab_size(v); id++) {
    size_t l = strlen(px_vocab_token(v, id));
    memcpy(file + at, px_vocab_token(v, id), l);
    file[at + l] = '\n';
    at += l + 1;
  }
  px_vocab *w;
  if (px_vocab_parse(&w, file, at, "fuzz.vocab") != PX_OK) abort();
  if (px_vocab_encode(w, text, n, &again, &count2) != PX_OK) abort();
  if (count2 != count || memcmp(ids, again, count * sizeof *ids) != 0) abort();
  free(again);
  px_vocab_free(w);
  free(file);
  free(ids);
  px_vocab_free(v);
}

static void bytes(const char *text, size_t n) {
  px_vocab *v;
  if (px_vocab_byte(&v) != PX_OK) abort();
  uint32_t *ids;
  size_t count, len;
  if (px_vocab_encode(v, text, n, &ids, &count) != PX_OK || count != n) abort();
  char *dec = decode_all(v, ids, count, &len);
  if (len != n || memcmp(dec, text, n) != 0) abort();
  free(dec);
  free(ids);
  px_vocab_free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (data[0] & 1) bytes((const char *)data + 1, size - 1);
  else words((const char *)data + 1, size - 1);
  return 0;
}
