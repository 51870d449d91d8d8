/* plexus/nn.h — the module protocol, containers, layers and losses.
 *
 * A module is a small table of functions (px_module_ops) plus its
 * parameters.  forward(x) -> y allocates y from the step arena and keeps
 * what backward needs; backward(dy) -> dx returns the input gradient and
 * ADDS the parameter gradients into the model's flat gradient buffer
 * (Torch7's updateGradInput and accGradParameters, in one call, in that
 * order).  A NULL dx asks the module to skip the input gradient.
 *
 * Parameters of the whole model live in ONE flat buffer, gradients in a
 * second with the same layout (DESIGN decision 1).  Modules only declare
 * their parameters (name, shape, initialiser); px_model_create names them
 * state_dict-style ("0.weight", "3.running_mean"), lays them out in
 * registration order, points every module at its slices and initialises
 * them from the seed.
 *
 * Containers call the model's hooks around every child (DESIGN decision 2):
 * pre_forward, post_forward, pre_backward, grads_ready.  grads_ready(m)
 * means: every gradient of m's parameters (and its children's) has been
 * accumulated for this backward pass. */
#ifndef PLEXUS_NN_H
#define PLEXUS_NN_H

#include "plexus/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

typedef struct px_module px_module;
typedef struct px_ctx px_ctx;

/* ---- Parameters --------------------------------------------------------- */
typedef enum px_init_kind {
  PX_INIT_ZEROS = 0,
  PX_INIT_ONES,
  PX_INIT_UNIFORM, /* U(-a, a) */
  PX_INIT_NORMAL   /* N(0, a²) */
} px_init_kind;

typedef struct px_param {
  /* Local name ("weight") until px_model_create, then the full dotted name. */
  char name[PX_NAME_MAX];
  int ndim;
  int64_t shape[PX_MAX_DIMS];
  size_t numel;
  size_t offset;  /* elements from the start of the flat buffer */
  float *data;    /* view into model->param_data (or buffer_data) */
  float *grad;    /* view into model->grad_data; NULL for buffers */
  bool is_buffer; /* running statistics: saved, broadcast, not trained */
  px_init_kind init;
  float init_a;
  px_module *owner;
} px_param;

#define PX_MODULE_MAX_PARAMS 4
/* Parameters of other modules one module may use (px_module_add_foreign_param). */
#define PX_MODULE_MAX_FOREIGN 2

/* ---- Hooks -------------------------------------------------------------- */
typedef struct px_hooks {
  void *user;
  void (*pre_forward)(void *user, px_module *m);
  void (*post_forward)(void *user, px_module *m);
  void (*pre_backward)(void *user, px_module *m);
  void (*grads_ready)(void *user, px_module *m);
} px_hooks;

/* Listeners attached at once (slots are reused after px_model_remove_hooks). */
#define PX_MAX_HOOKS 8

typedef enum px_hook_point {
  PX_HOOK_PRE_FORWARD,
  PX_HOOK_POST_FORWARD,
  PX_HOOK_PRE_BACKWARD,
  PX_HOOK_GRADS_READY
} px_hook_point;

/* ---- Step context: what every forward/backward call can see ------------- */
struct px_ctx {
  px_arena *arena; /* activations; reset by px_model_forward */
  bool training;
  uint64_t seed;         /* the model's seed (dropout masks) */
  uint64_t step;         /* training-mode forward passes so far */
  const px_hooks *hooks; /* slots [0, n_hooks); a free slot is all NULL */
  int n_hooks;
  /* > 0 while a checkpointed unit (px_checkpoint) re-runs its forward inside
   * its backward.  Hooks fire then too, with this set: a listener that frees
   * parameters after forward or prefetches in forward order (ZeRO-3) keeps
   * them for the backward that follows instead.  A module whose forward
   * changes state besides what it saves for backward (batch norm's running
   * statistics) must not change it again while this is set. */
  int recomputing;
  /* Where the step runs (the model's device): px_ctx_tensor's tensors and
   * the arena are there.  compute_dtype PX_F32, or PX_BF16 on PX_CUDA: the
   * GEMMs (Linear, Conv1D, the tied head, convolutions) cast their operands
   * to bf16 and accumulate in f32; activations, parameters, gradients and
   * optimizer state stay f32 (docs/GPU.md). */
  px_device device;
  px_dtype compute_dtype;
};

