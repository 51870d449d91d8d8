// The threads backend's collectives, run after the first rendezvous on the
// ranks' own buffers: the three all-reduce paths, broadcast, all-gather,
// reduce-scatter and split (threads.c's opening comment, "Collectives").
#define _POSIX_C_SOURCE 200809L
#include "comm/threads.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Elements per claimed chunk of a large all-reduce: about 4N chunks for
 * a medium buffer, 64 KiB each for a large one (a claim is one atomic add;
 * more chunks balance better when a rank is slowed by other load), in
 * whole 64-byte lines so that two chunks share no line of a buffer that
 * is 64-byte aligned. */
#ifndef CHUNK_MAX_BYTES
#define CHUNK_MAX_BYTES (64u << 10)
#endif
static size_t chunk_elems(size_t count, size_t es, int n) {
  size_t bytes = count * es / (4 * (size_t)n);
  if (bytes > CHUNK_MAX_BYTES) bytes = CHUNK_MAX_BYTES;
  if (bytes < (4u << 10)) bytes = 4u << 10;
  bytes = bytes / 64 * 64;
  return bytes / es > 0 ? bytes / es : 1;
}

/* ---- Executing collectives ------------------------------------------------------- */

static px_status run_allreduce(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  int n = g->size;
  size_t es = px_dtype_size(op->dtype), bytes = op->count * es;
  tpost p = {.kind = K_ALLREDUCE, .recv = op->recv, .count = op->count, .dtype = op->dtype, .op = op->op};
  px_status st = pxt_rendezvous(op, d, &p, true);
  if (st) return st;
  const tpost *post = g->post[tc->ncoll & 1];
  for (int k = 0; k < n; k++) tc->srcs[k] = post[k].recv;
  if (bytes <= SMALL_BYTES) {
    // Small: every rank reduces the whole buffer itself, in rank order, so
    // the bits are those of the split path below with one rendezvous fewer
    // (the reduction is cheaper than a round trip between cores).
    pxt_reduce(tc->small, tc->srcs, n, op->count, op->dtype, op->op);
    if ((st = pxt_rendezvous(op, d, NULL, false))) return st;
    if (bytes) memcpy(op->recv, tc->small, bytes);
    return PX_OK;
  }
  // Large: ranks claim chunks from a shared counter; the claimer reduces
  // the chunk of all N buffers (in rank order) and writes the result into
  // all N, so each element is computed once (the same bits whoever claims
  // it), every buffer is read once and written once, and a rank slowed by
  // other load simply claims fewer chunks.  Only the claimer touches a
  // chunk, so no rank reads what another writes before the next rendezvous.
  // Every buffer read once and written once is the copy bound's traffic
  // exactly (threads.c), at every size: the reduce-scatter + all-gather
  // split it replaced above 32 MiB moved 1.25x that at 2 ranks (0.8 of the
  // bound at best), and measured slower at 64-256 MiB (docs/PERFORMANCE.md,
  // "Figures behind code comments").
  atomic_size_t *claim = &g->claim[tc->ncoll & 1];
  size_t chunk = chunk_elems(op->count, es, n), nchunks = (op->count + chunk - 1) / chunk;
  for (;;) {
    size_t c = atomic_fetch_add_explicit(claim, 1, memory_order_relaxed);
    if (c >= nchunks) break;
    size_t lo = c * chunk, m = op->count - lo < chunk ? op->count - lo : chunk;
    for (int k = 0; k < n; k++) tc->srcs[k] = (char *)post[k].recv + lo * es;
    pxt_reduce_to_all((void *const *)tc->srcs, tc->blk, n, m, op->dtype, op->op);
  }
  return pxt_rendezvous(op, d, NULL, false);
}

