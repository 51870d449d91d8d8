/* The training loop's shared state (internal to src/train). */
#ifndef PX_TRAIN_INTERNAL_H
#define PX_TRAIN_INTERNAL_H

#include "plexus/train.h"

typedef struct px_trainer {
  px_comm       *comm;
  int            rank, world;
  px_model      *model;
  px_ddp        *ddp;      /* NULL in a world of one */
  px_optim      *opt;
  px_loader     *loader;
  px_dataset    *train, *val;
  px_train_opts  o;
  px_logger     *log;

  size_t   batches_per_epoch;  /* per rank */
  int64_t  steps_per_epoch;
  int64_t  total_steps;
  int64_t  end_step;           /* this call ends here: total_steps, or stop_at_step */
  bool     stopped;
  /* Position: the next optimizer step, and where its first micro-batch is. */
  int64_t  step;
  uint64_t epoch;
  size_t   next_batch;
  int64_t  start_step;
  uint64_t epochs_done;

  int64_t  last_eval_step;     /* -1: none yet */
  int64_t  last_ckpt_step;
  px_eval_metrics last_eval;
  char     last_checkpoint[512];
} px_trainer;

/* Checkpoints (state.c).  Write the trainer's state at its current
 * position (collective; rank 0 writes). */
px_status px_trainer_save(px_trainer *t);
/* Resume from o.resume if set (collective; rank 0 reads, then broadcasts
 * weights, optimizer state and position).  *resumed says whether it did.
 * Call before DDP wraps the model and after the optimizer exists. */
px_status px_trainer_resume(px_trainer *t, bool *resumed);

#endif
