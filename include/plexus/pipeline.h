/* plexus/pipeline.h — pipeline parallelism: stages, schedules as data, execution.
 *
 * A chain model is cut into S = p · v stages (p pipeline ranks, v virtual
 * stages, "model chunks", per rank).  Stage s lives on pipeline rank s mod p
 * as its chunk s / p (Megatron's interleaving; v = 1: stage s on rank s).
 * A step splits the batch into m micro-batches; each goes forward through
 * stages 0 … S-1 and backward through S-1 … 0.
 *
 * Schedules are data (as torch.distributed.pipelining): for each pipeline
 * rank, the list of actions it performs in order.  Generated tables are
 * checked by simulation before the first step (every send has its receive,
 * no cycle of waits, every (stage, micro-batch) forwarded once and
 * backwarded once after its forward), and can be printed for a person.
 *
 *   GPipe         all forwards, then all backwards (holds m micro-batches of
 *                 activations per stage);
 *   1F1B          p - rank - 1 warm-up forwards, then one forward one
 *                 backward, then the cool-down backwards (Megatron; at most
 *                 p - rank micro-batches in flight);
 *   interleaved   1F1B over v chunks per rank (Megatron's interleaved
 *                 schedule; m must be a multiple of p).
 * Bubble (idle share of a stage, equal forward and backward costs):
 * (p - 1)/(m + p - 1) for GPipe and 1F1B, (p - 1)/(v·m + p - 1) interleaved.
 *
 * Errors are px_status values with px_last_error() messages, as everywhere. */
#ifndef PLEXUS_PIPELINE_H
#define PLEXUS_PIPELINE_H

#include <stdio.h>

#include "plexus/comm.h"
#include "plexus/nn.h"
#include "plexus/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

/* ---- Schedules as data -------------------------------------------------------- */
typedef enum px_pp_kind { PX_PP_GPIPE = 0, PX_PP_1F1B, PX_PP_INTERLEAVED } px_pp_kind;

typedef enum px_pp_op {
  PX_PP_FORWARD = 0, /* run stage `stage` forward on micro-batch `micro` */
  PX_PP_BACKWARD,    /* run it backward (its forward came earlier on this rank) */
  PX_PP_SEND_ACT,    /* send stage's output activation of `micro` to `peer` (stage + 1's rank) */
  PX_PP_RECV_ACT,    /* receive stage's input activation of `micro` from `peer` (stage - 1's rank) */
  PX_PP_SEND_GRAD,   /* send the gradient of stage's input of `micro` to `peer` (stage - 1's rank) */
  PX_PP_RECV_GRAD,   /* receive the gradient of stage's output of `micro` from `peer` (stage + 1's rank) */
  PX_PP_OPTIM_STEP   /* after the last backward: reduce/step (once per rank, last action) */
} px_pp_op;

typedef struct px_pp_action {
  px_pp_op op;
  int stage; /* global stage index 0 … S-1 (chunk = stage / p) */
  int micro; /* micro-batch 0 … m-1 (-1 for OPTIM_STEP) */
  int peer;  /* pipeline rank on the other end (sends and receives), else -1 */
} px_pp_action;

typedef struct px_pp_schedule {
  px_pp_kind kind;
  int p, m, v;            /* ranks, micro-batches, chunks per rank */
  int *n_actions;         /* [p] */
  px_pp_action **actions; /* [p][n_actions[r]] */
} px_pp_schedule;

/* "gpipe", "1f1b", "interleaved" (and back). */
const char *px_pp_kind_name(px_pp_kind k);
px_status px_pp_kind_parse(const char *s, px_pp_kind *out);
/* "FORWARD", "SEND_ACT", ... (for messages). */
const char *px_pp_op_name(px_pp_op op);
/* The bubble the formulas above predict: (p - 1)/(m + p - 1), or
 * (p - 1)/(v·m + p - 1) for INTERLEAVED. */
double px_pp_bubble_formula(px_pp_kind kind, int p, int m, int v);

