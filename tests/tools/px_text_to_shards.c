/* px_text_to_shards — px_text_to_shards from the command line, for
 * test_text_words_match_word_language_model.py:
 *
 *   px_text_to_shards word|byte TEXT PREFIX [VOCAB|-] [SHARD_TOKENS]
 *
 * writes PREFIX_000000.bin, ... and PREFIX.vocab; VOCAB is an existing
 * vocabulary to use ("-" or absent: build one from TEXT). */
#include "plexus/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc < 4 || argc > 6 || (strcmp(argv[1], "word") != 0 && strcmp(argv[1], "byte") != 0)) {
    fprintf(stderr, "usage: %s word|byte TEXT PREFIX [VOCAB|-] [SHARD_TOKENS]\n", argv[0]);
    return 2;
  }
  px_tokenizer_kind kind = strcmp(argv[1], "word") == 0 ? PX_TOKENIZER_WORD : PX_TOKENIZER_BYTE;
  const char *vocab = argc > 4 && strcmp(argv[4], "-") != 0 ? argv[4] : NULL;
  size_t shard_tokens = argc > 5 ? (size_t)strtoull(argv[5], NULL, 10) : 0;
  if (px_text_to_shards(argv[2], argv[3], kind, vocab, shard_tokens) != PX_OK) {
    fprintf(stderr, "px_text_to_shards: %s\n", px_last_error());
    return 1;
  }
  return 0;
}
