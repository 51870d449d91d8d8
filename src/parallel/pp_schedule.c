/* pp_schedule.c — pipeline schedules generated as per-rank action tables
 * (plexus/pipeline.h, "Schedules as data").
 *
 * How a table is made, in three steps:
 *
 *  1. Each rank's compute order: the sequence of FORWARD and BACKWARD
 *     (stage, micro) it runs.  This is where the schedules differ (GPipe,
 *     Megatron's 1F1B, Megatron's interleaved 1F1B); see order_*() below.
 *
 *  2. A timeline: the compute orders are played with unit costs and free
 *     communication (a forward of stage s waits for stage s - 1's forward of
 *     the same micro-batch, a backward for stage s + 1's backward), giving
 *     every compute event an integer start time.
 *
 *  3. One global order of all events, and each rank's table is its
 *     projection.  A compute event's key is its start time; a transfer
 *     (an activation from stage s to s + 1, or a gradient from s + 1 to s,
 *     between two different ranks) is one event shared by the sender and
 *     the receiver, keyed by the time its producer ends; at equal times
 *     transfers come before compute, and ties between transfers are broken
 *     by (kind, stage, micro).  So on the sender the SEND comes right after
 *     the compute that produced it, and on the receiver the RECV comes
 *     before the compute that needs it.
 *
 * Why the global order: with a transport where a send completes only when
 * its receive is posted (MPI_Ssend, a rendezvous protocol for large
 * messages), two neighbours that both send first wait for each other
 * forever — the hang that crossed sends and receives cause in 1F1B's steady
 * state ("send my activation, then receive your gradient" on rank r, "send
 * my gradient, then receive your activation" on rank r + 1).  Megatron
 * avoids it by batching such a send and receive into one
 * batch_isend_irecv; PyTorch rewrote its interleaved schedule to compute one
 * global order first (pytorch PR #127332).  Here every rank's list is a
 * projection of one total order in which each transfer is a single event,
 * so the earliest unfinished event always has all its participants waiting
 * at it: the tables cannot deadlock even when every action blocks
 * (px_pp_schedule_check proves it for each table by simulation).
 *
 * The executor's convention (what it may assume and must do):
 *   - run a rank's actions in order; blocking sends and receives are safe
 *     (px_pp_schedule_check proves exactly that);
 *   - faster, and what px_pp_schedule_simulate times: post each SEND and
 *     RECV non-blocking where it stands in the table, wait for a RECV only
 *     right before the compute that uses its data, and for the SENDs before
 *     their buffers are reused (at the latest at OPTIM_STEP).  Posting a
 *     transfer earlier never delays its partner, so this cannot create a
 *     wait that the blocking run does not have; and a receive placed early
 *     on the unit timeline (below) then never holds back an unrelated
 *     compute when the real forward and backward costs differ;
 *   - a transfer is identified by (kind, stage, micro): the activation of
 *     micro-batch i out of stage s, or the gradient of micro-batch i into
 *     stage s (messages between a pair of ranks may use that as the tag);
 *   - with p = 1 (every stage on one rank) there are no sends or receives:
 *     stage s + 1's input is stage s's output on the same rank, handed over
 *     locally, and likewise for gradients. */
#include "plexus/pipeline.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *px_pp_kind_name(px_pp_kind k) {
  switch (k) {
  case PX_PP_GPIPE: return "gpipe";
  case PX_PP_1F1B: return "1f1b";
  case PX_PP_INTERLEAVED: return "interleaved";
  }
  return "unknown";
}

px_status px_pp_kind_parse(const char *s, px_pp_kind *out) {
  if (!s || !out) return px_error(PX_ERR_INVALID, "pipeline schedule: no name given");
  if (strcmp(s, "gpipe") == 0) *out = PX_PP_GPIPE;
  else if (strcmp(s, "1f1b") == 0) *out = PX_PP_1F1B;
  else if (strcmp(s, "interleaved") == 0) *out = PX_PP_INTERLEAVED;
  else return px_error(PX_ERR_INVALID, "pipeline schedule \"%s\": expected gpipe, 1f1b or interleaved", s);
  return PX_OK;
}

const char *px_pp_op_name(px_pp_op op) {
  switch (op) {
  case PX_PP_FORWARD: return "FORWARD";
  case PX_PP_BACKWARD: return "BACKWARD";
  case PX_PP_SEND_ACT: return "SEND_ACT";
  case PX_PP_RECV_ACT: return "RECV_ACT";
  case PX_PP_SEND_GRAD: return "SEND_GRAD";
  case PX_PP_RECV_GRAD: return "RECV_GRAD";
  case PX_PP_OPTIM_STEP: return "OPTIM_STEP";
  }
  return "UNKNOWN";
}

