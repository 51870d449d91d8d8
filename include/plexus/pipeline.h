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

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Schedules as data -------------------------------------------------------- */
typedef enum px_pp_kind { PX_PP_GPIPE = 0, PX_PP_1F1B, PX_PP_INTERLEAVED } px_pp_kind;

typedef enum px_pp_op {
  PX_PP_FORWARD = 0,  /* run stage `stage` forward on micro-batch `micro` */
  PX_PP_BACKWARD,     /* run it backward (its forward came earlier on this rank) */
  PX_PP_SEND_ACT,     /* send stage's output activation of `micro` to `peer` (stage + 1's rank) */
  PX_PP_RECV_ACT,     /* receive stage's input activation of `micro` from `peer` (stage - 1's rank) */
  PX_PP_SEND_GRAD,    /* send the gradient of stage's input of `micro` to `peer` (stage - 1's rank) */
  PX_PP_RECV_GRAD,    /* receive the gradient of stage's output of `micro` from `peer` (stage + 1's rank) */
  PX_PP_OPTIM_STEP    /* after the last backward: reduce/step (once per rank, last action) */
} px_pp_op;

typedef struct px_pp_action {
  px_pp_op op;
  int      stage;  /* global stage index 0 … S-1 (chunk = stage / p) */
  int      micro;  /* micro-batch 0 … m-1 (-1 for OPTIM_STEP) */
  int      peer;   /* pipeline rank on the other end (sends and receives), else -1 */
} px_pp_action;

typedef struct px_pp_schedule {
  px_pp_kind     kind;
  int            p, m, v;        /* ranks, micro-batches, chunks per rank */
  int           *n_actions;      /* [p] */
  px_pp_action **actions;        /* [p][n_actions[r]] */
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
 * weights across the first and last stage.) */

#ifdef __cplusplus
}
#endif
#endif
