/* plexus/train.h — the training loop that ties the layers together:
 * epochs over a sharded dataset, DDP, the optimizer and its schedule,
 * gradient accumulation and clipping, evaluation on a held-out split,
 * checkpoints with bit-exact resume, and logging.
 *
 * One call trains:
 *
 *   px_train_opts o = PX_TRAIN_DEFAULTS;
 *   o.batch_size = 64; o.epochs = 5; o.optim = px_adam_defaults(1e-3f);
 *   o.ckpt_dir = "run/checkpoints";
 *   px_train(comm, model, train_set, test_set, &o, log, &result);
 *
 * on every rank of comm (collective).  The model's output is the logits and
 * the loss is cross-entropy against the batch's i32 targets: a classifier
 * gives (N, classes) logits for (N,) labels; a language model (N, T, vocab)
 * logits for (N, T) next tokens.  Every rank must build the same model from
 * the same seed; px_train wraps it in DDP (which checks that and broadcasts
 * rank 0's weights) when there is more than one rank.
 *
 * Steps.  A "step" is an optimizer step.  With accum_steps = k, a step takes
 * k micro-batches (gradients accumulated locally, all-reduced on the last);
 * an epoch ends with a step on whatever micro-batches are left.  The global
 * batch of a step is batch_size × world × k samples.
 *
 * Resume.  A checkpoint (io.h) holds model.safetensors (parameters and
 * buffers), optim.safetensors (the optimizer's state, one tensor per
 * parameter and slot: "exp_avg.conv1.weight"), and state.json (step, epoch,
 * the next batch, the dropout counter, the seed, world size and batch size,
 * the caller's config).  Batches are a function of (seed, epoch, position)
 * and dropout masks of (seed, forward count), so a run resumed from step k
 * on the same world size ends with the same bytes as one that never stopped.
 * Rank 0 reads the checkpoint and broadcasts it: other ranks need no access
 * to the files. */
#ifndef PLEXUS_TRAIN_H
#define PLEXUS_TRAIN_H

#include "plexus/data.h"
#include "plexus/io.h"
#include "plexus/log.h"
#include "plexus/optim.h"
#include "plexus/parallel.h"

#include <signal.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