double px_pp_bubble_formula(px_pp_kind kind, int p, int m, int v) {
  if (p < 1 || m < 1 || v < 1) return 0.0;
  double vm = kind == PX_PP_INTERLEAVED ? (double)v * m : (double)m;
  return (double)(p - 1) / (vm + p - 1);
}

void px_pp_schedule_free(px_pp_schedule *s) {
  if (!s) return;
  if (s->actions)
    for (int r = 0; r < s->p; r++) free(s->actions[r]);
  free(s->actions);
  free(s->n_actions);
  free(s);
}

/* ---- 1. Compute orders ---------------------------------------------------------
 * A compute item: forward or backward of (stage, micro).  Each rank runs
 * 2·m·v of them. */
typedef struct work {
  int backward;
  int stage, micro;
} work;

/* GPipe: every forward, then every backward, micro-batches in order (as
 * torch.distributed.pipelining's ScheduleGPipe).  Holds m micro-batches of
 * activations. */
static void order_gpipe(int p, int m, int r, work *w) {
  (void)p;
  int n = 0;
  for (int i = 0; i < m; i++) w[n++] = (work){0, r, i};
  for (int i = 0; i < m; i++) w[n++] = (work){1, r, i};
}

/* 1F1B (Megatron's forward_backward_pipelining_without_interleaving):
 * p - r - 1 warm-up forwards (fewer when m is smaller), then one forward
 * one backward until the forwards run out, then the cool-down backwards.
 * At most p - r micro-batches are in flight on rank r. */
static void order_1f1b(int p, int m, int r, work *w) {
  int warmup = p - r - 1 < m ? p - r - 1 : m;
  int n = 0, f = 0, b = 0;
  while (f < warmup) w[n++] = (work){0, r, f++};
  while (f < m) {
    w[n++] = (work){0, r, f++};
    w[n++] = (work){1, r, b++};
  }
  while (b < m) w[n++] = (work){1, r, b++};
}

/* Interleaved 1F1B (Megatron's forward_backward_pipelining_with_interleaving):
 * the k-th forward of rank r runs chunk (k mod p·v) / p on micro-batch
 * (k / p·v)·p + k mod p — groups of p micro-batches go through chunk 0, then
 * chunk 1, … — and the k-th backward runs the chunks in reverse order.
 * Warm-up: 2·(p - r - 1) + (v - 1)·p forwards (all of them when that is not
 * fewer than m·v), then one forward one backward, then the cool-down. */
static void interleaved_item(int p, int v, int r, int k, int backward, work *out) {
  int in_group = k % (p * v);
  int chunk = in_group / p;
  if (backward) chunk = v - 1 - chunk;
  *out = (work){backward, chunk * p + r, (k / (p * v)) * p + k % p};
}

static void order_interleaved(int p, int m, int v, int r, work *w) {
  int total = m * v;
  int warmup = 2 * (p - r - 1) + (v - 1) * p;
  if (warmup > total) warmup = total;
  int n = 0, f = 0, b = 0;
  while (f < warmup) interleaved_item(p, v, r, f++, 0, &w[n++]);
  while (f < total) {
    interleaved_item(p, v, r, f++, 0, &w[n++]);
    interleaved_item(p, v, r, b++, 1, &w[n++]);
  }
  while (b < total) interleaved_item(p, v, r, b++, 1, &w[n++]);
}

/* ---- 2. Timeline ---------------------------------------------------------------
 * Unit costs, free communication.  start[r][j]: start time of rank r's j-th
 * compute item; f_end / b_end: end time of the forward / backward of
 * (stage, micro), indexed stage·m + micro. */
static px_status timeline(int p, int m, int S, int per_rank, work *const *w, int64_t *const *start, int64_t *f_end,
                          int64_t *b_end) {
  int *next = calloc((size_t)p, sizeof *next);
  int64_t *clock = calloc((size_t)p, sizeof *clock);
  if (!next || !clock) {
    free(next);
    free(clock);
    return px_error(PX_ERR_NOMEM, "pipeline schedule: out of memory");
  }
  for (size_t x = 0; x < (size_t)S * (size_t)m; x++) f_end[x] = b_end[x] = -1;
  int left = p * per_rank;
  for (int progress = 1; progress && left > 0;) {
    progress = 0;
    for (int r = 0; r < p; r++) {
      while (next[r] < per_rank) {
        work it = w[r][next[r]];
        size_t x = (size_t)it.stage * (size_t)m + (size_t)it.micro;
        int64_t ready;
        if (!it.backward) ready = it.stage == 0 ? 0 : f_end[x - (size_t)m];
        else if (it.stage == S - 1) ready = f_end[x];
        else ready = b_end[x + (size_t)m];
        if (ready < 0) break;
        int64_t t0 = clock[r] > ready ? clock[r] : ready;
        start[r][next[r]] = t0;
        clock[r] = t0 + 1;
        if (it.backward) b_end[x] = t0 + 1;
        else f_end[x] = t0 + 1;
        next[r]++;
        left--;
        progress = 1;
      }
    }
  }
  free(next);
  free(clock);
  if (left > 0) return px_error(PX_ERR_INTERNAL, "pipeline schedule: the compute orders wait on each other");
  return PX_OK;
}