/* Allocate an output tensor from the arena. */
px_status px_ctx_tensor(px_ctx *ctx, px_tensor *out, int ndim, const int64_t *shape);
/* Same shape as `like`. */
px_status px_ctx_tensor_like(px_ctx *ctx, px_tensor *out, const px_tensor *like);
void px_ctx_call_hooks(px_ctx *ctx, px_hook_point point, px_module *m);

/* ---- The module protocol ------------------------------------------------ */
typedef struct px_module_ops {
  const char *type; /* "Linear", "Conv2d", ... */
  /* y = f(x).  Allocate y from ctx (or make it a view of x); keep pointers
   * to whatever backward needs (they stay valid until the next step). */
  px_status (*forward)(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y);
  /* dx = ∂L/∂x from dy (skip when dx == NULL); grads += ∂L/∂θ. */
  px_status (*backward)(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx);
  /* Optional: initialise parameters (default: each param's init spec). */
  void (*init)(px_module *m, px_rng *rng);
  /* Optional: free what the module allocated itself (not the struct). */
  void (*destroy)(px_module *m);
  /* Optional: the input forward saw is now at x (same shape, same values,
   * recomputed elsewhere in the arena); point what backward reads there
   * instead of recomputing the output.  What px_checkpoint_pair needs of
   * its second module (Conv1D and Linear have it). */
  void (*rebind)(px_module *m, const px_tensor *x);
} px_module_ops;

struct px_module {
  const px_module_ops *ops;
  char name[64]; /* name in the parent: "0", "ln_1"; "" = transparent */
  px_module *parent;
  px_module **children;
  int n_children;
  int cap_children;
  px_param params[PX_MODULE_MAX_PARAMS];
  int n_params;
  bool training;
  uint32_t uid; /* pre-order index in the model */
  /* Random stream of the module: its initial weights and dropout masks are
   * drawn from (seed, stream).  The pre-order index among the modules that
   * are not `rng_transparent`; a recompute wrapper (px_checkpoint, a pair,
   * a chain made only to group modules for one) is, so wrapping blocks
   * leaves every weight and mask as it was. */
  uint32_t stream;
  bool rng_transparent;
  void *user; /* free for a parallel strategy or the caller */
  /* Parameters OWNED BY OTHER MODULES that this module's forward reads and
   * whose gradients its backward adds to (a tied head: the embedding's
   * weight).  A strategy that materialises gradients or gathers parameters
   * per module (ZeRO 2-3) does so for these too, around this module.  The
   * owner's backward must run after this module's, so that the owner's
   * grads_ready still means "complete". */
  px_param *foreign[PX_MODULE_MAX_FOREIGN];
  int n_foreign;
};

/* For layer authors: allocate a module of `size` bytes (a struct that
 * starts with px_module) and declare parameters on it. */
px_module *px_module_alloc(size_t size, const px_module_ops *ops);
px_param *px_module_add_param(px_module *m, const char *name, int ndim, const int64_t *shape, px_init_kind init,
                              float init_a, bool is_buffer);
px_status px_module_add_child(px_module *m, const char *name, px_module *child);
/* Declare that m reads p (a parameter of another module) in forward and
 * adds into p's gradient in backward.  PX_ERR_INVALID past
 * PX_MODULE_MAX_FOREIGN or for a buffer. */
px_status px_module_add_foreign_param(px_module *m, px_param *p);
/* Free a module that was never given to a model (or whose model is freed). */
void px_module_free(px_module *m);
/* Run one child with hooks around it (what containers do). */
px_status px_module_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y);
px_status px_module_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx);

