/* Vocabulary internals shared by vocab.c and text.c (the words a text is
 * split into: words.h). */
#ifndef PX_DATA_VOCAB_H
#define PX_DATA_VOCAB_H

#include "plexus/data.h"

#define PX_VOCAB_EOS "<eos>"
#define PX_VOCAB_UNK "<unk>"

/* The id of "<eos>" (UINT32_MAX in a byte vocabulary), and a token's
 * length in bytes (0 for an id outside the vocabulary). */
uint32_t px_vocab_eos_id(const px_vocab *v);
size_t px_vocab_token_len(const px_vocab *v, uint32_t id);

/* A word vocabulary built from text in memory (`name` for messages). */
px_status px_vocab_build_text(px_vocab **out, const char *text, size_t n, const char *name);

#endif
