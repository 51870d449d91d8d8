/* plexus/optim.h — optimizers, learning-rate schedules, gradient clipping.
 *
 * Every optimizer works over flat buffers (DESIGN decision 1): a params
 * array, a grads array of the same length, and its own state arrays of the
 * same length again (SGD: momentum; Adam/AdamW: exp_avg, exp_avg_sq) in one
 * allocation.  A ZeRO shard is just a smaller (params, grads, n), or a
 * list of segments (px_optim_create_segments) when its pieces lie in place
 * inside the whole buffers.  The update rules are PyTorch's (torch.optim,
 * single parameter group).
 *
 * On the GPU (plexus built with CUDA): create the optimizer over DEVICE
 * params/grads pointers (the model's flat buffers after px_model_to_device,
 * or segments of them), then px_optim_to_device moves its state to the
 * device; px_optim_step then runs CUDA kernels on the calling thread's
 * compute stream, with the CPU's formulas and order of operations (every
 * element gets the CPU's bits).  The host `state` stays as a mirror for
 * checkpoints: px_optim_pull copies the device state into it,
 * px_optim_push copies it back (after loading a checkpoint into the
 * slots). */
#ifndef PLEXUS_OPTIM_H
#define PLEXUS_OPTIM_H

#include "plexus/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

typedef enum px_optim_kind { PX_OPTIM_SGD = 0, PX_OPTIM_ADAM, PX_OPTIM_ADAMW } px_optim_kind;

typedef struct px_optim_opts {
  px_optim_kind kind;
  float lr;
  /* SGD */
  float momentum; /* 0 = plain SGD */
  float dampening;
  bool nesterov;
  /* Adam, AdamW */
  float beta1, beta2, eps;
  /* SGD and Adam: L2 term added to the gradient; AdamW: decoupled decay. */
  float weight_decay;
} px_optim_opts;

/* PyTorch's defaults for each optimizer at a given learning rate. */
px_optim_opts px_sgd_defaults(float lr);
px_optim_opts px_adam_defaults(float lr);
px_optim_opts px_adamw_defaults(float lr); /* weight_decay 0.01 as in PyTorch */

/* A segment: params[0..count) and grads[0..count), not owned, whose state
 * is state index [offset, offset + count) of every slot. */
typedef struct px_optim_segment {
  float *params;
  float *grads;
  size_t count;
  size_t offset;
} px_optim_segment;

typedef struct px_optim {
  px_optim_opts opts;
  float *params; /* (n,) not owned; NULL when made of several segments */
  float *grads;  /* (n,) not owned; NULL when made of several segments */
  size_t n;      /* the state index space: each slot is (n,) */
  float *state;  /* (n_state, n) owned: one allocation */
  int n_state;
  int64_t step;          /* updates taken so far */
  px_optim_segment *seg; /* (n_seg,) owned: what px_optim_step updates */
  int n_seg;
  /* PX_CPU, or PX_CUDA after px_optim_to_device: params/grads (and the
   * segments') are device pointers, dev_state the (n_state, n) state on the
   * device, and `state` its host mirror (px_optim_pull, px_optim_push). */
  px_device device;
  float *dev_state;
} px_optim;

/* An optimizer updating the n floats at params from the n at grads with opts's rule (state
 * allocated here); PX_ERR_INVALID naming a bad option. */
px_status px_optim_create(px_optim **out, float *params, float *grads, size_t n, const px_optim_opts *opts);
/* The same optimizer over n_seg segments of separate buffers (a ZeRO
 * shard in place inside the model's flat buffers), with its state ONE
 * allocation (n_state, n) indexed as the segments' offsets say.  Segments
 * come in increasing offset order, do not overlap, and end within n; state
 * elements no segment covers (a shard's padding) stay zero.  A step gives
 * every element exactly the bits the contiguous optimizer would. */
px_status px_optim_create_segments(px_optim **out, const px_optim_segment *segs, int n_seg, size_t n,
                                   const px_optim_opts *opts);
