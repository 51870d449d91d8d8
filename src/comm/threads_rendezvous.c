// The threads backend's rendezvous: numbered arrivals in per-rank slots,
// the posts every rank compares, splits' new groups, and waiting for
// peers under the watchdog (threads.c's opening comment, "Rendezvous").
#define _POSIX_C_SOURCE 200809L
#include "comm/threads.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Rendezvous ---------------------------------------------------------------- */

static void describe(char *out, size_t n, const tpost *p) {
  switch (p->kind) {
  case K_ALLREDUCE:
  case K_REDUCE_SCATTER:
    snprintf(out, n, "%s (count %zu, %s, %s)", pxt_kind_name(p->kind), p->count, px_dtype_name(p->dtype),
             px_comm_op_name(p->op));
    break;
  case K_BROADCAST:
    snprintf(out, n, "%s (count %zu, %s, root %d)", pxt_kind_name(p->kind), p->count, px_dtype_name(p->dtype), p->root);
    break;
  case K_ALLGATHER:
    snprintf(out, n, "%s (count %zu, %s)", pxt_kind_name(p->kind), p->count, px_dtype_name(p->dtype));
    break;
  default: snprintf(out, n, "%s", pxt_kind_name(p->kind));
  }
}

static bool same_call(const tpost *a, const tpost *b) {
  if (a->kind != b->kind) return false;
  switch (a->kind) {
  case K_ALLREDUCE:
  case K_REDUCE_SCATTER: return a->count == b->count && a->dtype == b->dtype && a->op == b->op;
  case K_BROADCAST:
    return a->count * px_dtype_size(a->dtype) == b->count * px_dtype_size(b->dtype) && a->root == b->root;
  case K_ALLGATHER: return a->count * px_dtype_size(a->dtype) == b->count * px_dtype_size(b->dtype);
  default: return true;
  }
}

/* After the first rendezvous of a collective, on every rank: all posts are
 * in, and every rank compares the same posts, so all see a mismatch (and
 * the same first one).  A mismatch would make ranks read past each other's
 * buffers, so it ends the job.  False: the job failed. */
static bool check_calls(tcomm *tc) {
  tgroup *g = tc->g;
  const tpost *post = g->post[tc->ncoll & 1];
  for (int r = 1; r < g->size; r++) {
    if (same_call(&post[0], &post[r])) continue;
    char a[160], b[160], msg[MSG_MAX];
    describe(a, sizeof a, &post[0]);
    describe(b, sizeof b, &post[r]);
    snprintf(msg, sizeof msg,
             "collective mismatch: rank %d called %s but rank %d called %s; every rank must call the "
             "same collectives in the same order",
             g->world_rank[0], a, g->world_rank[r], b);
    pthread_mutex_lock(&g->job->mu);
    if (!g->job->failed) {
      fprintf(stderr, "plexus: %s\n", msg);
      pxt_job_fail_locked(g->job, PX_ERR_COMM, msg);
    }
    pthread_mutex_unlock(&g->job->mu);
    return false;
  }
  return true;
}

/* Under j->mu, by group rank 0 after the first rendezvous of a split (number
 * k): builds one group per color, members ordered by (key, old rank), and
 * publishes each rank's new group and rank in g->split_*, marked with k so
 * that no rank mistakes an older split's result for this one's. */
void pxt_build_split_locked(tgroup *g, const tpost *post, uint64_t k) {
  tjob *j = g->job;
  int n = g->size;
  int *members = malloc((size_t)n * sizeof *members);
  bool *done = calloc((size_t)n, sizeof *done);
  g->split_seq = k;
  for (int r = 0; r < n; r++) {
    g->split_group[r] = NULL;
    g->split_rank[r] = -1;
  }
  if (!members || !done) goto nomem;
  for (int first = 0; first < n; first++) {
    if (done[first] || post[first].color < 0) continue;
    int color = post[first].color, m = 0;
    for (int r = first; r < n; r++) {
      if (done[r] || post[r].color != color) continue;
      done[r] = true;
      // Insertion sort by (key, old rank); old ranks arrive increasing.
      int at = m++;
      while (at > 0 && post[members[at - 1]].key > post[r].key) {
        members[at] = members[at - 1];
        at--;
      }
      members[at] = r;
    }
    tgroup *sub = pxt_group_new_locked(j, m);
    if (!sub) goto nomem;
    sub->is_world = false;
    for (int q = 0; q < m; q++) {
      sub->world_rank[q] = g->world_rank[members[q]];
      g->split_group[members[q]] = sub;
      g->split_rank[members[q]] = q;
    }
  }
  free(members);
  free(done);
  return;
nomem:
  free(members);
  free(done);
  // Groups already built are published; each member frees its share
  // after seeing the failure.
  fprintf(stderr, "plexus: split: out of memory building sub-groups\n");
  pxt_job_fail_locked(j, PX_ERR_NOMEM, "split: out of memory building sub-groups");
}

/* True once every rank of g has reached rendezvous k; *from is the first
 * rank not seen there yet (ranks before it need no second look). */
static bool all_reached(const tgroup *g, uint64_t k, int *from) {
  for (int r = *from; r < g->size; r++)
    if (atomic_load_explicit(&g->slot[r].seq, memory_order_acquire) < k) {
      *from = r;
      return false;
    }
  *from = g->size;
  return true;
}

