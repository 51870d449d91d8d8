/* The word splitter shared by vocab.c and text.c (words.c).
 *
 * Words are what PyTorch's word_language_model example makes of a file it
 * opens with encoding="utf8" and reads line by line: lines end at "\n",
 * "\r\n" or "\r" (Python's universal newlines), every line is split with
 * str.split() — on runs of Unicode whitespace (ASCII \t \n \v \f \r, space,
 * the separators \x1c-\x1f, and U+0085, U+00A0, U+1680, U+2000-U+200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000 in UTF-8) — and "<eos>" follows
 * every line, a blank one too. */
#ifndef PX_DATA_WORDS_H
#define PX_DATA_WORDS_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes of the whitespace character at p (p < end), or 0 if none is there. */
size_t px_text_space_len(const char *p, const char *end);

typedef enum { PX_WORD_END = 0, PX_WORD, PX_WORD_EOL } px_word_kind;

/* Walks a text in memory: each call gives the next word, the end of a
 * line (PX_WORD_EOL: emit "<eos>"), or PX_WORD_END. */
typedef struct px_words {
  const char *p, *end;
  size_t line;       /* 1-based line of the last item */
  bool line_started; /* bytes of the current line seen */
} px_words;

void px_words_init(px_words *it, const char *text, size_t n);
px_word_kind px_words_next(px_words *it, const char **word, size_t *len);

#endif