/* ---- 3. One global order, projected on each rank ------------------------------- */
typedef struct keyed {
  int64_t time;
  int cls;  /* 0 transfer, 1 compute: transfers first at equal times */
  int kind; /* 0 activation, 1 gradient (transfers); 0 F, 1 B (compute) */
  int stage, micro;
  px_pp_action a;
} keyed;

static int keyed_cmp(const void *pa, const void *pb) {
  const keyed *a = pa, *b = pb;
  if (a->time != b->time) return a->time < b->time ? -1 : 1;
  if (a->cls != b->cls) return a->cls - b->cls;
  if (a->kind != b->kind) return a->kind - b->kind;
  if (a->stage != b->stage) return a->stage - b->stage;
  return a->micro - b->micro;
}

static px_status make_tables(px_pp_schedule *s, work *const *w, int per_rank) {
  int p = s->p, m = s->m, S = s->p * s->v;
  size_t sm = (size_t)S * (size_t)m;
  /* Per rank at most: per_rank compute items, and for each of them one
   * receive and one send, plus the optimizer step. */
  size_t cap = (size_t)per_rank * 2 + (size_t)per_rank + 1;
  int64_t *f_end = malloc(sm * sizeof *f_end), *b_end = malloc(sm * sizeof *b_end);
  int64_t **start = calloc((size_t)p, sizeof *start);
  keyed **items = calloc((size_t)p, sizeof *items);
  int *n_items = calloc((size_t)p, sizeof *n_items);
  px_status st = PX_OK;
  if (!f_end || !b_end || !start || !items || !n_items) {
    st = px_error(PX_ERR_NOMEM, "pipeline schedule: out of memory");
    goto done;
  }
  for (int r = 0; r < p; r++) {
    start[r] = malloc((size_t)per_rank * sizeof **start);
    items[r] = malloc(cap * sizeof **items);
    if (!start[r] || !items[r]) {
      st = px_error(PX_ERR_NOMEM, "pipeline schedule: out of memory");
      goto done;
    }
  }
  if ((st = timeline(p, m, S, per_rank, w, start, f_end, b_end)) != PX_OK) goto done;

  for (int r = 0; r < p; r++)
    for (int j = 0; j < per_rank; j++) {
      work it = w[r][j];
      items[r][n_items[r]++] =
        (keyed){start[r][j], 1,        it.backward,
                it.stage,    it.micro, {it.backward ? PX_PP_BACKWARD : PX_PP_FORWARD, it.stage, it.micro, -1}};
    }
  /* Transfers across each boundary s | s + 1 whose two stages are on
   * different ranks (all of them unless p = 1). */
  if (p > 1)
    for (int sg = 0; sg + 1 < S; sg++) {
      int lo = sg % p, hi = (sg + 1) % p;
      for (int i = 0; i < m; i++) {
        size_t x = (size_t)sg * (size_t)m + (size_t)i, y = x + (size_t)m;
        /* activation: stage sg on lo -> stage sg + 1 on hi, when sg's forward ends */
        items[lo][n_items[lo]++] = (keyed){f_end[x], 0, 0, sg, i, {PX_PP_SEND_ACT, sg, i, hi}};
        items[hi][n_items[hi]++] = (keyed){f_end[x], 0, 0, sg, i, {PX_PP_RECV_ACT, sg + 1, i, lo}};
        /* gradient: stage sg + 1 on hi -> stage sg on lo, when sg + 1's backward ends */
        items[hi][n_items[hi]++] = (keyed){b_end[y], 0, 1, sg + 1, i, {PX_PP_SEND_GRAD, sg + 1, i, lo}};
        items[lo][n_items[lo]++] = (keyed){b_end[y], 0, 1, sg + 1, i, {PX_PP_RECV_GRAD, sg, i, hi}};
      }
    }
  for (int r = 0; r < p; r++) {
    qsort(items[r], (size_t)n_items[r], sizeof **items, keyed_cmp);
    s->actions[r] = malloc(((size_t)n_items[r] + 1) * sizeof **s->actions);
    if (!s->actions[r]) {
      st = px_error(PX_ERR_NOMEM, "pipeline schedule: out of memory");
      goto done;
    }
    for (int k = 0; k < n_items[r]; k++) s->actions[r][k] = items[r][k].a;
    s->actions[r][n_items[r]] = (px_pp_action){PX_PP_OPTIM_STEP, -1, -1, -1};
    s->n_actions[r] = n_items[r] + 1;
  }
done:
  if (start)
    for (int r = 0; r < p; r++) free(start[r]);
  if (items)
    for (int r = 0; r < p; r++) free(items[r]);
  free(start);
  free(items);
  free(n_items);
  free(f_end);
  free(b_end);
  return st;
}

