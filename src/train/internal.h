/* The training loop's shared state (internal to src/train). */
#ifndef PX_TRAIN_INTERNAL_H
#define PX_TRAIN_INTERNAL_H

#include "plexus/tensor_parallel.h"
#include "plexus/train.h"

/* A micro-batch's device copy (device.c): buffers grown as needed. */
typedef struct px_dev_batch {
  void *x, *y;
  size_t x_bytes, y_bytes; /* allocated */
} px_dev_batch;

typedef struct px_trainer {
  px_comm *comm;
  int rank, world;
  px_model *model;
  px_ddp *ddp;                       /* NULL in a world of one, and under ZeRO */
  px_zero *zero;                     /* ZeRO stage >= 1 (o.zero.stage), else NULL */
  float *shard_params, *shard_grads; /* DDP: the whole flat buffers; ZeRO: px_zero_shard's */
  size_t shard_n;                    /* (NULL where the pieces lie in place) */
  px_optim *opt;
  bool grads_zero; /* the last update left the model's gradients zero (px_optim_step_zero_grads) */
  px_loader *loader;
  px_dataset *train, *val;
  px_train_opts o;
  px_logger *log;
  /* Data parallel over dp_comm: comm itself, or a tensor-parallel mesh's
   * dp communicator (o.mesh); dp ranks, this rank's index among them. */
  px_comm *dp_comm;
  int dp, dp_rank;

  size_t batches_per_epoch; /* per rank */
  int64_t steps_per_epoch;
  int64_t total_steps;
  int64_t end_step; /* this call ends here: total_steps, or stop_at_step */
  bool stopped;
  /* Position: the next optimizer step, and where its first micro-batch is. */
  int64_t step;
  uint64_t epoch;
  size_t next_batch;
  int64_t start_step;
  uint64_t epochs_done;

  int64_t last_eval_step; /* -1: none yet */
  int64_t last_ckpt_step;
  px_eval_metrics last_eval;
  char last_checkpoint[512];
  /* Resume, between its two halves under ZeRO (px_trainer_resume_shards). */
  bool resumed;
  int64_t resume_optimizer_step;
  /* o.device PX_CUDA: DDP's communicator over NCCL (owned; NULL in a world
   * of one), and the micro-batch's device copy. */
  px_comm *nccl;
  px_dev_batch staged;
} px_trainer;

/* ---- The device (device.c) ----------------------------------------------------
 * A batch's x and y where `model` computes: on the CPU views of b, on CUDA
 * copies in d's device buffers (allocated by the first batch, grown when a
 * later one is larger).  *y points at the i32 targets there. */
px_status px_dev_batch_stage(px_dev_batch *d, const px_model *model, const px_batch *b, px_tensor *x,
                             const int32_t **y);
void px_dev_batch_free(px_dev_batch *d);
/* x *= a on the model's device. */
px_status px_device_scale(const px_model *model, float *x, size_t n, float a);
/* The model's gradient norm (‖grad_data‖₂; max_norm > 0: then clipped as
 * px_clip_grad_norm does), on its device. */
px_status px_device_grad_norm(px_model *model, float max_norm, double *norm);
/* Rows of device logits whose argmax is the target (host targets y): the
 * logits are copied to the host. */
px_status px_device_count_correct(const px_tensor *logits, const int32_t *y_host, int64_t *correct);
/* Before a checkpoint is written (the host mirrors from the device), and
 * after one is loaded into the mirrors (back to the device); no-ops on the
 * CPU.  opt may be NULL. */
px_status px_trainer_pull(px_model *model, px_optim *opt);
px_status px_trainer_push(px_model *model, px_optim *opt);
/* The device side of px_train: model (and the optimizer, once created) on
 * o.device; the NCCL communicator for DDP (t->nccl) when dp > 1. */
px_status px_trainer_device_setup(px_trainer *t);
px_status px_trainer_optim_to_device(px_trainer *t);
void px_trainer_device_free(px_trainer *t);
/* The host arrays that hold the model's parameters and buffers (the device
 * mirrors on PX_CUDA), what resume broadcasts. */
float *px_host_params(px_model *model);
float *px_host_buffers(px_model *model);
/* The watchdog's label on comm and, on CUDA, on DDP's NCCL communicator. */
void px_trainer_label(px_trainer *t, const char *label);

/* Checkpoints (state.c).  Write the trainer's state at its current
 * position (collective; rank 0 writes). */
px_status px_trainer_save(px_trainer *t);
/* Resume from o.resume if set (collective; rank 0 reads, then broadcasts
 * weights, optimizer state and position).  *resumed says whether it did.
 * Call before DDP or ZeRO wraps the model; under DDP after the optimizer
 * exists.  Under ZeRO rank 0 loads what is whole (stages 1-2: the model;
 * stage 3: the buffers), which the wrap broadcasts; then, once the
 * optimizer over the shard exists, px_trainer_resume_shards has every rank
 * load its own pieces (optimizer state; stage 3: parameters). */
px_status px_trainer_resume(px_trainer *t, bool *resumed);
px_status px_trainer_resume_shards(px_trainer *t);

