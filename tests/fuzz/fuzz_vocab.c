// libFuzzer target: the vocabulary file parser (src/data/vocab.c,
// px_vocab_parse).  Any input must give PX_OK or an error with a message;
// an accepted word vocabulary must be a bijection — every id's token looks
// up to that id — of non-empty tokens, with "<eos>" and "<unk>", and its
// size must be the count on the first line.
#include "plexus/data.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  px_vocab *v;
  px_clear_error();
  if (px_vocab_parse(&v, (const char *)data, size, "fuzz.vocab") != PX_OK) {
    if (!px_last_error()[0] || v) abort();
    return 0;
  }
  size_t n = px_vocab_size(v);
  // The count on the first line ("plexus-vocab 1 word N").
  char head[128] = {0};
  const char *nl = memchr(data, '\n', size);
  size_t hl = nl ? (size_t)(nl - (const char *)data) : size;
  memcpy(head, data, hl < sizeof head - 1 ? hl : sizeof head - 1);
  const char *sp = strrchr(head, ' ');
  if (!sp || strtoull(sp + 1, NULL, 10) != n) abort();
  if (px_vocab_kind(v) == PX_TOKENIZER_WORD) {
    if (px_vocab_id(v, "<eos>", 5) == px_vocab_id(v, "<unk>", 5)) abort();
    for (uint32_t id = 0; id < n; id++) {
      const char *t = px_vocab_token(v, id);
      if (!t || !t[0] || px_vocab_id(v, t, strlen(t)) != id) abort();
    }
  } else if (n != 256) {
    abort();
  }
  if (px_vocab_token(v, (uint32_t)n) != NULL) abort();
  px_vocab_free(v);
  return 0;
}
