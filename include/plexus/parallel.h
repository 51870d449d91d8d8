/* plexus/parallel.h — parallel strategies over px_comm: DDP and ZeRO (sharded data parallel).
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
#include "plexus/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

typedef struct px_ddp_opts {
  size_t bucket_bytes;         /* bucket capacity (default 4 MiB: docs/PARALLEL.md, "Buckets") */
  size_t first_bucket_bytes;   /* the first bucket to fill, i.e. the model's
                                 last layers (default 1 MiB), so
                                 communication starts early; never more
                                 than bucket_bytes (px_ddp_wrap clamps it) */
  bool find_unused_parameters; /* parameters whose module did not run
                                    forward count as ready with zero gradient */
  int root;                    /* rank whose parameters everyone starts from */
  px_dtype reduce_dtype;       /* PX_F32 (default): gradients are summed in f32;
                                  PX_BF16: each bucket is cast to bf16, summed
                                  in bf16 over NCCL and cast back (half the
                                  bytes on the wire; a device model only) */
} px_ddp_opts;

#define PX_DDP_DEFAULTS                           \
  ((px_ddp_opts){.bucket_bytes = 4u << 20,        \
                 .first_bucket_bytes = 1u << 20,  \
                 .find_unused_parameters = false, \
                 .root = 0,                       \
                 .reduce_dtype = PX_F32})

typedef struct px_ddp px_ddp;

/* Collective over comm.  On a layout mismatch every rank fails with a
 * message naming the first differing parameter and the ranks. */
px_status px_ddp_wrap(px_ddp **out, px_model *model, px_comm *comm, const px_ddp_opts *opts);
/* Removes its listener from the model (the slot is reused). */
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
/* Seconds (px_time_now) when bucket b's all-reduce was last seen complete:
 * by a test during backward, or else by px_ddp_sync's wait; 0 if never.
 * Before the end of backward means its communication was hidden. */
double px_ddp_bucket_done_time(const px_ddp *d, int b);

/* ---- Buffers and synchronized batch norm ------------------------------------
 * DDP and ZeRO keep the model's buffers (batch norm's running statistics)
 * one copy, as PyTorch's DDP does by default (broadcast_buffers): before a
 * forward, when a training forward has run since the last time, the root's
 * buffers are broadcast to every rank.  A training forward therefore starts
 * from the root's statistics, and an evaluation (or a checkpoint after it)
 * sees the root's on every rank: the logged evaluation is `plexus eval` on
 * the saved weights.
 *
 * px_sync_batchnorm_convert (torch.nn.SyncBatchNorm.convert_sync_batchnorm)
 * turns every px_batchnorm under root into a synchronized one over comm
 * (NULL turns them back): in training its batch statistics, and their
 * gradients, are those of all ranks' batches together (src/nn/batchnorm.c).
 * comm must outlive the modules; every rank of comm converts the same model
 * and runs the same training forwards and backwards.  *converted (may be
 * NULL) receives how many modules were converted. */
px_status px_sync_batchnorm_convert(px_module *root, px_comm *comm, int *converted);

/* ---- Sharded data parallel: ZeRO stages 1, 2, 3 (FSDP) --------------------
 * Every rank holds 1/N of the optimizer state (stage 1), of the gradients
 * too (stage 2), and of the parameters too (stage 3).  A shard is made of
 * slices of the flat buffers (DESIGN decision 1): the flat layout is cut
 * into groups (stages 1-2: buckets in backward order, as DDP's; stage 3:
 * units), each group is padded to a multiple of N and split into N equal
 * pieces, and rank r owns piece r of every group; its shard is those
 * pieces one after the other (the optimizer state's index space).  Stages
 * 1-2 keep them in place in model->param_data (stage 1 in grad_data too),
 * stage 2's gradients and stage 3 in shard buffers.  A group smaller than
 * N gives some ranks empty pieces.  px_zero_segments says which flat elements each part of
 * the shard holds (what a checkpoint records as boxes).
 *
 *   px_zero_wrap       checks the layout as DDP does, broadcasts the root's
 *                      parameters and buffers, keeps this rank's shard and
 *                      listens to the model's hooks (px_model_attach_hooks).
 *   px_zero_zero_grad  zero the shard (and stage 1's full gradients)
 *   backward           stage 1/2: buckets of gradients are reduce-scattered
 *                      as backward fills them (overlapped, like DDP);
 *                      stage 3: each unit all-gathers its parameters in
 *                      pre_forward and pre_backward (the next unit's gather
 *                      prefetched asynchronously) and reduce-scatters its
 *                      gradients in grads_ready.
 *   px_zero_sync       waits for every reduce-scatter and averages: the
 *                      shard's gradients are ready (call after backward).
 *   optimizer          px_zero_optim_create (this rank's pieces: in place
 *                      in param_data in stages 1-2, the shard in stage 3);
 *                      clip with px_zero_clip_grad_norm; px_optim_step.
 *   px_zero_after_step stage 1/2: all-gathers the updated parameters so
 *                      every rank holds the whole model again; stage 3: no
 *                      communication (parameters stay sharded).
 *
 * Gradient accumulation: px_zero_set_sync(z, false) for the micro-steps.
 * Stage 1 accumulates full local gradients and reduce-scatters on the last
 * micro-step; stages 2 and 3 reduce-scatter every micro-step and accumulate
 * into their own slice. */