/* Limits that keep every count and index of a table well inside an int
 * (a table with more is not a schedule anyone runs). */
#define PX_PP_MAX_ITEMS (1 << 24)

px_status px_pp_schedule_make(px_pp_kind kind, int p, int m, int v, px_pp_schedule **out) {
  if (!out) return px_error(PX_ERR_INVALID, "px_pp_schedule_make: out is NULL");
  *out = NULL;
  const char *name = px_pp_kind_name(kind);
  if (kind != PX_PP_GPIPE && kind != PX_PP_1F1B && kind != PX_PP_INTERLEAVED)
    return px_error(PX_ERR_INVALID, "pipeline schedule: unknown kind %d", (int)kind);
  if (p < 1) return px_error(PX_ERR_INVALID, "pipeline schedule %s: %d pipeline ranks; expected at least 1", name, p);
  if (m < 1) return px_error(PX_ERR_INVALID, "pipeline schedule %s: %d micro-batches; expected at least 1", name, m);
  if (v < 1)
    return px_error(PX_ERR_INVALID, "pipeline schedule %s: %d virtual stages per rank; expected at least 1", name, v);
  if (v > 1 && kind != PX_PP_INTERLEAVED)
    return px_error(PX_ERR_INVALID,
                    "pipeline schedule %s: %d virtual stages per rank; only the interleaved schedule has more than 1",
                    name, v);
  if ((int64_t)p * v * m * 2 > PX_PP_MAX_ITEMS)
    return px_error(PX_ERR_INVALID, "pipeline schedule %s: p %d x v %d x m %d is too large a table", name, p, v, m);
  if (kind == PX_PP_INTERLEAVED && m % p != 0)
    return px_error(PX_ERR_INVALID,
                    "pipeline schedule interleaved: %d micro-batches is not a multiple of the %d pipeline ranks "
                    "(Megatron's interleaved schedule sends groups of p micro-batches through each chunk); "
                    "use a multiple of %d, or gpipe / 1f1b",
                    m, p, p);

  int per_rank = 2 * m * v;
  px_pp_schedule *s = calloc(1, sizeof *s);
  work **w = calloc((size_t)p, sizeof *w);
  px_status st = PX_OK;
  if (!s || !w) {
    free(s);
    free(w);
    return px_error(PX_ERR_NOMEM, "pipeline schedule: out of memory");
  }
  s->kind = kind;
  s->p = p;
  s->m = m;
  s->v = v;
  s->n_actions = calloc((size_t)p, sizeof *s->n_actions);
  s->actions = calloc((size_t)p, sizeof *s->actions);
  if (!s->n_actions || !s->actions) {
    st = px_error(PX_ERR_NOMEM, "pipeline schedule: out of memory");
    goto done;
  }
  for (int r = 0; r < p; r++) {
    w[r] = malloc((size_t)per_rank * sizeof **w);
    if (!w[r]) {
      st = px_error(PX_ERR_NOMEM, "pipeline schedule: out of memory");
      goto done;
    }
    if (kind == PX_PP_GPIPE) order_gpipe(p, m, r, w[r]);
    else if (kind == PX_PP_1F1B) order_1f1b(p, m, r, w[r]);
    else order_interleaved(p, m, v, r, w[r]);
  }
  if ((st = make_tables(s, w, per_rank)) != PX_OK) goto done;
  /* The contract: nothing leaves here unchecked. */
  if ((st = px_pp_schedule_check(s)) != PX_OK)
    st = px_error_wrap(PX_ERR_INTERNAL, "pipeline schedule %s (p %d, m %d, v %d) failed its own check", name, p, m, v);
done:
  for (int r = 0; r < p; r++) free(w[r]);
  free(w);
  if (st != PX_OK) {
    px_pp_schedule_free(s);
    return st;
  }
  *out = s;
  return PX_OK;
}
