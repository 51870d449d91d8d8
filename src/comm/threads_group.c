// The threads backend's jobs, groups (one communicator as all its ranks
// see it) and each rank's tcomm: creation and reference counting
// (threads.c's opening comment, "Objects").
#define _POSIX_C_SOURCE 200809L
#include "comm/threads.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Groups and jobs --------------------------------------------------------- */

tjob *pxt_job_new(void) {
  tjob *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  // Deadlines are monotonic: a clock step must not fire or starve the watchdog.
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&j->sleepers, 0);
  atomic_init(&j->failed, false);
  atomic_init(&j->held, 0);
  j->refs = 1;
  return j;
}

void pxt_job_unref(tjob *j) {
  pthread_mutex_lock(&j->mu);
  bool last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pthread_cond_destroy(&j->cv);
  pthread_mutex_destroy(&j->mu);
  free(j->finished);
  free(j);
}

void pxt_group_free(tgroup *g) {
  if (!g) return;
  if (g->inbox)
    for (int r = 0; r < g->size; r++)
      while (g->inbox[r]) {
        tmsg *m = g->inbox[r];
        g->inbox[r] = m->next;
        free(m);
      }
  free(g->world_rank);
  free(g->slot);
  free(g->claim);
  free(g->post[0]);
  free(g->post[1]);
  free(g->split_group);
  free(g->split_rank);
  free(g->inbox);
  free(g->posted);
  free(g->nposted);
  free(g);
}

/* Under j->mu (or before any thread runs): a group of `size` members, each
 * of whose tcomms will hold one reference; the group holds one on the job. */
tgroup *pxt_group_new_locked(tjob *j, int size) {
  tgroup *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->job = j;
  g->size = size;
  g->refs = size;
  size_t n = (size_t)size;
  g->world_rank = calloc(n, sizeof *g->world_rank);
  // Whole cache lines, so no slot shares one with other data.
  g->slot = aligned_alloc(_Alignof(tslot), n * sizeof *g->slot);
  g->claim = aligned_alloc(64, 64);
  g->post[0] = calloc(n, sizeof *g->post[0]);
  g->post[1] = calloc(n, sizeof *g->post[1]);
  g->split_group = calloc(n, sizeof *g->split_group);
  g->split_rank = calloc(n, sizeof *g->split_rank);
  g->inbox = calloc(n, sizeof *g->inbox);
  g->posted = calloc(n, sizeof *g->posted);
  g->nposted = calloc(n, sizeof *g->nposted);
  if (!g->nposted || !g->claim || !g->world_rank || !g->slot || !g->post[0] || !g->post[1] || !g->split_group ||
      !g->split_rank || !g->inbox || !g->posted) {
    pxt_group_free(g);
    return NULL;
  }
  for (size_t r = 0; r < n; r++) {
    atomic_init(&g->slot[r].seq, 0);
    atomic_init(&g->slot[r].busy, false);
    atomic_init(&g->nposted[r], 0);
  }
  atomic_init(&g->claim[0], 0);
  atomic_init(&g->claim[1], 0);
  j->refs++;
  return g;
}

/* Drops one member's reference; the last one frees the group. */
void pxt_group_unref(tgroup *g) {
  tjob *j = g->job;
  pthread_mutex_lock(&j->mu);
  bool last = --g->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pxt_group_free(g);
  pxt_job_unref(j);
}

/* A rank's px_comm on group g; takes over one of g's member references. */
px_comm *pxt_tcomm_new(tjob *j, tgroup *g, int rank, double timeout) {
  px_comm *c = px_comm_alloc(&px_comm_threads_ops, PX_COMM_THREADS, rank, g->size);
  tcomm *tc = calloc(1, sizeof *tc);
  const void **srcs = malloc((size_t)g->size * sizeof *srcs);
  const void **blk = malloc((size_t)g->size * sizeof *blk);
  bool *missing = malloc((size_t)g->size * sizeof *missing);
  void *small = malloc(SMALL_BYTES);
  if (!c || !tc || !srcs || !blk || !missing || !small) {
    free(c);
    free(tc);
    free(srcs);
    free(blk);
    free(missing);
    free(small);
    return NULL;
  }
  tc->small = small;
  tc->missing = missing;
  tc->c = c;
  tc->job = j;
  tc->g = g;
  tc->rank = rank;
  tc->world_rank = g->world_rank[rank];
  tc->srcs = srcs;
  tc->blk = blk;
  pthread_cond_init(&tc->qcv, NULL);
  atomic_init(&tc->held, false);
  c->impl = tc;
  c->timeout = timeout;
  pxt_job_add_comm(tc);
  return c;
}

void pxt_tcomm_free(px_comm *c) {
  tcomm *tc = c->impl;
  tjob *j = tc->job;
  tgroup *g = tc->g;
  pthread_mutex_lock(&j->mu);
  tc->stop = true;
  pthread_cond_signal(&tc->qcv);
  bool started = tc->started;
  pthread_mutex_unlock(&j->mu);
  // The progress thread finishes what was started (each under its
  // watchdog), so no peer waits for an operation this rank dropped.
  if (started) pthread_join(tc->thread, NULL);
  pthread_mutex_lock(&j->mu);
  // Receives never waited for: complete them with an error so their
  // requests can still be waited and freed.
  while (g->posted[tc->rank]) {
    top *r = g->posted[tc->rank];
    g->posted[tc->rank] = r->next;
    r->posted = false;
    pxt_op_set_error(r, PX_ERR_COMM, "recv: the communicator was freed before the message arrived");
    atomic_store(&r->done, true);
  }
  pxt_job_remove_comm_locked(tc);
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  pthread_cond_destroy(&tc->qcv);
  free(tc->srcs);
  free(tc->blk);
  free(tc->missing);
  free(tc->small);
  free(tc);
  free(c);
  pxt_group_unref(g);
}