typedef struct px_zero_opts {
  int stage;                 /* 1, 2 or 3 */
  size_t bucket_bytes;       /* stages 1-2: reduce-scatter bucket capacity; 0 (the default): the
                                 stage's, PX_ZERO1_BUCKET_BYTES or PX_ZERO2_BUCKET_BYTES */
  size_t first_bucket_bytes; /* the first bucket to fill (default 1 MiB) */
  bool find_unused_parameters;
  int root; /* rank whose parameters everyone starts from */
  /* Stage 3: the units that gather together, by module name ("h.0",
   * "transformer.h.3"); NULL: each child of the root module is a unit.
   * Parameters outside every named unit belong to the root unit, gathered
   * for the whole step. */
  const char *const *units;
  int n_units;                /* A unit read by a module outside it (the embedding a tied head
                                 reads: px_module.foreign) stays gathered from its forward to
                                 its backward. */
  bool reshard_after_forward; /* stage 3: free a unit's gathered parameters after its forward
                                   (true, ZeRO-3) or keep them until its backward (FSDP's false) */
  bool prefetch;              /* stage 3: start the next unit's all-gather while this one computes
                                 (in the order the first training step ran them, forward and
                                 backward, as FSDP records it) */
  double test_delay_s;        /* tests only: sleep this long before every all-gather and
                                 reduce-scatter, so a missing wait shows */
} px_zero_opts;

/* Stage 1 holds the whole gradient anyway: 25 MiB buckets (DDP's until it
 * moved to 4 MiB; stage 1 has not been measured on the rig).  Stage 2
 * holds only the buckets being written or reduce-scattered (up to two,
 * plus a tied embedding's from the head's backward to its own), so its
 * buckets are smaller (DeepSpeed sizes reduce_bucket_size per stage too):
 * on the 63 M-parameter GPT of docs/PERFORMANCE.md, 8 MiB holds the
 * gradient storage to the embedding's 24 MiB + two 9 MiB MLP weights. */
#define PX_ZERO1_BUCKET_BYTES ((size_t)25 << 20)
#define PX_ZERO2_BUCKET_BYTES ((size_t)8 << 20)

#define PX_ZERO_DEFAULTS                           \
  ((px_zero_opts){.stage = 1,                      \
                  .bucket_bytes = 0,               \
                  .first_bucket_bytes = 1u << 20,  \
                  .find_unused_parameters = false, \
                  .root = 0,                       \
                  .units = NULL,                   \
                  .n_units = 0,                    \
                  .reshard_after_forward = true,   \
                  .prefetch = true,                \
                  .test_delay_s = 0})

typedef struct px_zero px_zero;

/* Collective over comm.  Errors (PX_ERR_INVALID on every rank, the model
 * left as it was): a stage outside 1..3; a unit name that names no module
 * (the message lists the model's top-level modules); units that nest,
 * repeat, hold no parameters or are empty ("": the root is the root unit
 * already); a layout that differs between ranks (the first differing
 * parameter named, as DDP does); options that differ between ranks;
 * test_delay_s outside [0, 10].  opts.units is ignored in stages 1-2.
 * While wrapped, stages 2-3 free model->grad_data (NULL; each p->grad
 * points into a gradient bucket or unit during backward, NULL otherwise)
 * and stage 3 frees model->param_data (NULL; each p->data points into its
 * gathered unit while gathered, NULL otherwise). */
px_status px_zero_wrap(px_zero **out, px_model *model, px_comm *comm, const px_zero_opts *opts);
/* Removes the listener (the slot is reused) and gives the model back whole:
 * stage 3 gathers every unit into a newly allocated model->param_data
 * (collective); stages 2-3 allocate a zeroed model->grad_data; every view
 * points into them again.  Frees z even when that fails (the status says
 * why). */
px_status px_zero_free(px_zero *z);