/* ---- Containers --------------------------------------------------------- */
/* Sequential: children named "0", "1", ... unless added with a name. */
px_module *px_chain(void);
px_status px_chain_add(px_module *chain, px_module *child);
px_status px_chain_add_named(px_module *chain, const char *name, px_module *child);
/* px_chain_of(3, a, b, c).  If any child is NULL (its constructor failed),
 * frees the others and returns NULL with that child's error kept. */
px_module *px_chain_of(int n, ...);
/* y = x + inner(x); the inner module's parameters keep their own names
 * (the residual is transparent in names). */
px_module *px_residual(px_module *inner);
/* y = inner(x) + shortcut(x): a residual whose skip path is a module too
 * (ResNet's projection shortcut: 1×1 conv of stride s, batchnorm).  The
 * inner branch is transparent in names; the shortcut's parameters are named
 * under `shortcut_name` (NULL or "": transparent too), so torchvision's
 * BasicBlock reads "conv1.weight", ..., "downsample.0.weight".  shortcut
 * NULL with no name is the identity (as px_residual); NULL with a name is a
 * shortcut whose constructor failed: NULL is returned, its message kept. */
px_module *px_residual_shortcut(px_module *inner, px_module *shortcut, const char *shortcut_name);

/* ---- Activation checkpointing: recompute instead of store ------------------
 * A checkpointed unit keeps only its input and its output.  Its forward
 * runs the inner module, then rewinds the step arena to where it started
 * (px_arena_rewind_keep), moving the output down: the inner activations'
 * bytes are reused by what comes next.  Its backward marks the arena, runs
 * the inner forward again from the saved input (ctx->recomputing > 0, the
 * same ctx->step and seed: dropout masks are the same bits), runs the inner
 * backward, and rewinds again keeping only the input gradient.  So the
 * activations held at the peak are one unit's internals plus every unit's
 * input and output.  The inner module is transparent in names: "h.0" wrapped
 * keeps "h.0.ln_1.weight".  Docs: docs/RECOMPUTE.md. */
px_module *px_checkpoint(px_module *inner);
/* Selective recomputation of one cheap module followed by one that can
 * rebind its input (px_module_ops.rebind: Conv1D, Linear):
 *   forward   t = cheap(x), y = consumer(t); t and cheap's internals are released
 *   backward  t = cheap(x) again, consumer rebinds to it (its GEMM is not
 *             redone), then consumer's and cheap's backward
 * The GPT's MLP uses it for GELU -> c_proj: the (N, T, 4C) GELU output is
 * not stored, the c_fc GEMM output it is computed from is.  The children
 * are named as given ("act", "c_proj"); add the pair with the name "" so
 * it is transparent.  NULL (both freed) if either is NULL or the consumer
 * has no rebind. */
px_module *px_checkpoint_pair(const char *cheap_name, px_module *cheap, const char *consumer_name, px_module *consumer);

/* Which units of a model recompute (the zoo and `plexus train --recompute`). */
typedef enum px_recompute_kind {
  PX_RECOMPUTE_NONE = 0,
  PX_RECOMPUTE_FULL,     /* every block is a checkpointed unit */
  PX_RECOMPUTE_EVERY,    /* blocks 0, k, 2k, ... are */
  PX_RECOMPUTE_SELECTIVE /* cheap activations only (the GPT: GELU; attention's
                              probabilities are never stored anyway) */
} px_recompute_kind;

typedef struct px_recompute {
  px_recompute_kind kind;
  int every; /* k for PX_RECOMPUTE_EVERY (>= 1) */
} px_recompute;

/* "none", "full", "selective", "every:K" (K >= 1).  PX_ERR_INVALID with a
 * message naming the text and the accepted forms otherwise. */
px_status px_recompute_parse(const char *text, px_recompute *out);
/* "none", "full", "selective", "every:3" into buf. */
const char *px_recompute_name(px_recompute r, char *buf, size_t cap);
/* Wrap the children of `blocks` (a chain of blocks: the GPT's "h", a ResNet
 * stage) in px_checkpoint as r says, keeping their names; `first` is the
 * index of blocks->children[0] among all the model's blocks (every:K counts
 * across stages).  Before px_model_create.  PX_RECOMPUTE_SELECTIVE is the
 * model's business (the zoo builds it): PX_ERR_INVALID here. */