/* Generate the table for every rank.  p >= 1, m >= 1, v >= 1 (v > 1 only
 * with INTERLEAVED).  m < p is allowed where the schedule allows (GPipe and
 * 1F1B run with idle stages); interleaved needs m % p == 0, else
 * PX_ERR_INVALID naming both numbers.  The result is checked
 * (px_pp_schedule_check) before it is returned.
 *
 * Each rank's list is one global order of events projected on the rank
 * (src/parallel/pp_schedule.c explains), so it runs even when every send
 * and receive blocks.  The executor's convention:
 *   - run the actions in order; blocking sends and receives are safe;
 *   - or (faster) post each SEND/RECV non-blocking where it stands, wait
 *     for a RECV right before the compute that uses it, for SENDs before
 *     their buffers are reused (at the latest at OPTIM_STEP);
 *   - a transfer is named by (op, stage, micro) — a fine message tag;
 *   - with p = 1 there are no sends or receives: neighbouring stages hand
 *     activations and gradients over on the rank. */
px_status px_pp_schedule_make(px_pp_kind kind, int p, int m, int v, px_pp_schedule **out);
void px_pp_schedule_free(px_pp_schedule *s);

/* Simulate the table: every rank runs its actions in order; a send completes
 * when its receive is posted (the strictest transport), a receive when its
 * send is.  Refused (PX_ERR_INVALID, message naming rank, action index and
 * what is wrong): a send without its receive or the reverse, a peer or stage
 * that is not where the stage map puts it, a backward before its forward or
 * before its gradient arrived, a forward before its activation arrived, a
 * (stage, micro) run twice or never, and a deadlock (the ranks and actions
 * each one is stuck on). */
px_status px_pp_schedule_check(const px_pp_schedule *s);

/* Time the table with forward cost tf and backward cost tb per stage and
 * micro-batch (communication free): busy_fraction[r] (p values, may be
 * NULL) the share of the makespan rank r computes, *makespan (may be NULL)
 * the total.  1 - busy is the bubble the formulas above predict (exactly,
 * for every generated table, with any tf and tb).  The model is the
 * executor's fast path: SEND and RECV are posted non-blocking where they
 * stand, a compute waits for its input's send.  The table is checked first
 * (PX_ERR_INVALID if it fails). */
px_status px_pp_schedule_simulate(const px_pp_schedule *s, double tf, double tb, double *busy_fraction,
                                  double *makespan);

/* The table for a person: one column per rank, one row per time slot of the
 * simulation ("F3.1" = forward stage 3 micro 1, "B", "sA"/"rA" send/receive
 * activation, "sG"/"rG" gradient, "OPT"). */
void px_pp_schedule_print(const px_pp_schedule *s, FILE *out);

/* ---- Stages and execution ----------------------------------------------------
 * (owned by the execution work: splitting a chain model into stages, the
 * executor that runs a px_pp_schedule over px_comm point-to-point, tied
 * weights across the first and last stage.)
 *
 * Units.  The chain is cut between its units: the root chain's children,
 * except that a child chain whose children are named by index (the GPT's
 * "h", a ResNet "layer1") is replaced by its children ("h.0", "h.1", …).
 * A unit's path is its name in the whole model; a stage's model holds its
 * units as children named by those paths, so its parameters keep the whole
 * model's names ("h.3.mlp.c_fc.weight", "4.bias").
 *
 * Same values as one process.  A module's initial weights are drawn from
 * (seed, its stream): its pre-order index in the WHOLE model (nn.h).  The
 * stage builder builds the whole module tree (declarations only: no
 * parameter memory), numbers it as px_model_create would, keeps its units
 * and frees the rest, then gives every kept module its whole-model stream
 * before initialising.  So stage s's parameters are bit-for-bit those of
 * the single-process model, and a rank allocates only its stages'.
 * Dropout masks (dropout.c, attention.c) are drawn from (seed, stream,
 * ctx.step, element index), so they are the whole model's too; the
 * executor sets a slot model's ctx.step before each FORWARD so that
 * micro-batch j of step s (0-based, counted by px_pp_step) draws the masks
 * of the single process's (s·m + j + 1)-th training forward: a pipeline
 * with dropout gives the losses and parameters of one process running the
 * same m micro-batches per step with gradient accumulation (not of one
 * forward on the whole batch, whose element indices differ). */