/* This rank's shard as contiguous buffers where the stage keeps one, and
 * its length n (padding included: the optimizer state's index space).
 * params: stage 3's shard; NULL in stages 1-2, whose pieces lie in place
 * in model->param_data.  grads: stages 2-3's shard; NULL in stage 1, whose
 * pieces lie in place in model->grad_data.  px_zero_segments says where. */
void px_zero_shard(const px_zero *z, float **params, float **grads, size_t *n);
/* The optimizer over this rank's pieces wherever the stage keeps them
 * (px_optim_create_segments over px_zero_segments; stage 3: the contiguous
 * shard); its state is (n_state, shard n), shard-indexed (padding zero). */
px_status px_zero_optim_create(px_zero *z, px_optim **out, const px_optim_opts *opts);
/* The shard as segments: segment k is shard[shard_off[k], +count[k]) =
 * flat[flat_off[k], +count[k]) (padding excluded).  Returns the number of
 * segments; fills at most max of them (call with max 0 to count). */
int px_zero_segments(const px_zero *z, size_t *flat_off, size_t *shard_off, size_t *count, int max);

/* sync false: backward accumulates gradients locally (no reduce-scatter), as DDP's no_sync. */
void px_zero_set_sync(px_zero *z, bool sync);
/* Waits for every reduce-scatter and multiplies the shard by 1/N.  With sync
 * off, returns at once (stages 2-3 have already added the micro-step into
 * the shard at the end of its backward).  Errors: a parameter that got no
 * gradient (without find_unused_parameters), or a failure inside a hook
 * (a collective that failed); either ends the job (px_comm_abort) so no
 * peer waits forever. */
px_status px_zero_sync(px_zero *z);
/* Global L2 norm of the gradient over all shards (sum of squares of each
 * shard, all-reduced once; padding is zero), then clip the shard as
 * torch.nn.utils.clip_grad_norm_ would the whole.  max_norm <= 0: only the
 * norm.  Collective. */
px_status px_zero_clip_grad_norm(px_zero *z, float max_norm, double *norm);
px_status px_zero_after_step(px_zero *z);
/* Zero this rank's gradient storage (the shard, and any full buffer).  Call
 * it, not px_model_zero_grad, before each step: in stages 2-3 the shard is
 * where gradients accumulate and px_model_zero_grad does not reach it. */
void px_zero_zero_grad(px_zero *z);
/* Replace the parameters with flat (n_param_elems floats, the same on every
 * rank, e.g. a checkpoint read after wrap): each rank keeps its pieces, and
 * stages 1-2 also copy flat into model->param_data.  No communication. */
px_status px_zero_set_params(px_zero *z, const float *flat);

/* Gather the whole flat parameter buffer (n_param_elems floats) onto every
 * rank into `out`.  Stage 3: one all-gather per unit (collective); stages
 * 1-2: a copy of model->param_data (no communication; call it on every rank
 * all the same). */
px_status px_zero_gather_params(px_zero *z, float *out);

/* Memory this rank holds, in bytes, exactly (the library's own accounting;
 * temporary buffers are pooled and reused, so theirs are high-water marks).
 * Shard = the padded pieces (px_zero_shard's n).  At most 2 reduce-scatters
 * (or padded all-gathers) hold a temporary buffer at once. */
typedef struct px_zero_memory {
  size_t params;      /* full parameters (stages 1-2: the pieces are in place); the shard (stage 3) */
  size_t grads;       /* stage 1: full gradients (pieces in place) + padded copies in flight;
                             stages 2-3: the shard + gradient buckets / units in flight */
  size_t optim_state; /* 0 here: the caller fills in its optimizer's n_state × shard × 4 */
  size_t gathered;    /* stage 3: gathered units (the one computing, the one prefetched,
                             a tied embedding's, the root unit); stages 1-2: padded buffers of
                             the after-step all-gathers */
  size_t arena_peak;  /* the activation arena's high-water mark (px_arena_high_water) */
} px_zero_memory;
/* This rank's memory by kind (the struct above). */
void px_zero_memory_of(const px_zero *z, px_zero_memory *m);

/* ---- Introspection (tests, logs) ------------------------------------------ */
int px_zero_stage(const px_zero *z);
/* Stage 3: units holding parameters, the root unit included when it holds
 * any; 0 in stages 1-2. */
int px_zero_unit_count(const px_zero *z);
/* Collectives started since wrap (tests assert per-step counts): every
 * all-gather (stage 3 units, after-step buckets, px_zero_gather_params) and
 * every reduce-scatter. */
void px_zero_counts(const px_zero *z, int64_t *allgathers, int64_t *reduce_scatters);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