px_status px_checkpoint_blocks(px_module *blocks, px_recompute r, int first);

/* ---- Layers -------------------------------------------------------------
 * Shapes: linear (..., in) -> (..., out); conv/pool/batchnorm2d (N,C,H,W);
 * batchnorm also (N,C); layernorm and softmax over the last dimension. */
px_module *px_linear(int in_features, int out_features, bool bias);
px_module *px_relu(void);
px_module *px_gelu(bool tanh_approx);
px_module *px_tanh(void);
px_module *px_sigmoid(void);
px_module *px_softmax(void);
/* Dropout: in training y = x ⊙ mask / (1 - p), mask_i = [u_i >= p] with u_i
 * from Philox(seed, (stream << 40) ^ step, i / 4); in eval (or p = 0) a
 * view of x.  Softmax and Dropout run on the GPU when their input is a
 * CUDA tensor (the step context on the device too); the GPU's dropout mask
 * is the CPU's bit for bit. */
px_module *px_dropout(float p);
/* Dropout on part `part` of `parts` equal pieces of axis 1 (sequence
 * parallelism): the input (N, T, …) is positions [part·T, (part+1)·T) of
 * (N, parts·T, …), and each element keeps or drops as the same element of
 * the whole does under px_dropout (same module stream, seed and step).
 * part = 0, parts = 1 is px_dropout. */
px_module *px_dropout_part(float p, int part, int parts);
px_module *px_flatten(void); /* (N, ...) -> (N, prod(...)), a view */
px_module *px_conv2d(int in_channels, int out_channels, int kernel_size, int stride, int padding, bool bias);
px_module *px_maxpool2d(int kernel_size, int stride);
px_module *px_avgpool2d(int kernel_size, int stride);
/* nn.MaxPool2d(k, stride, padding): windows reach `padding` (<= k/2) pixels
 * past each edge; padding never wins (ResNet's stem: 3, 2, 1). */
px_module *px_maxpool2d_padded(int kernel_size, int stride, int padding);
/* (N, C, H, W) -> (N, C), the mean of each plane: torchvision's
 * AdaptiveAvgPool2d(1) followed by flatten. */
px_module *px_global_avgpool2d(void);
px_module *px_batchnorm(int channels, float eps, float momentum);
px_module *px_layernorm(int dim, float eps);

/* ---- Transformer layers (GPT-2) -------------------------------------------
 * Token ids are int32.  Shapes: embedding ids (...) -> (..., dim);
 * pos_embedding, attention (N, T, C) -> (N, T, C); conv1d (..., in) ->
 * (..., out); tied head (..., C) -> (..., V).  docs/LAYERS.md has the math. */
/* nn.Embedding: weight (V, dim), N(0, 1).  Ids outside [0, V) are an error
 * naming the id and its position.  Backward scatter-adds into the weight's
 * gradient in position order, the same bits for any thread count; the ids
 * get no gradient (call backward with dx = NULL). */
px_module *px_embedding(int num_embeddings, int dim);
/* Learned positions, added to the input: y[n, t] = x[n, t] + weight[t],
 * weight (context, dim), N(0, 0.02); T <= context. */
px_module *px_pos_embedding(int context, int dim);
/* The same for one of `parts` equal pieces of each sequence (sequence
 * parallelism): the input (N, T, dim) holds positions [part·T, (part+1)·T)
 * of a sequence of parts·T <= context, so y[n, t] = x[n, t] +
 * weight[part·T + t] and backward adds only to those rows of the gradient.
 * part = 0, parts = 1 is px_pos_embedding. */
px_module *px_pos_embedding_part(int context, int dim, int part, int parts);
/* GPT-2's Conv1D: y = x · W + b with weight stored (in, out) as Hugging
 * Face's GPT-2 stores it; weight N(0, 0.02), bias 0. */