typedef struct px_train_opts {
  /* Data */
  size_t batch_size; /* per rank, per micro-batch */
  int workers;       /* loader threads per rank (0: load on the training thread) */
  int prefetch;      /* batches decoded ahead (0: the loader's default) */
  bool skip_bad;     /* skip, count and report bad records instead of failing */
  /* Optimisation */
  px_optim_opts optim;
  px_lr_schedule schedule; /* the rate's shape over the steps; its base rate is optim.lr, the one
                                source (base_lr: leave 0, or equal to optim.lr; another value is
                                refused); total_steps 0: the run's steps (px_train_schedule) */
  float clip_grad_norm;    /* 0: no clipping */
  int accum_steps;         /* micro-batches per optimizer step (>= 1) */
  float label_smoothing;
  /* Length: max_steps optimizer steps, or else `epochs` epochs */
  int64_t epochs;
  int64_t max_steps;
  uint64_t seed; /* data order, random transforms and dropout */
  /* Ending early, to be resumed: the run's length and schedule stay those
   * above; this call ends with a checkpoint (when ckpt_dir is set). */
  int64_t stop_at_step;             /* end this call after this step (0: no) */
  volatile sig_atomic_t *stop_flag; /* non-zero (set by a signal handler, say) on any rank: end after the
                                current step; costs one tiny all-reduce per step (NULL: never) */
  /* Evaluation on the held-out split */
  int64_t eval_every;       /* steps; 0: at the end of every epoch */
  size_t eval_batch_size;   /* 0: batch_size */
  int64_t eval_max_batches; /* per rank; 0: the whole split */
  /* Data parallel: zero.stage 0 is DDP (the ddp options); 1, 2, 3 shard
   * the optimizer state, + the gradients, + the parameters over the ranks
   * (px_zero_wrap with these options; docs/PARALLEL.md).  Under ZeRO the
   * optimizer works on this rank's shard, clipping takes the global norm
   * (px_zero_clip_grad_norm), and each rank writes its own slice of the
   * checkpoint (docs/CHECKPOINTS.md). */
  px_ddp_opts ddp;
  px_zero_opts zero;
  /* Tensor parallel (tensor_parallel.h; NULL: data parallel over comm).  The
   * model is a px_tp_gpt over mesh->tp_group; the ranks of a tp group read
   * the same batches (the loader is sharded over mesh->dp ranks), DDP or
   * ZeRO 1-2 run over mesh->dp_comm, the loss is px_tp_cross_entropy over
   * tp_vocab columns, clipping px_tp_clip_grad_norm (or
   * px_tp_zero_clip_grad_norm), and checkpoints store each tp rank's boxes
   * (docs/PARALLEL.md). */
  struct px_mesh *mesh;
  int tp_vocab; /* with mesh: the global vocabulary */
  /* Checkpoints */
  const char *ckpt_dir;    /* NULL: no checkpoints */
  int64_t ckpt_every;      /* steps; 0: at the end of every epoch (and of the run) */
  int keep_last;           /* complete checkpoints kept in ckpt_dir (0: all) */
  const char *resume;      /* NULL: start fresh; "auto": the newest good checkpoint in
                                ckpt_dir, if any; else a checkpoint directory */
  const char *config_json; /* the caller's effective config, saved in state.json (or NULL) */
  /* Logging */
  int64_t log_every; /* steps between console/JSONL/TensorBoard lines */
  /* Numeric guards.  Every step the ranks agree on the step's loss (one
   * small all-reduce of its sum over the ranks' micro-batches): a loss that
   * is not finite on any rank, or a gradient norm that is not finite when
   * one is computed (clipping on, or a logging step), stops every rank at
   * the same step, before the optimizer updates, with an error naming the
   * step; always on.  The loss-spike guard, off by default, also stops the
   * run when the step's loss (the mean over the ranks) exceeds
   * loss_spike_factor times its running mean, from the call's second step
   * on: during the first loss_spike_warmup steps of this call the mean of
   * the steps before, then an exponential moving average (weight 0.1 for
   * the newest step) of the steps that passed. */
  double loss_spike_factor;  /* > 1 to watch; 0: off */
  int64_t loss_spike_warmup; /* steps of this call whose plain mean is the running mean (>= 1) */
  /* Where the run computes (docs/GPU.md).  PX_CUDA: one GPU per rank, the
   * GPU of local rank r being r % (GPUs of the node) (px_train_to_device);
   * the model, its gradients and the optimizer's state live there, each
   * micro-batch is copied there, DDP all-reduces over NCCL when there is
   * more than one rank (the small host figures, such as the step's loss
   * agreement, stay on comm), checkpoints are written from host copies
   * (the same files as a CPU run's).  ZeRO, tensor parallelism and
   * activation recomputation are CPU-only (PX_ERR_UNSUPPORTED).
   * precision: PX_F32, or PX_BF16 on PX_CUDA only (the GEMMs' operands in
   * bf16, f32 accumulation; weights, gradients and optimizer state f32). */
  px_device device;
  px_dtype precision;
} px_train_opts;