/* Builds the whole model's module tree (as px_zoo_mlp(…) does); called once
 * per stage model and micro-batch slot, so it must return the same tree
 * every time.  NULL with px_last_error() set on failure. */
typedef px_module *(*px_pp_build_fn)(void *arg);

typedef enum px_pp_split_kind {
  PX_PP_SPLIT_UNITS = 0, /* equal unit counts (the first n % S stages one more) */
  PX_PP_SPLIT_PARAMS,    /* contiguous, the largest stage's parameter count smallest */
  PX_PP_SPLIT_AT         /* at named units: `at` holds the S - 1 paths that start stages 1 … S-1 */
} px_pp_split_kind;

typedef struct px_pp_split {
  px_pp_split_kind kind;
  const char *const *at; /* PX_PP_SPLIT_AT only */
  int n_at;
} px_pp_split;

/* Which units each stage holds; the same on every rank. */
typedef struct px_pp_plan {
  int n_units, n_stages;
  char (*unit)[PX_NAME_MAX]; /* [n_units] paths: "flatten", "3", "h.0", "ln_f" */
  size_t *unit_params;       /* [n_units] trainable elements under each unit */
  int *first;                /* [n_stages + 1]: stage s holds units [first[s], first[s + 1]) */
  /* A tied head (px_tied_head) on another stage than its embedding (the
   * GPT's lm_head and wte): -1 when none.  The head's stage then holds its
   * own copy of the embedding's weight, under the embedding's name
   * ("wte.weight"), initialised from the same stream (so equal), and the
   * executor sums the two copies' gradients over the embedding group (the
   * ranks of both stages) before the optimizer step, as Megatron does: the
   * copies stay equal, one parameter in effect.  Tensor parallel (the
   * embedding a px_tp_vocab_embedding, the head a px_tp_vocab_tied_head):
   * the copy is a px_tp_vocab_embedding of the same tp group (this tp
   * rank's rows, initialised as its box of the single process's table) and
   * the head computes x · E_rᵀ with its dx all-reduced over tp (no sequence
   * parallelism); the embedding group lies in one tp rank's pipeline. */
  int tied_head_unit, tied_emb_unit;
  char tied_param[PX_NAME_MAX]; /* "wte.weight" */
} px_pp_plan;

/* PX_ERR_INVALID: fewer units than stages (naming both), an unknown or
 * out-of-order split name, a split that leaves a stage empty, or a module
 * that uses a parameter of a module on another stage (naming both) unless
 * it is a tied head that is a unit itself, tied to an embedding that is a
 * unit itself (the GPT's lm_head and wte: see tied_head_unit). */
px_status px_pp_plan_make(px_pp_build_fn build, void *arg, int n_stages, const px_pp_split *split, px_pp_plan **out);
void px_pp_plan_free(px_pp_plan *plan);
/* One line per stage: its units and parameter count. */
void px_pp_plan_print(const px_pp_plan *plan, FILE *out);
/* The stage (0 … S-1) that holds unit u. */
int px_pp_plan_stage_of(const px_pp_plan *plan, int unit);

/* Stage `stage`'s model alone: its units, the whole model's names and
 * initial values (seed as px_model_create's). */
px_status px_pp_stage_model(px_pp_build_fn build, void *arg, const px_pp_plan *plan, int stage, uint64_t seed,
                            px_model **out);

