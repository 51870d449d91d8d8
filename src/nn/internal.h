// Internal contracts between nn/ layers (not part of the public API).
#ifndef PX_NN_INTERNAL_H
#define PX_NN_INTERNAL_H

#include "plexus/nn.h"

// True when m is a px_embedding.
bool px_is_embedding(const px_module *m);
// True when the embedding m has run forward and its backward has not run
// since: its grads_ready (which DDP takes as "wte.weight is complete") is
// still to come.  The tied head relies on this (tied_head.c).
bool px_embedding_pending(const px_module *m);

#endif