/* Checkpoints of a tensor-parallel run (state_tp.c): every tp rank of dp
 * rank 0 writes its boxes as pieces, rank 0 also state_json (collective
 * over comm); every rank loads its boxes from any layout (collective). */
px_status px_trainer_save_tp(px_trainer *t, const char *state_json);
px_status px_trainer_load_tp(px_trainer *t, const char *path);
/* Under ZeRO 1-2 over a tp mesh's dp ranks: every rank's optimizer shard
 * (after the wrap, as px_trainer_resume_shards). */
px_status px_trainer_resume_tp_shards(px_trainer *t);
/* Pieces of a model's boxes (state_tp.c; used by state_pp.c too).  The
 * pieces of n_src flat buffers laid out as md's parameters (the parameters,
 * the optimizer's slots), keys "<prefixes[s]><name>", per_src pieces each,
 * in one list whose data is one malloc'ed block, each piece the box
 * px_tp_param_box gives (a whole tensor when md is not tensor parallel).
 * replicated: include the parameters every tp rank holds whole; skip (may
 * be NULL): leave out the parameter of that name (a pipeline's tied copy).
 * bases[s] non-NULL (bases may be NULL): their boxes are copied in. */
typedef struct px_box_pieces {
  px_tensor_piece *pc;
  int n, per_src;
  float *block;
} px_box_pieces;
px_status px_box_pieces_build(const px_model *md, int n_src, const char *const *prefixes, const float *const *bases,
                              bool replicated, const char *skip, px_box_pieces *f);
void px_box_pieces_free(px_box_pieces *f);
/* Copy between a flat buffer laid out as md's parameters and per_src pieces
 * built with the same replicated and skip: to_pieces from base_in, else
 * into base_out (a column block lies strided in the buffer). */
void px_box_pieces_move(const px_model *md, const float *base_in, float *base_out, px_tensor_piece *pc, bool replicated,
                        const char *skip, bool to_pieces);
/* The optimizer's state slots (at most cap): their names as key prefixes
 * ("exp_avg."), into prefixes and pp, and their arrays into bases. */
#define PX_MAX_OPTIM_SLOTS 8
/* Pieces of flat ranges of md's parameter buffer (a ZeRO shard; state_tp.c):
 * range k is [flat_off[k], + count[k]) of md's flat layout, its elements at
 * base + shard_off[k]; each piece a flat range (offset, count) of the box
 * px_tp_param_box gives, keyed "<prefix><name>", pointing into base (no
 * copy).  replicated and skip as px_box_pieces_build's.  Appended to *all
 * (*n pieces, room for *cap; realloc'ed). */
px_status px_range_box_pieces(const px_model *md, int n_seg, const size_t *flat_off, const size_t *shard_off,
                              const size_t *count, const char *prefix, float *base, bool replicated, const char *skip,
                              px_tensor_piece **all, int *n, int *cap);
int px_optim_slot_sources(px_optim *o, char prefixes[][64], const char *pp[], float *bases[], int cap);

/* After a rank's part of a load (status st): one all-reduce so that every
 * rank fails when any did; the failing rank's error is prefixed by `what`
 * and its rank, the others name the <noun> another rank could not load from
 * `path` (state.c). */
px_status px_trainer_agree_loaded(px_trainer *t, px_status st, const char *what, const char *noun, const char *path);

/* px_evaluate for a tensor-parallel model (evaluate.c): the split is
 * shared over the mesh's dp ranks, the loss is px_tp_cross_entropy. */
px_status px_evaluate_tp(px_mesh *mesh, int vocab, px_model *model, px_dataset *data, size_t batch_size, int workers,
                         int64_t max_batches, px_eval_metrics *out);

/* Memory per rank (memory.c): this rank's figures, their maximum over
 * the ranks and the largest peak RSS (collective). */
px_status px_trainer_memory(px_trainer *t, px_zero_memory *mine, px_zero_memory *max, size_t *peak_rss);
/* Human-readable "1.23 MiB" into buf. */
const char *px_train_bytes_str(size_t bytes, char *buf, size_t cap);

/* ---- state.json (state_file.c) ---------------------------------------------
 * A checkpoint's training state: "format" PX_TRAIN_STATE_FORMAT, "version"
 * PX_TRAIN_STATE_VERSION, the position and the layout.  px_train_state_parse
 * reads any bytes: PX_OK with every field, or PX_ERR_FORMAT naming `path`
 * and the first key that is missing or not a non-negative integer (at most
 * 2^53, what a JSON number holds exactly).  zero_stage is 0 when absent,
 * mesh_dp/mesh_tp world_size and 1 without "mesh"; the optimizer's name is
 * copied (cut at 31 bytes) when it is a string. */
#define PX_TRAIN_STATE_FORMAT "plexus-train-state"
#define PX_TRAIN_STATE_VERSION 1
typedef struct px_train_state_file {
  int64_t step, epoch, next_batch, forward_count, optimizer_step;
  int64_t param_count, world_size, batch_size, accum_steps, zero_stage;
  int64_t mesh_dp, mesh_tp;
  bool has_optimizer;
  char optimizer[32];
} px_train_state_file;
px_status px_train_state_parse(const void *bytes, size_t n, const char *path, px_train_state_file *out);

#endif