/* ---- The executor ---------------------------------------------------------------
 * One px_pp per pipeline rank holds the models of its chunks (stages rank,
 * rank + p, …) and runs a schedule's actions in order:
 *   RECV_ACT / RECV_GRAD   px_comm_irecv, posted when reached; waited for by
 *                          the FORWARD / BACKWARD that needs it (the time
 *                          spent waiting is the stage's idle time);
 *   SEND_ACT / SEND_GRAD   the tensor is copied into the micro-batch's send
 *                          buffer and px_comm_isend'ed; every send is waited
 *                          for at OPTIM_STEP (end of step);
 *   FORWARD / BACKWARD     the stage's model on that micro-batch;
 *   OPTIM_STEP             one optimizer step per chunk (its own parameters).
 * Activations of m micro-batches.  A module keeps what its backward needs in
 * its own struct, so one model holds one micro-batch.  Each chunk therefore
 * has a pool of "slots": models built from the same units whose parameter,
 * gradient and buffer pointers are those of slot 0 (one copy of the
 * weights, one gradient sum), each with its own arena.  A FORWARD takes a
 * free slot, its BACKWARD frees it; the pool is as large as the schedule
 * keeps micro-batches in flight (GPipe m, 1F1B p - rank), so the arenas'
 * high-water mark is the activation memory the schedule implies.
 * On the first step every activation and gradient travels with a shape
 * header; a shape other than the one expected (the same for every
 * micro-batch; a gradient the shape of the output it belongs to) is
 * PX_ERR_SHAPE naming the stage, micro-batch and both shapes.  Later steps
 * send the data alone.  The watchdog's label (px_comm_set_label) names the
 * step, stage, micro-batch and action. */
typedef struct px_pp px_pp;

/* ∂(micro-batch loss)/∂out into dout (out's shape), and that loss, for
 * micro-batch `micro` of the step's batch.  The step's loss is the mean of
 * the m micro-batch losses and each dout is scaled by 1/m: with equal
 * micro-batches and a mean loss, the single process's loss and gradients. */
typedef px_status (*px_pp_loss_fn)(void *user, const px_tensor *out, int micro, float *loss, float *dout);

/* The loss most callers want: cross-entropy against int32 targets (user: a
 * px_pp_ce_targets), micro-batch k's rows at k · rows_per_micro. */
typedef struct px_pp_ce_targets {
  const int32_t *targets; /* the whole batch's */
  int64_t rows_per_micro;
} px_pp_ce_targets;
/* A px_pp loss callback: cross-entropy of micro-batch `micro` against its rows of the
 * px_pp_ce_targets in user. */
px_status px_pp_ce_loss(void *user, const px_tensor *out, int micro, float *loss, float *dout);

typedef struct px_pp_opts {
  px_pp_build_fn build; /* the whole model's tree */
  void *build_arg;
  const px_pp_split *split; /* NULL: PX_PP_SPLIT_UNITS */
  uint64_t seed;
  const px_optim_opts *optim; /* NULL: OPTIM_STEP does nothing (step the chunk models yourself) */
  float clip_grad_norm;       /* > 0: at OPTIM_STEP, scale the gradients so that their global norm
                                           (over every stage, the tied weight counted once) is at most this */
  /* 3D (pipeline × data × tensor parallel; NULL / 0: the pipeline alone). */
  px_comm *dp;    /* the data-parallel group: the pipeline replicas that hold the same stages
                                      (px_mesh's dp_comm).  Each replica runs the schedule over its own `pipe` on
                                      its own batch; at OPTIM_STEP every chunk's gradients are averaged over dp
                                      (rank-order sums as DDP's, divided by |dp|: one process on the |dp|-times
                                      larger batch), and the step's loss is the replicas' mean */
  int zero_stage; /* with dp: 0 (the average above), 1 or 2 (ZeRO over dp: each chunk's gradient
                                      reduce-scattered, this dp rank's slice stepped with optimizer state for it
                                      alone, the parameters all-gathered; the gradients accumulate over the
                                      micro-batches in the whole buffer, so stage 2 holds stage 1's gradient
                                      memory).  3 is refused */
  px_comm *tp;    /* the tensor-parallel group of the stage models' px_tp_* modules (px_mesh's
                                      tp_comm), for the gradient norm: a tp-split parameter counts with every tp
                                      rank's box, a replicated one once */
} px_pp_opts;

/* Collective over `pipe` (its size must be the schedule's p), and over
 * opts->dp when given (every replica creates its pipeline at once).  The
 * schedule and the dp / tp communicators are borrowed (keep them until
 * px_pp_free).  3D over a px_mesh: pipe = mesh->pp_comm, dp =
 * mesh->dp_comm, tp = mesh->tp_comm; the builder returns px_tp_gpt's tree
 * over &mesh->tp_group, the loss function px_tp_cross_entropy.  A ZeRO
 * stage other than 0-2, or 1-2 without dp: PX_ERR_INVALID naming it. */
