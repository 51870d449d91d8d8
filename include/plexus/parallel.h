/* plexus/parallel.h — parallel strategies over px_comm.  Now: DDP.
 *
 * DDP (distributed data parallel), as PyTorch's DistributedDataParallel:
 * every rank holds the whole model and a different slice of each batch; the
 * gradients are averaged so all ranks take the same optimizer step.
 *
 *   px_ddp_wrap     checks that every rank built the same model (names,
 *                   shapes), then broadcasts parameters and buffers from the
 *                   root (FluxMPI's synchronize!), groups the flat gradient
 *                   buffer into buckets and listens to the model's hooks.
 *   backward        when the last gradient of a bucket is in (grads_ready),
 *                   that bucket's asynchronous all-reduce starts, overlapping
 *                   the rest of backward.  Buckets are slices of the flat
 *                   gradient buffer in reverse layout order (the order
 *                   backward produces them), launched in that order on every
 *                   rank.
 *   px_ddp_sync     waits for every bucket and divides by the number of
 *                   contributing ranks: call it between backward and the
 *                   optimizer step.
 *
 * Gradient accumulation: px_ddp_set_sync(d, false) for the micro-steps (no
 * communication, gradients accumulate locally), true for the last one.
 * Uneven inputs: see px_ddp_join. */
#ifndef PLEXUS_PARALLEL_H
#define PLEXUS_PARALLEL_H

#include "plexus/comm.h"
#include "plexus/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct px_ddp_opts {
  size_t bucket_bytes;        /* bucket capacity (default 25 MiB) */
  size_t first_bucket_bytes;  /* the first bucket to fill, i.e. the model's
                                 last layers (default 1 MiB), so
                                 communication starts early */
  bool   find_unused_parameters; /* parameters whose module did not run
                                    forward count as ready with zero gradient */
  int    root;                /* rank whose parameters everyone starts from */
} px_ddp_opts;

#define PX_DDP_DEFAULTS \
  ((px_ddp_opts){ .bucket_bytes = 25u << 20, .first_bucket_bytes = 1u << 20, \
                  .find_unused_parameters = false, .root = 0 })

typedef struct px_ddp px_ddp;

/* Collective over comm.  On a layout mismatch every rank fails with a
 * message naming the first differing parameter and the ranks. */
px_status px_ddp_wrap(px_ddp **out, px_model *model, px_comm *comm, const px_ddp_opts *opts);
/* Detaches from the model (the hooks stay attached but inert). */
void px_ddp_free(px_ddp *d);

/* false: the next backward passes only accumulate locally (no_sync). */
void px_ddp_set_sync(px_ddp *d, bool sync);
/* Wait for every bucket's all-reduce and average.  With sync off, returns
 * at once.  Errors: a parameter that got no gradient (without
 * find_unused_parameters), or a communication failure. */
px_status px_ddp_sync(px_ddp *d);

/* ---- Uneven inputs (PyTorch's join) ---------------------------------------
 * Each step every rank calls px_ddp_join(d, have_batch, &active): a small
 * all-reduce that returns how many ranks still have data.  When active is 0
 * the epoch is over for everyone.  A rank with a batch then trains as usual;
 * a rank without calls px_ddp_shadow(d), which takes part in every bucket's
 * all-reduce with zero gradients so the others never wait.  Gradients are
 * averaged over the active ranks. */
px_status px_ddp_join(px_ddp *d, bool have_batch, int *active);
px_status px_ddp_shadow(px_ddp *d);

/* ---- Introspection (tests, logs) ------------------------------------------ */
int px_ddp_bucket_count(const px_ddp *d);
/* Bucket b covers grad_data[offset, offset + count). */
void px_ddp_bucket_range(const px_ddp *d, int b, size_t *offset, size_t *count);
/* Seconds (px_time_now) when bucket b's all-reduce last started; 0 if never. */
double px_ddp_bucket_start_time(const px_ddp *d, int b);

#ifdef __cplusplus
}
#endif
#endif
