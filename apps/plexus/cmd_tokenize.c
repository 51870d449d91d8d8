// plexus tokenize: a text file into token shards (llm.c's format) and a
// vocabulary, for `plexus train --data tokens`.
//
//   plexus tokenize --input wiki.train.tokens --out data/wiki_train
//   plexus tokenize --input wiki.valid.tokens --out data/wiki_valid --vocab data/wiki_train.vocab
#include "app.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void tokenize_usage(FILE *f) {
  fprintf(f,
          "usage: plexus tokenize --input FILE --out PREFIX [--tokenizer word|byte] [--vocab FILE]\n"
          "                       [--shard-tokens N]\n"
          "\n"
          "Writes PREFIX_000000.bin, PREFIX_000001.bin, ... (llm.c's token shards: a 256 x int32 header,\n"
          "then uint16 tokens, or uint32 past 65,536 tokens) and PREFIX.vocab.\n"
          "\n"
          "  --input FILE        the text (WikiText-2's wiki.train.tokens, or any text file)\n"
          "  --out PREFIX        where the shards and the vocabulary go\n"
          "  --tokenizer WHICH   word: whitespace-separated words, an <eos> token per line, words outside the\n"
          "                      vocabulary as <unk> (WikiText-2's setup); byte: the 256 byte values\n"
          "                      (default word)\n"
          "  --vocab FILE        use this vocabulary (the training split's, when converting validation or\n"
          "                      test text) instead of building one from --input\n"
          "  --shard-tokens N    tokens per shard (default 100000000)\n");
}

int px_cmd_tokenize(int argc, char **argv) {
  const char *input = NULL, *out = NULL, *vocab = NULL, *tok = "word";
  long long shard_tokens = 100000000;
  for (int a = 1; a < argc; a++) {
    const char *arg = argv[a];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      tokenize_usage(stdout);
      return 0;
    }
    if (a + 1 >= argc) {
      fprintf(stderr, "plexus tokenize: %s needs a value\n", arg);
      return 2;
    }
    const char *v = argv[++a];
    if (strcmp(arg, "--input") == 0) input = v;
    else if (strcmp(arg, "--out") == 0) out = v;
    else if (strcmp(arg, "--vocab") == 0) vocab = v;
    else if (strcmp(arg, "--tokenizer") == 0) tok = v;
    else if (strcmp(arg, "--shard-tokens") == 0) {
      char *end;
      errno = 0;
      shard_tokens = strtoll(v, &end, 10);
      if (*end || errno || shard_tokens < 1) {
        fprintf(stderr, "plexus tokenize: --shard-tokens: expected a positive integer, got \"%s\"\n", v);
        return 2;
      }
    } else {
      fprintf(stderr, "plexus tokenize: unknown option %s (see --help)\n", arg);
      return 2;
    }
  }
  if (!input || !out) {
    fprintf(stderr, "plexus tokenize: --input and --out are required\n");
    tokenize_usage(stderr);
    return 2;
  }
  px_tokenizer_kind kind;
  if (strcmp(tok, "word") == 0) kind = PX_TOKENIZER_WORD;
  else if (strcmp(tok, "byte") == 0) kind = PX_TOKENIZER_BYTE;
  else {
    fprintf(stderr, "plexus tokenize: --tokenizer: \"%s\" is not word or byte\n", tok);
    return 2;
  }
  // The prefix's directory is made if missing (mkdir -p).
  char parent[1024];
  snprintf(parent, sizeof parent, "%s", out);
  char *slash = strrchr(parent, '/');
  if (slash && slash != parent) {
    *slash = '\0';
    if (px_mkdir_p(parent, "plexus tokenize", false) != PX_OK) {
      fprintf(stderr, "%s\n", px_last_error());
      return 1;
    }
  }
  if (px_text_to_shards(input, out, kind, vocab, (size_t)shard_tokens) != PX_OK) return px_app_fail("tokenize");
  printf("plexus tokenize: %s -> %s_*.bin and %s.vocab\n", input, out, out);
  return 0;
}