static px_status run_broadcast(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tpost p = {.kind = K_BROADCAST, .recv = op->recv, .count = op->count, .dtype = op->dtype, .root = op->root};
  px_status st = pxt_rendezvous(op, d, &p, true);
  if (st) return st;
  size_t bytes = op->count * px_dtype_size(op->dtype);
  const tpost *post = tc->g->post[tc->ncoll & 1];
  if (tc->rank != op->root && bytes) memcpy(op->recv, post[op->root].recv, bytes);
  return pxt_rendezvous(op, d, NULL, false);
}

/* Claimed pieces of the N blocks of an all-gather or reduce-scatter
 * (`count` elements each), as in the large all-reduce: a claim is one
 * atomic add, and a rank slowed by other load claims fewer.  False when
 * all are taken; else block *q, elements [*lo, *lo + *m). */
typedef struct claims {
  atomic_size_t *next;
  size_t count, chunk, per_block, total;
} claims;

static claims claims_of(tcomm *tc, size_t count, size_t es) {
  int n = tc->g->size;
  claims c = {.next = &tc->g->claim[tc->ncoll & 1], .count = count};
  c.chunk = chunk_elems(count * (size_t)n, es, n);
  c.per_block = (count + c.chunk - 1) / c.chunk;
  c.total = c.per_block * (size_t)n;
  return c;
}

static bool claim_next(claims *c, int *q, size_t *lo, size_t *m) {
  size_t k = atomic_fetch_add_explicit(c->next, 1, memory_order_relaxed);
  if (k >= c->total) return false;
  *q = (int)(k / c->per_block);
  *lo = k % c->per_block * c->chunk;
  *m = c->count - *lo < c->chunk ? c->count - *lo : c->chunk;
  return true;
}

static px_status run_allgather(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tpost p = {.kind = K_ALLGATHER, .send = op->send, .recv = op->recv, .count = op->count, .dtype = op->dtype};
  px_status st = pxt_rendezvous(op, d, &p, true);
  if (st) return st;
  // Push: block q (rank q's send) is copied into block q of every rank's
  // recv (but an in-place one, where it already is) by pxt_copy_to_all,
  // which reads it from memory once: N+1 blocks of traffic per block
  // against the 2N of each rank reading all blocks into its own recv (the
  // pull this replaced).  Small: each rank pushes its own block.  Large:
  // pieces of all blocks are claimed, and streamed past the cache when the
  // output is too large to stay there.  Each byte of a recv has one
  // writer; its owner reads it after the next rendezvous.
  // (Peers' dtypes may differ: the bytes agree, so count bytes.)
  int n = g->size;
  size_t bytes = op->count * px_dtype_size(op->dtype);
  const tpost *post = g->post[tc->ncoll & 1];
  if (bytes * (size_t)n <= SMALL_BYTES) {
    for (int k = 0; k < n; k++) tc->srcs[k] = (char *)post[k].recv + (size_t)tc->rank * bytes;
    if (bytes) pxt_copy_to_all((void *const *)tc->srcs, n, op->send, bytes, false);
  } else {
    bool stream = bytes * (size_t)n >= STREAM_BYTES;
    claims c = claims_of(tc, bytes, 1);
    int q;
    size_t lo, m;
    while (claim_next(&c, &q, &lo, &m)) {
      for (int k = 0; k < n; k++) tc->srcs[k] = (char *)post[k].recv + (size_t)q * bytes + lo;
      pxt_copy_to_all((void *const *)tc->srcs, n, (const char *)post[q].send + lo, m, stream);
    }
  }
  return pxt_rendezvous(op, d, NULL, false);
}

