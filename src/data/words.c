// The word splitter (words.h): whitespace as Python's str.split() sees it,
// and lines as its universal newlines do.  Used by vocab.c (building a
// vocabulary) and text.c (encoding with one); in its own file so that
// neither of those two calls into the other for it.
#include "data/words.h"

size_t px_text_space_len(const char *p, const char *end) {
  const unsigned char *s = (const unsigned char *)p;
  unsigned char c = s[0];
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
  // Lead bytes of the multi-byte spaces; a continuation byte never matches,
  // so scanning byte by byte cannot match inside another character.
  size_t left = (size_t)(end - p);
  if (c == 0xC2) return left >= 2 && (s[1] == 0x85 || s[1] == 0xA0) ? 2 : 0;  // U+0085, U+00A0
  if (left < 3 || c < 0xE1 || c > 0xE3) return 0;
  unsigned char c1 = s[1], c2 = s[2];
  if (c == 0xE1) return c1 == 0x9A && c2 == 0x80 ? 3 : 0;  // U+1680
  if (c == 0xE3) return c1 == 0x80 && c2 == 0x80 ? 3 : 0;  // U+3000
  if (c1 == 0x80)                                          // U+2000..U+200A, U+2028, U+2029, U+202F
    return (c2 >= 0x80 && c2 <= 0x8A) || c2 == 0xA8 || c2 == 0xA9 || c2 == 0xAF ? 3 : 0;
  return c1 == 0x81 && c2 == 0x9F ? 3 : 0;  // U+205F
}

// Not whitespace for certain: printable ASCII, continuation and lead bytes
// below 0xC2.  (The fast path of the word loop.)
static inline bool surely_word_byte(unsigned char c) { return c > 0x20 && c < 0xC2; }

void px_words_init(px_words *it, const char *text, size_t n) {
  it->p = text;
  it->end = text + n;
  it->line_started = false;
}

px_word_kind px_words_next(px_words *it, const char **word, size_t *len) {
  for (;;) {
    if (it->p >= it->end) {
      // A last line without a newline still ends with "<eos>".
      if (!it->line_started) return PX_WORD_END;
      it->line_started = false;
      return PX_WORD_EOL;
    }
    char c = *it->p;
    if (c == '\n' || c == '\r') {  // "\n", "\r\n", "\r": Python's universal newlines
      it->p += (c == '\r' && it->p + 1 < it->end && it->p[1] == '\n') ? 2 : 1;
      it->line_started = false;
      return PX_WORD_EOL;
    }
    it->line_started = true;
    size_t sp = px_text_space_len(it->p, it->end);
    if (sp) {
      it->p += sp;
      continue;
    }
    const char *s = it->p++;
    while (it->p < it->end && (surely_word_byte((unsigned char)*it->p) || !px_text_space_len(it->p, it->end))) it->p++;
    *word = s;
    *len = (size_t)(it->p - s);
    return PX_WORD;
  }
}
