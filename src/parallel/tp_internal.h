// Internal contracts of the tensor-parallel modules (src/parallel/tp_*.c).
#ifndef PX_TP_INTERNAL_H
#define PX_TP_INTERNAL_H

#include "plexus/tensor_parallel.h"

// Every tensor-parallel module with parameters starts with this, so the box
// of any of its parameters is found from the parameter alone.
typedef struct tp_module {
  px_module base;
  px_tp_group *g;                      /* not owned */
  px_tp_box box[PX_MODULE_MAX_PARAMS]; /* one per parameter */
} tp_module;

// True when m is a tensor-parallel module with boxes (a tp_module).
bool px_tp_is_module(const px_module *m);

// init op of every tp_module: draw each parameter's GLOBAL tensor from the
// stream the single-process layer at the same place draws from (the model's
// per-parameter stream (uid << 8) | k, as model.c's default init), then
// keep this rank's box.  So a tensor-parallel model starts as the boxes of
// the single-process model of the same seed.
void px_tp_init_boxes(px_module *m, px_rng *rng);

// The counted collectives of the layers; a group of one sends nothing.
px_status px_tp_allreduce(px_tp_group *g, float *buf, size_t n, px_reduce_op op, bool backward);
px_status px_tp_allgather(px_tp_group *g, const float *send, float *recv, size_t n, bool backward);

// Sequence parallelism's collectives on (N, T, C) tensors, T = P·Tl, rank r
// holding positions [r·Tl, (r+1)·Tl) (tp_sequence.c): all-gather
// (N, Tl, C) -> (N, T, C), and reduce-scatter of (N, T, C) partial sums ->
// (N, Tl, C).  Counted in g->counts; scratch from ctx's arena, released
// before they return (out must be allocated before the call).
px_status px_tp_seq_all_gather(px_tp_group *g, px_ctx *ctx, const float *in, float *out, int64_t N, int64_t T,
                               int64_t C, bool backward);
px_status px_tp_seq_reduce_scatter(px_tp_group *g, px_ctx *ctx, const float *in, float *out, int64_t N, int64_t T,
                                   int64_t C, bool backward);

// px_tp_set_sequence_split for the vocabulary-parallel embedding and tied
// head (tp_embedding.c); false when m is neither.
bool px_tp_vocab_set_sequence_split(px_module *m, bool on);

// Sequence parallelism's replicated modules (tp_sequence.c): m (a layer norm,
// the position embedding) runs on this rank's positions, so its parameters'
// gradients are partial sums; after m's own backward adds them, they are
// all-reduced over the tp group (one all-reduce of all of m's gradients,
// counted as backward) before the model's grads_ready hooks see m, so DDP
// and ZeRO find them complete as for any module.  Accumulation across
// micro-batches is kept: only this backward's contribution is summed.
// Returns m (NULL, with m freed, on failure).
px_module *px_tp_sequence_replicated(px_tp_group *g, px_module *m);

// Internal constructors of the ops tables (for px_tp_is_module).
extern const px_module_ops px_tp_column_ops, px_tp_row_ops, px_tp_vocab_embedding_ops;

#endif