px_module *px_conv1d(int in_features, int out_features, bool bias);
/* Causal multi-head self-attention with children c_attn (Conv1D dim -> 3·dim,
 * fused q, k, v), c_proj (Conv1D dim -> dim) and resid_dropout; dropout
 * attn_dropout on the attention probabilities.  Keeps q, k, v and one
 * log-sum-exp per row, never the (N, heads, T, T) scores.  With the input
 * on a CUDA device (and the step context there) it runs fused CUDA kernels
 * that keep the same (q, k, v and the log-sum-exp; the attention-dropout
 * mask is the CPU's); head width dim / n_head at most 128 there. */
px_module *px_causal_self_attention(int dim, int n_head, float attn_dropout, float resid_dropout);
/* Output projection tied to `embedding` (a px_embedding in the same model):
 * logits = x · weightᵀ, its gradient added into the embedding's.  The
 * embedding must run forward before the head (so its backward, which tells
 * DDP the weight's gradient is complete, comes after the head's); forward
 * and backward fail with an error otherwise. */
px_module *px_tied_head(px_module *embedding);

/* ---- The model: a module tree plus flat buffers ------------------------- */
typedef struct px_model {
  px_module *root;
  px_module **modules; /* all modules, pre-order (uid = index) */
  int n_modules;
  px_param **params; /* trainable, in layout order */
  int n_params;
  px_param **buffers; /* running statistics, in layout order */
  int n_buffers;
  /* The flat buffers.  While a sharding strategy holds the model they may
   * be NULL: ZeRO stage 3 frees param_data (each parameter's data points
   * into a gathered unit during its forward/backward, NULL otherwise);
   * stages 2 and 3 free grad_data (each grad points into a gradient bucket
   * or unit during backward, NULL otherwise).  px_zero_free restores both. */
  float *param_data; /* (n_param_elems,)  one allocation */
  float *grad_data;  /* (n_param_elems,)  same layout */
  size_t n_param_elems;
  float *buffer_data; /* (n_buffer_elems,) */
  size_t n_buffer_elems;
  uint64_t seed;
  px_arena *arena;
  px_ctx ctx;
  /* PX_CPU, or PX_CUDA after px_model_to_device: then param_data,
   * grad_data and buffer_data are device memory, and host_param_data /
   * host_buffer_data mirror them on the host (px_model_pull, px_model_push)
   * for what reads or writes parameters as bytes: checkpoints, state dicts. */
  px_device device;
  float *host_param_data;
  float *host_buffer_data;
  px_hooks hooks[PX_MAX_HOOKS];
  int hook_handle[PX_MAX_HOOKS]; /* > 0: the handle of the listener in that slot; 0: free */
  int next_hook_handle;
} px_model;

/* Takes ownership of `root` (freed with the model, also on failure). */
px_status px_model_create(px_model **out, px_module *root, uint64_t seed);
void px_model_free(px_model *m);
/* Begins a step: resets the arena, then y = root(x).  y lives in the arena
 * until the next forward; x must stay valid until backward. */
px_status px_model_forward(px_model *m, const px_tensor *x, px_tensor *y);
/* grads += ∂L/∂θ for the last forward; dx may be NULL. */
px_status px_model_backward(px_model *m, const px_tensor *dy, px_tensor *dx);
/* Zero grad_data (nothing when a strategy has freed it: use its zero_grad).
 * On a CUDA model, on the device (queued on the compute stream). */
void px_model_zero_grad(px_model *m);
void px_model_train(px_model *m, bool training);
/* n floats from the step arena (e.g. the loss gradient), NULL if no memory. */
float *px_model_scratch(px_model *m, size_t n);
/* Listen to every module's forward/backward (DESIGN decision 7).  *handle
 * names the listener for px_model_remove_hooks; a removed listener's slot is
 * reused, so strategies can be wrapped and freed any number of times.
 * Listeners are called in the order of their slots.  PX_ERR_INVALID when
 * PX_MAX_HOOKS listeners are attached at once. */
px_status px_model_attach_hooks(px_model *m, const px_hooks *hooks, int *handle);
/* Stop calling that listener; an unknown or already removed handle (or 0)
 * is ignored. */
void px_model_remove_hooks(px_model *m, int handle);
/* Re-initialise all parameters and buffers from `seed` (on a CUDA model: the
 * host mirrors, then pushed to the device; the same values as on the CPU). */