/* Under j->mu: missing[r] = group rank r has not reached rendezvous k. */
static void list_missing_locked(tcomm *tc, uint64_t k) {
  for (int r = 0; r < tc->g->size; r++) tc->missing[r] = atomic_load(&tc->g->slot[r].seq) < k;
}

/* The blocking half of a rendezvous wait, after the spin: sleeps on the
 * job's condition variable under the watchdog.  True once all reached k;
 * false when the job failed (*fired: this rank's watchdog or gone-rank
 * verdict failed it, and op holds the message). */
static bool block_until_reached(top *op, const deadline *d, uint64_t k, bool *fired) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tjob *j = tc->job;
  bool ok = false;
  pthread_mutex_lock(&j->mu);
  atomic_fetch_add(&j->sleepers, 1);
  for (;;) {
    // Orders the count above (and each wake-up) before the loads of the
    // slots, which are only acquire: with the publisher's seq_cst store and
    // load of `sleepers`, one of the two sees the other.
    atomic_thread_fence(memory_order_seq_cst);
    int from = 0;
    if (all_reached(g, k, &from)) {
      ok = true;
      break;
    }
    if (j->failed) break;
    list_missing_locked(tc, k);
    int gone = pxt_gone_rank_locked(tc, tc->missing);
    if (gone >= 0) {
      pxt_gone_locked(op, gone);
      *fired = true;
      break;
    }
    if (pxt_job_wait(j, d) == ETIMEDOUT) {
      from = 0;
      if (all_reached(g, k, &from)) {
        ok = true;
        break;
      }
      if (!j->failed) {
        list_missing_locked(tc, k);
        pxt_watchdog_locked(op, tc->missing);
        *fired = true;
      }
      break;
    }
  }
  atomic_fetch_sub(&j->sleepers, 1);
  pthread_mutex_unlock(&j->mu);
  return ok;
}

/* Waits (spin, then block) until no rank of g is in a data phase. */
static void wait_not_busy(tjob *j, tgroup *g) {
  spinner sp = {0};
  int r = 0;
  do {
    // seq_cst: the other half of the Dekker pair in rendezvous.
    while (r < g->size && !atomic_load(&g->slot[r].busy)) r++;
    if (r == g->size) return;
  } while (pxt_spin_more(j, &sp));
  pthread_mutex_lock(&j->mu);
  atomic_fetch_add(&j->sleepers, 1);
  for (r = 0; r < g->size; r++)
    while (atomic_load(&g->slot[r].busy)) pthread_cond_wait(&j->cv, &j->mu);
  atomic_fetch_sub(&j->sleepers, 1);
  pthread_mutex_unlock(&j->mu);
}

/* Waits until every rank of the group has arrived.  `post` (at the first
 * rendezvous of an operation) is what this rank brings; `enter_data` says
 * the rank will read peers' buffers before its next rendezvous.
 *
 * Rendezvous are numbered per rank and group (tc->seq); arriving at number
 * k is one seq_cst store of k into the rank's own slot, and the wait polls
 * the others' slots until each holds >= k: no lock, no shared counter that
 * all ranks write.  Posts are written before that store, so a rank that
 * sees k in a peer's slot sees its post.  Posts alternate between two
 * arrays by the parity of the collective: a rank may start collective m+1
 * (and post) while a peer still reads collective m's posts, but not m+2,
 * which needs that peer at m+1's first rendezvous. */
px_status pxt_rendezvous(top *op, const deadline *d, const tpost *post, bool enter_data) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tjob *j = tc->job;
  tslot *mine = &g->slot[tc->rank];
  bool fired = false;
  uint64_t k = ++tc->seq;
  // Done reading peers' buffers: a failing peer waits for this (and may
  // then return and free them); the wake below covers it.
  bool was_busy = atomic_load_explicit(&mine->busy, memory_order_relaxed);
  if (was_busy) atomic_store(&mine->busy, false);
  if (atomic_load(&j->failed)) {
    if (was_busy) pxt_wake(j);
    goto failed;
  }
  if (post) g->post[tc->ncoll & 1][tc->rank] = *post;
  atomic_store(&mine->seq, k);
  pxt_wake(j);
  spinner sp = {0};
  for (int from = 0; !all_reached(g, k, &from);) {
    if (atomic_load_explicit(&j->failed, memory_order_relaxed)) goto failed;
    if (!pxt_spin_more(j, &sp)) {
      if (!block_until_reached(op, d, k, &fired)) goto failed;
      break;
    }
  }
  if (post && !check_calls(tc)) goto failed;
  // Everyone is past the previous collective, and none can claim in the
  // next before rank 0 arrives there: its counter is free to zero.
  if (post && tc->rank == 0) atomic_store_explicit(&g->claim[(tc->ncoll + 1) & 1], 0, memory_order_relaxed);
  if (enter_data) {
    // Dekker with a failing peer (it stores `failed`, then reads `busy`):
    // either it waits for this data phase, or this rank sees the failure.
    atomic_store(&mine->busy, true);
    if (atomic_load(&j->failed)) {
      atomic_store(&mine->busy, false);
      pxt_wake(j);
      goto failed;
    }
  }
  return PX_OK;

failed:
  // A peer may still be reading this rank's buffers: let it finish first.
  (void)atomic_load(&j->failed);  // seq_cst, ordered before the loads of `busy`
  wait_not_busy(j, g);
  if (!fired) {
    pthread_mutex_lock(&j->mu);
    pxt_op_fail_from_job(op);
    pthread_mutex_unlock(&j->mu);
  }
  return op->status;
}