#define PX_TRAIN_DEFAULTS                                                                                       \
  ((px_train_opts){.batch_size = 64,                                                                            \
                   .workers = 1,                                                                                \
                   .prefetch = 0,                                                                               \
                   .skip_bad = false,                                                                           \
                   .optim = {.kind = PX_OPTIM_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f}, \
                   .schedule = {.kind = PX_LR_CONSTANT},                                                        \
                   .clip_grad_norm = 0.0f,                                                                      \
                   .accum_steps = 1,                                                                            \
                   .label_smoothing = 0.0f,                                                                     \
                   .epochs = 1,                                                                                 \
                   .max_steps = 0,                                                                              \
                   .seed = 0,                                                                                   \
                   .stop_at_step = 0,                                                                           \
                   .stop_flag = NULL,                                                                           \
                   .eval_every = 0,                                                                             \
                   .eval_batch_size = 0,                                                                        \
                   .eval_max_batches = 0,                                                                       \
                   .ddp = PX_DDP_DEFAULTS,                                                                      \
                   .zero = {.stage = 0,                                                                         \
                            .bucket_bytes = 0,                                                                  \
                            .first_bucket_bytes = 1u << 20,                                                     \
                            .reshard_after_forward = true,                                                      \
                            .prefetch = true},                                                                  \
                   .ckpt_dir = NULL,                                                                            \
                   .ckpt_every = 0,                                                                             \
                   .keep_last = 3,                                                                              \
                   .resume = NULL,                                                                              \
                   .config_json = NULL,                                                                         \
                   .log_every = 50,                                                                             \
                   .loss_spike_factor = 0.0,                                                                    \
                   .loss_spike_warmup = 10,                                                                     \
                   .device = PX_CPU,                                                                            \
                   .precision = PX_F32})

typedef struct px_train_result {
  int64_t steps;             /* optimizer steps taken in total (resumed ones included) */
  int64_t start_step;        /* where this run started (0, or the resumed step) */
  int64_t epochs;            /* epochs completed */
  bool stopped;              /* ended early (stop_at_step or stop_flag): resume to go on */
  double train_loss;         /* mean training loss over the last logging interval */
  px_eval_metrics eval;      /* the last evaluation (samples 0 if none ran) */
  double seconds;            /* wall time of this call */
  double samples_per_s;      /* global training throughput of this call */
  size_t skipped;            /* bad records skipped (skip_bad) */
  char last_checkpoint[512]; /* path of the last checkpoint written or resumed ("" if none) */
  /* Memory per rank after the first step of this call (bytes): this rank's,
   * and each figure's maximum over the ranks; optim_state is the
   * optimizer's, arena_peak the activation arena's high-water mark.
   * peak_rss: the largest VmHWM over the ranks' processes (under threads
   * the ranks share one process). */
  px_zero_memory memory, memory_max;
  size_t peak_rss;
} px_train_result;

/* The run's optimizer steps: max_steps, or else epochs × steps per epoch,
 * where an epoch of batches_per_epoch micro-batches takes
 * ceil(batches / accum_steps) steps (out: each may be NULL).  PX_ERR_INVALID,
 * naming the factors, when the product does not fit in int64_t (the run
 * would wrap to a negative or zero length). */
px_status px_train_total_steps(const px_train_opts *opts, size_t batches_per_epoch, int64_t *steps_per_epoch,
                               int64_t *total_steps);

/* The run's learning-rate schedule: opts->schedule with base_lr = optim.lr
 * (the one base rate) and, when 0, total_steps = the run's total_steps.
 * px_train and plexus train's pipeline loop use it; the rate of step s is
 * px_lr_at(out, s).  PX_ERR_INVALID when schedule.base_lr is set to another
 * rate than optim.lr (two base rates: say it once, in optim.lr). */
px_status px_train_schedule(const px_train_opts *opts, int64_t total_steps, px_lr_schedule *out);

/* Train on every rank of comm (collective).  val may be NULL (no
 * evaluation).  log may be NULL. */
px_status px_train(px_comm *comm, px_model *model, px_dataset *train, px_dataset *val, const px_train_opts *opts,
                   px_logger *log, px_train_result *out);

/* Evaluate model (in eval mode) on all of `data`, split over the ranks
 * without padding or repeats; loss (mean over samples, or over tokens for
 * a language model), accuracy (classifiers) or perplexity (language
 * models), all-reduced so every rank gets the same figures.  max_batches
 * (0: all) bounds the batches per rank.  Collective. */
px_status px_evaluate(px_comm *comm, px_model *model, px_dataset *data, size_t batch_size, int workers,
                      int64_t max_batches, px_eval_metrics *out);

/* CUDA devices this process can train on (device PX_CUDA): -1 when
 * libplexus was built without CUDA, 0 when there is no GPU or no driver. */
int px_train_cuda_devices(void);

