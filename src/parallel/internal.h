// Internal contracts shared by the parallel strategies (not public API).
#ifndef PX_PARALLEL_INTERNAL_H
#define PX_PARALLEL_INTERNAL_H

#include "plexus/parallel.h"

// Collective over c: every rank must hold the same parameters and buffers
// (names, shapes, order).  On a mismatch every rank returns PX_ERR_INVALID
// with a message, prefixed by `who` ("DDP", "ZeRO"), naming the first
// differing parameter and the ranks that differ.
px_status px_parallel_check_layout(px_model *md, px_comm *c, const char *who);

// Index of p in md->params (layout order), or -1 if p is not a trainable
// parameter of md.
int px_parallel_param_index(const px_model *md, const px_param *p);

// DDP's broadcast_buffers (buffer_sync.c), called before the root
// module's forward (training: this forward is a training one) and by a
// rank that takes part in a step without a forward (training = true): when
// a training forward ran since the last call (*dirty), the root's buffers
// are broadcast (collective over comm; every rank's calls must match).
// Nothing to do for a model without buffers.
px_status px_parallel_sync_buffers(px_model *md, px_comm *comm, int root, bool *dirty, bool training);

#endif
