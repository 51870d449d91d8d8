// The threads backend's queue of started operations and its progress
// thread; blocking operations run on the caller's thread when the queue is
// empty (threads.c's opening comment, "Asynchronous operations").
#define _POSIX_C_SOURCE 200809L
#include "comm/threads.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Queue and progress thread ----------------------------------------------------- */

/* Under j->mu: ends the hold of tc's queue; `wake`: and tells its progress
 * thread to run it. */
static void release_locked(tcomm *tc, bool wake) {
  if (!atomic_load(&tc->held)) return;
  atomic_store(&tc->held, false);
  atomic_fetch_sub(&tc->job->held, 1);
  if (wake) pthread_cond_signal(&tc->qcv);
}

void pxt_release_held_locked(tjob *j) {
  if (atomic_load(&j->held) == 0) return;
  for (tcomm *tc = j->comms; tc; tc = tc->jnext) release_locked(tc, true);
}

void pxt_job_add_comm(tcomm *tc) {
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  tc->jnext = j->comms;
  j->comms = tc;
  pthread_mutex_unlock(&j->mu);
}

void pxt_job_remove_comm_locked(tcomm *tc) {
  release_locked(tc, false);
  for (tcomm **p = &tc->job->comms; *p; p = &(*p)->jnext)
    if (*p == tc) {
      *p = tc->jnext;
      break;
    }
}

/* Whether an operation this rank queues now should wait for the rank
 * rather than wake the progress thread: when the world's ranks, each with
 * its share of OpenMP threads, already fill the cores, the progress
 * thread can only run by taking a core from a rank's compute, and waking
 * it, its spins and its hand-backs cost more than the operation (2-rank
 * DDP of the MLP on 2 cores: docs/PERFORMANCE.md, "Figures behind code
 * comments").  The rank runs its held operations in its own waits, where
 * its peers meet it. */
static bool hold_for_rank(const tjob *j) {
  switch (j->progress) {
  case PROGRESS_THREAD: return false;
  case PROGRESS_WAIT: return true;
  case PROGRESS_AUTO: break;
  }
  return j->cores > 0 && (long)j->nranks * omp_get_max_threads() >= j->cores;
}

/* Under j->mu: if no thread is running this communicator's oldest queued
 * operation, runs it on this thread (releasing the mutex meanwhile) and
 * returns true.  One runner at a time keeps the queue's order.  Both the
 * progress thread and a rank waiting for a queued operation call this, so
 * a wait never idles while the operations ahead of it (and its own) sit
 * in the queue for the progress thread to wake up. */
static bool run_head_locked(tcomm *tc) {
  tjob *j = tc->job;
  if (tc->running || !tc->head) return false;
  top *op = tc->head;
  tc->running = true;
  pthread_mutex_unlock(&j->mu);
  pxt_execute(op);
  pthread_mutex_lock(&j->mu);
  tc->head = op->next;
  if (!tc->head) {
    tc->tail = NULL;
    release_locked(tc, false);  // nothing left to hold
  }
  tc->running = false;
  atomic_store(&op->done, true);  // op may be freed by its waiter from here on
  pthread_cond_broadcast(&j->cv);
  // The progress thread may have gone to sleep while this thread ran.
  if ((tc->head && !atomic_load(&tc->held)) || tc->stop) pthread_cond_signal(&tc->qcv);
  return true;
}

static void *progress_main(void *arg) {
  tcomm *tc = arg;
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  for (;;) {
    // A communicator being freed runs what is left, held or not.
    if (tc->stop) release_locked(tc, false);
    if (!atomic_load(&tc->held) && run_head_locked(tc)) continue;
    if (tc->stop && !tc->head) break;
    pthread_cond_wait(&tc->qcv, &j->mu);
  }
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

/* Waits for a queued collective: runs the queue's operations up to it on
 * this thread when no one else is running them, else waits for the
 * progress thread (spin, then block). */
void pxt_wait_queued(top *op) {
  tcomm *tc = op->tc;
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  while (!atomic_load(&op->done) && run_head_locked(tc)) {}
  // The progress thread is running the head: it must not stop at a hold
  // before it reaches op.
  if (!atomic_load(&op->done)) release_locked(tc, true);
  pthread_mutex_unlock(&j->mu);
  pxt_wait_flag(j, &op->done);
}

/* Under j->mu. */
static px_status enqueue_locked(tcomm *tc, top *op) {
  tjob *j = tc->job;
  if (!tc->started) {
    if (pthread_create(&tc->thread, NULL, progress_main, tc) != 0)
      return px_error(PX_ERR_INTERNAL, "%s: could not start the progress thread of rank %d", pxt_kind_name(op->kind),
                      tc->world_rank);
    tc->started = true;
  }
  op->next = NULL;
  if (tc->tail) tc->tail->next = op;
  else tc->head = op;
  tc->tail = op;
  if (hold_for_rank(j)) {
    clock_gettime(CLOCK_MONOTONIC, &op->queued_at);
    if (!atomic_load(&tc->held)) {
      atomic_store(&tc->held, true);
      atomic_fetch_add(&j->held, 1);
    }
  } else {
    release_locked(tc, false);  // the operations before it go too
    pthread_cond_signal(&tc->qcv);
  }
  return PX_OK;
}

void pxt_op_init(top *op, px_comm *c, tkind kind) {
  memset(op, 0, sizeof *op);
  op->base.ops = &px_comm_threads_ops;
  op->tc = c->impl;
  op->kind = kind;
  op->timeout = c->timeout;
  // Copied now: the caller may relabel before a queued operation runs.
  memcpy(op->label, c->label, sizeof op->label);
}

void pxt_test_queued(top *op) {
  tcomm *tc = op->tc;
  tjob *j = tc->job;
  if (!atomic_load(&tc->held)) return;
  pthread_mutex_lock(&j->mu);
  if (atomic_load(&tc->held) && tc->head) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const struct timespec *t = &tc->head->queued_at;
    long long ns = (long long)(now.tv_sec - t->tv_sec) * 1000000000LL + (now.tv_nsec - t->tv_nsec);
    if (ns >= HOLD_TEST_NS) release_locked(tc, true);
  }
  pthread_mutex_unlock(&j->mu);
}

/* A blocking collective: inline when nothing is queued on this
 * communicator, else behind the queued ones. */
px_status pxt_run_blocking(top *op) {
  tcomm *tc = op->tc;
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  bool idle = tc->head == NULL;
  if (!idle) {
    px_status st = enqueue_locked(tc, op);
    pthread_mutex_unlock(&j->mu);
    if (st) return st;
    pxt_wait_queued(op);
  } else {
    pthread_mutex_unlock(&j->mu);
    pxt_execute(op);
  }
  if (op->status) px_error(op->status, "%s", op->msg);
  return op->status;
}

px_status pxt_start_async(const top *proto, px_request **req) {
  top *op = malloc(sizeof *op);
  if (!op) return px_error(PX_ERR_NOMEM, "%s: out of memory for a request", pxt_kind_name(proto->kind));
  *op = *proto;
  tjob *j = op->tc->job;
  pthread_mutex_lock(&j->mu);
  px_status st = enqueue_locked(op->tc, op);
  pthread_mutex_unlock(&j->mu);
  if (st) {
    free(op);
    return st;
  }
  *req = &op->base;
  return PX_OK;
}