/* Put `model` on `device` for training or evaluation by this rank of comm
 * (px_train does it itself).  PX_CUDA: the calling thread's GPU is local
 * rank % GPUs of the node (px_comm_local_rank), the model's buffers move
 * there (px_model_to_device) and its GEMMs compute in `precision` (PX_F32,
 * or PX_BF16: bf16 operands, f32 accumulation).  PX_CPU: nothing moves;
 * PX_F32 only.  PX_ERR_UNSUPPORTED, naming the option (--device,
 * --precision), in a build without CUDA, on a machine without a GPU, or
 * for bf16 on the CPU.  Collective over comm (every rank learns whether all
 * succeeded: none goes on alone). */
px_status px_train_to_device(px_comm *comm, px_model *model, px_device device, px_dtype precision);

/* Rows of logits (…, C) whose argmax is the target y[row] (px_evaluate's
 * accuracy count; the pipeline's evaluation counts on its last stage). */
int64_t px_count_correct(const px_tensor *logits, const int32_t *y);

/* This process's peak resident memory in bytes (VmHWM in
 * /proc/self/status; 0 where the system does not say). */
size_t px_train_peak_rss(void);

/* Load a checkpoint's weights (model.safetensors, checked against its
 * SHA-256) into model, for evaluation or generation.  path: a checkpoint
 * directory, or a directory of checkpoints (the newest good one is used);
 * resolved (may be NULL) receives the checkpoint's path.  A ZeRO stage-3
 * checkpoint has no model.safetensors: the model is assembled from the
 * ranks' model.rank*.safetensors pieces.  A model on a GPU is loaded into
 * its host mirrors, then pushed to the device. */
px_status px_train_load_weights(px_model *model, const char *path, char *resolved, size_t cap);

/* ---- Checkpoints of a pipeline-parallel run (src/train/state_pp.c) ----------
 * The format is every run's (docs/CHECKPOINTS.md, io.h version 2): each
 * rank writes its chunks' parameters (and buffers) into
 * model.rank<r>-of-<N>.safetensors and their optimizer slots
 * ("exp_avg.h.0.ln_1.weight") into optim.rank<r>-of-<N>.safetensors, as
 * pieces (whole tensors, or the boxes px_tp_param_box gives), r and N the
 * rank in and size of comm; the tied head's copy of the embedding weight
 * (px_pp_plan.tied_param) is not written, the embedding's stage writes it.
 *
 * Save: collective over comm (every rank of the job; px_checkpoint_write_all
 * with its all-or-nothing agreement).  writes: this rank's pipeline passes
 * its files (under data parallel, dp rank 0's only: the replicas are
 * equal); replicated: it also writes the parameters (and buffers) that
 * px_tp_param_box does not split (true without tensor parallelism; under
 * it, tp rank 0 only: one copy); state_json: written by comm's rank 0
 * (NULL elsewhere).  Under ZeRO over dp (px_pp_opts.zero_stage 1-2) every
 * rank writes its dp slice of each chunk's optimizer slots as flat ranges
 * of the boxes (replicated governs the unsplit parameters' ranges, as
 * above), whatever `writes` says: nothing is gathered.  The
 * checkpoint is dir/step_<step>; path_out (cap bytes) receives its path.
 *
 * Load: collective over comm.  Every rank fills its chunks' parameters,
 * buffers and optimizer slots from whatever layout wrote path (DDP or one
 * process, ZeRO, tensor parallel, a pipeline of any P and split: loads
 * intersect boxes; under ZeRO over dp each rank its slice's ranges of the
 * optimizer slots), the tied copy from the embedding's pieces, and sets
 * each chunk optimizer's step count to optimizer_step (< 0: the parameters
 * and buffers only, the optimizers untouched: --init).  A rank that fails
 * makes every rank fail (its message names the rank and stage). */
struct px_pp;
px_status px_pp_checkpoint_save(px_comm *comm, struct px_pp *pp, bool writes, bool replicated, const char *dir,
                                int64_t step, int keep_last, const char *state_json, char *path_out, size_t cap);
px_status px_pp_checkpoint_load(px_comm *comm, struct px_pp *pp, const char *path, int64_t optimizer_step);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
