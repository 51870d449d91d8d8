/* The token dataset over tokens held in memory (internal): what
 * px_text_dataset_open builds after tokenizing a text file.  Samples are
 * the windows px_token_dataset_open makes of one shard (data.h). */
#ifndef PX_DATA_TOKENS_H
#define PX_DATA_TOKENS_H

#include "plexus/data.h"

/* Takes ownership of `tokens` (malloc'ed, n of them), also on error.
 * `name` (the text file) is used in messages. */
px_status px_token_dataset_from_memory(px_dataset **out, const char *name, uint32_t *tokens, size_t n, int64_t T,
                                       bool random_offset, size_t vocab_size);

#endif