void px_optim_free(px_optim *o);
/* One update of params from grads with the current lr. */
px_status px_optim_step(px_optim *o);
/* px_optim_step, and every segment's gradients left zero: the update's
 * pass stores 0 over each gradient once it has read it, so a caller that
 * would zero them before the next backward (zero_grad) can skip that pass
 * when the segments cover all of them (px_model_zero_grad's buffer: an
 * optimizer from px_optim_create over the model's whole gradient buffer).
 * The parameters and state get the bits px_optim_step gives. */
px_status px_optim_step_zero_grads(px_optim *o);
void px_optim_set_lr(px_optim *o, float lr);
/* State slot k as a flat (n,) array, and its PyTorch name
 * ("momentum_buffer", "exp_avg", "exp_avg_sq"); NULL if k is out of range.
 * On a device optimizer this is the HOST mirror: px_optim_pull first to
 * read the current state, px_optim_push after writing it. */
float *px_optim_state_slot(px_optim *o, int k, const char **name);

/* ---- The optimizer on the GPU ---------------------------------------------
 * px_optim_to_device: after px_optim_create(_segments) over device pointers
 * (every params/grads must be device memory of the calling thread's device,
 * px_cuda_init done): allocates the state on the device, copies the host
 * state there (zeros, or what was loaded into the slots) and sets
 * device = PX_CUDA.  Calling it on a device optimizer is a no-op.
 * PX_ERR_UNSUPPORTED in a build without CUDA; PX_ERR_INVALID when a buffer
 * is host memory.
 * px_optim_pull: device state -> host mirror (waits).  px_optim_push: host
 * mirror -> device state.  Both are no-ops (PX_OK) on a CPU optimizer. */
px_status px_optim_to_device(px_optim *o);
px_status px_optim_pull(px_optim *o);
px_status px_optim_push(px_optim *o);

/* ---- Schedules: lr as a function of the optimizer step ------------------ */
typedef enum px_lr_kind { PX_LR_CONSTANT = 0, PX_LR_STEP, PX_LR_COSINE } px_lr_kind;

typedef struct px_lr_schedule {
  px_lr_kind kind;
  float base_lr;
  int64_t warmup_steps; /* linear from base_lr/warmup to base_lr (all kinds) */
  /* STEP: lr = base_lr · gamma^(floor(step / step_size)) */
  int64_t step_size;
  float gamma;
  /* COSINE: from base_lr down to min_lr at total_steps, then min_lr */
  int64_t total_steps;
  float min_lr;
} px_lr_schedule;

/* The learning rate for optimizer step `step` (0-based). */
float px_lr_at(const px_lr_schedule *s, int64_t step);

/* ---- Gradient clipping ----------------------------------------------------
 * Global L2 norm as torch.nn.utils.clip_grad_norm_ (1.13): scale by
 * min(1, max_norm / (norm + 1e-6)); gradients under the limit are left
 * untouched.  Returns the norm before clipping.
 * Sharded callers compute px_sumsq per shard, all-reduce it, and call
 * px_clip_grad_scale with the global norm. */
float px_clip_grad_norm(float *grads, size_t n, float max_norm);
void px_clip_grad_scale(float *grads, size_t n, float norm, float max_norm);
/* The same on either device: grads is host memory (PX_CPU) or device memory
 * (PX_CUDA: Σ g² through px_cuda_sumsq in double, the scale on the compute
 * stream; the norm comes back to the host, so px_clip_grad_norm_on waits
 * for the stream).  *norm (may be NULL) receives the norm before clipping.
 * PX_ERR_UNSUPPORTED for PX_CUDA in a build without CUDA. */
px_status px_clip_grad_norm_on(px_device dev, float *grads, size_t n, float max_norm, float *norm);
px_status px_clip_grad_scale_on(px_device dev, float *grads, size_t n, float norm, float max_norm);
/* Σ g² in double on either device (sharded callers all-reduce it). */
px_status px_sumsq_on(px_device dev, const float *grads, size_t n, double *out);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