void px_model_init(px_model *m, uint64_t seed);
px_param *px_model_find(const px_model *m, const char *name);
/* Parameters then buffers, each a view into the flat buffers, named as in
 * PyTorch's state_dict.  Free with px_state_dict_free.  On a CUDA model the
 * views are of the host mirrors: call px_model_pull first to read current
 * values, px_model_push after writing them. */
px_status px_model_state_dict(const px_model *m, px_state_dict *sd);
/* One line per parameter: name, shape, offset. */
void px_model_print(const px_model *m, void *file /* FILE* */);

/* ---- Devices (docs/GPU.md) -------------------------------------------------
 * px_model_to_device(m, PX_CUDA, gpu) makes `gpu` the calling thread's
 * device (px_cuda_init), copies param_data, grad_data and buffer_data to it
 * and points every parameter's data and grad there; the host parameter and
 * buffer arrays stay as host_param_data / host_buffer_data, and the step
 * arena becomes a device arena.  Call it right after px_model_create (or
 * after loading a checkpoint), before any strategy (DDP, ZeRO, an
 * optimizer) takes the model's pointers.  PX_CPU brings a CUDA model back
 * (its current values) and is a no-op on a CPU model.  PX_ERR_UNSUPPORTED
 * when plexus was built without CUDA or no GPU is found; PX_ERR_INVALID
 * while a sharding strategy has freed the flat buffers. */
px_status px_model_to_device(px_model *m, px_device device, int gpu);
/* CUDA model: copy parameters and buffers device -> host mirrors (before
 * px_model_state_dict, a checkpoint, or reading p->data as host memory
 * through the mirrors).  A CPU model: nothing to do. */
px_status px_model_pull(px_model *m);
/* CUDA model: copy the host mirrors -> device (after writing them, e.g.
 * loading a state dict into px_model_state_dict's views).  CPU: nothing. */
px_status px_model_push(px_model *m);
/* The GEMMs' operand dtype (px_ctx.compute_dtype): PX_F32 always; PX_BF16
 * only on a CUDA model (PX_ERR_UNSUPPORTED otherwise: the CPU path computes
 * in f32). */
px_status px_model_set_compute_dtype(px_model *m, px_dtype dt);

/* ---- Losses --------------------------------------------------------------
 * Each returns the mean loss and, if the gradient pointer is not NULL,
 * writes ∂loss/∂input (same shape as the input) there. */
/* MSE runs on the CPU only: device tensors are PX_ERR_UNSUPPORTED. */
px_status px_mse_loss(const px_tensor *pred, const px_tensor *target, float *loss, float *dpred);

typedef struct px_ce_opts {
  int ignore_index;      /* targets equal to this are skipped (-100) */
  float label_smoothing; /* 0 = none */
} px_ce_opts;
#define PX_CE_DEFAULTS ((px_ce_opts){.ignore_index = -100, .label_smoothing = 0.0f})

/* logits (N, C) (or (..., C), flattened to rows), targets (N,) class ids.
 * Mean over the non-ignored rows; 0 if every row is ignored.
 * On the GPU (logits->device == PX_CUDA): targets and dlogits are DEVICE
 * memory (dlogits may be the logits' own), *loss a host float; the call
 * waits for the compute stream once to return the mean.  A target outside
 * [0, C) that is not ignore_index is PX_ERR_INVALID as on the CPU (found on
 * the device; dlogits is then unspecified). */
px_status px_cross_entropy_loss(const px_tensor *logits, const int32_t *targets, const px_ce_opts *opts, float *loss,
                                float *dlogits);

/* Which kernels px_conv2d's 3x3 stride-1 layers of up to 64 channels run:
 * the direct 3x3 kernels' AVX2+FMA copy (picked from cpuid in a portable
 * x86-64 build), their native build, or im2col + GEMM (a CPU without AVX2,
 * where the baseline copy is slower).  PX_CONV_DIRECT=0/1 overrides. */
const char *px_conv_kernel_info(void);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
