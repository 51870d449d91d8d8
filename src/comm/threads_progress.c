// The threads backend's queue of started operations and its progress
// thread; blocking operations run on the caller's thread when the queue is
// empty (threads.c's opening comment, "Asynchronous operations").
#define _POSIX_C_SOURCE 200809L
#include "comm/threads.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Queue and progress thread ----------------------------------------------------- */

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
  if (!tc->head) tc->tail = NULL;
  tc->running = false;
  atomic_store(&op->done, true);  // op may be freed by its waiter from here on
  pthread_cond_broadcast(&j->cv);
  // The progress thread may have gone to sleep while this thread ran.
  if (tc->head || tc->stop) pthread_cond_signal(&tc->qcv);
  return true;
}

static void *progress_main(void *arg) {
  tcomm *tc = arg;
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  for (;;) {
    if (run_head_locked(tc)) continue;
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
  pthread_mutex_unlock(&j->mu);
  pxt_wait_flag(j, &op->done);
}

/* Under j->mu. */
static px_status enqueue_locked(tcomm *tc, top *op) {
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
  pthread_cond_signal(&tc->qcv);
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