px_status px_pp_create(px_pp **out, px_comm *pipe, const px_pp_schedule *sched, const px_pp_opts *opts);
void px_pp_free(px_pp *pp);

/* One training step: zero gradients, the schedule, OPTIM_STEP.  x: the whole
 * batch, split along dimension 0 into m equal micro-batches (its size must
 * be a multiple of m: else PX_ERR_INVALID naming both); read on the rank of
 * stage 0 only (others may pass NULL).  *loss (may be NULL): the batch's
 * mean loss, the same on every rank (with dp: the replicas' batches' mean).
 * With dp, OPTIM_STEP runs: the tied copies' sum, the dp average (or ZeRO's
 * reduce-scatter), the norm and clipping, the step, (ZeRO) the all-gather. */
px_status px_pp_step(px_pp *pp, const px_tensor *x, px_pp_loss_fn loss_fn, void *loss_user, float *loss);
/* Forward only, micro-batch after micro-batch, models in eval mode (then
 * back in training mode); the mean loss on every rank of the pipeline (with
 * px_pp_opts.dp: of this replica's x, not averaged over the replicas). */
px_status px_pp_eval(px_pp *pp, const px_tensor *x, px_pp_loss_fn loss_fn, void *loss_user, float *loss);

/* This rank's chunks: chunk c is stage rank + c·p; its model is slot 0 (the
 * parameters, named as in the whole model). */
int px_pp_n_chunks(const px_pp *pp);
px_model *px_pp_chunk_model(px_pp *pp, int chunk);
int px_pp_chunk_stage(const px_pp *pp, int chunk);
const px_pp_plan *px_pp_plan_of(const px_pp *pp);

/* The learning rate of the next OPTIM_STEP, for every chunk's optimizer
 * (a schedule: px_pp_set_lr(pp, px_lr_at(&sched, step)) before each step). */
void px_pp_set_lr(px_pp *pp, float lr);
/* on: the following steps measure the global gradient norm (stats'
 * grad_norm, one scalar all-reduce over the pipeline) also without
 * clipping, as a logging step wants it; with clip_grad_norm > 0 it is
 * always measured. */
void px_pp_measure_grad_norm(px_pp *pp, bool on);

typedef struct px_pp_stats {
  double step_s;      /* wall time of the last step */
  double wait_s;      /* of which waiting for receives */
  double compute_s;   /* of which in forward, backward and the loss (1 - compute_s/step_s: idle share) */
  int slots;          /* activation slots (micro-batches in flight), summed over chunks */
  size_t arena_high;  /* the slots' arena high-water marks summed (bytes): activations held */
  size_t comm_bytes;  /* send and receive buffers (bytes) */
  size_t param_elems; /* parameters held by this rank */
  float grad_norm;    /* the last step's global gradient norm before clipping (clip_grad_norm > 0 or
                          px_pp_measure_grad_norm; else that of the last step that measured it) */
} px_pp_stats;
/* This rank's statistics (the struct above). */
void px_pp_stats_get(const px_pp *pp, px_pp_stats *out);

/* ---- Checkpoints (src/train/state_pp.c) ---------------------------------------- */
/* Chunk c's optimizer (NULL without px_pp_opts.optim): its state slots and
 * step count are what a checkpoint saves and a resume restores. */
px_optim *px_pp_chunk_optim(px_pp *pp, int chunk);
/* A resumed run: the training steps taken before this px_pp (the dropout
 * masks of step s are those of step steps + s of the whole run). */
void px_pp_set_step_base(px_pp *pp, uint64_t steps);
/* Under ZeRO over dp (px_pp_opts.zero_stage 1-2): true, and the flat range
 * [*off, *off + *len) of chunk c's parameter buffer (its model's
 * param_data) whose optimizer state this dp rank holds: px_pp_chunk_optim's
 * slots are indexed from *off (*len 0: no optimizer).  false without ZeRO
 * (the optimizer covers the whole buffer). */
bool px_pp_chunk_zero_slice(const px_pp *pp, int chunk, size_t *off, size_t *len);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