static px_status run_reduce_scatter(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tpost p = {.kind = K_REDUCE_SCATTER,
             .send = op->send,
             .recv = op->recv,
             .count = op->count,
             .dtype = op->dtype,
             .op = op->op};
  px_status st = pxt_rendezvous(op, d, &p, true);
  if (st) return st;
  // Block q of the result (rank q's recv) reduces block q of every send,
  // in rank order (pxt_reduce: one pass, the same bits whoever computes
  // it).  Small: each rank reduces its own block.  Large: pieces of all
  // blocks are claimed, each reduced into its owner's recv, streamed when
  // a recv is too large to stay in the cache.
  int n = g->size;
  size_t es = px_dtype_size(op->dtype), bytes = op->count * es;
  const tpost *post = g->post[tc->ncoll & 1];
  if (bytes * (size_t)n <= SMALL_BYTES) {
    for (int k = 0; k < n; k++) tc->srcs[k] = (const char *)post[k].send + bytes * (size_t)tc->rank;
    if (op->count) pxt_reduce(op->recv, tc->srcs, n, op->count, op->dtype, op->op);
  } else {
    bool stream = bytes >= STREAM_BYTES;
    claims c = claims_of(tc, op->count, es);
    int q;
    size_t lo, m;
    while (claim_next(&c, &q, &lo, &m)) {
      for (int k = 0; k < n; k++) tc->srcs[k] = (const char *)post[k].send + (bytes * (size_t)q + lo * es);
      pxt_reduce_as((char *)post[q].recv + lo * es, tc->srcs, n, m, op->dtype, op->op, stream);
    }
  }
  return pxt_rendezvous(op, d, NULL, false);
}

/* Two rendezvous: after the first, group rank 0 builds the sub-groups from
 * the posts (under the job mutex); after the second every rank takes its
 * own.  Every rank reads the result under the mutex, also when failing, so
 * that a group built before the failure is never leaked. */
static px_status run_split(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tjob *j = tc->job;
  tpost p = {.kind = K_SPLIT, .color = op->color, .key = op->key};
  uint64_t first = tc->seq + 1;
  px_status st = pxt_rendezvous(op, d, &p, false);
  if (!st && tc->rank == 0) {
    pthread_mutex_lock(&j->mu);
    if (!j->failed) pxt_build_split_locked(g, g->post[tc->ncoll & 1], first);
    pthread_mutex_unlock(&j->mu);
  }
  if (!st) st = pxt_rendezvous(op, d, NULL, false);
  pthread_mutex_lock(&j->mu);
  bool mine = g->split_seq == first;
  tgroup *sub = mine ? g->split_group[tc->rank] : NULL;
  int new_rank = mine ? g->split_rank[tc->rank] : -1;
  if (!st && !mine && j->failed) {
    // Rank 0 found the job failed before it could build.
    pxt_op_fail_from_job(op);
    st = op->status;
  }
  pthread_mutex_unlock(&j->mu);
  if (st) {
    // The job failed after the groups were built: drop my share of mine.
    if (sub) pxt_group_unref(sub);
    return st;
  }
  if (!sub) return PX_OK;  // negative color: in no group
  op->split_out = pxt_tcomm_new(tc->job, sub, new_rank, op->timeout);
  if (!op->split_out) {
    pxt_group_unref(sub);
    pxt_op_set_error(op, PX_ERR_NOMEM, "split: out of memory for the new communicator");
    pthread_mutex_lock(&tc->job->mu);
    // The other members would wait for this rank forever.
    pxt_job_fail_locked(tc->job, PX_ERR_NOMEM, "split: a rank ran out of memory for its new communicator");
    pthread_mutex_unlock(&tc->job->mu);
    return op->status;
  }
  return PX_OK;
}

void pxt_execute(top *op) {
  deadline d = pxt_deadline_in(op->timeout);
  op->status = PX_OK;
  op->tc->ncoll++;  // every collective, so its posts go to the other array than the last one's
  switch (op->kind) {
  case K_ALLREDUCE: run_allreduce(op, &d); break;
  case K_BROADCAST: run_broadcast(op, &d); break;
  case K_ALLGATHER: run_allgather(op, &d); break;
  case K_REDUCE_SCATTER: run_reduce_scatter(op, &d); break;
  case K_BARRIER: {
    tpost p = {.kind = K_BARRIER};
    pxt_rendezvous(op, &d, &p, false);
  } break;
  case K_SPLIT: run_split(op, &d); break;
  default: break;
  }
}
