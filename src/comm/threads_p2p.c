// Point-to-point for the threads backend: eager and never queued.  A send
// copies the message into the receiver's posted buffer or, if no receive
// is posted yet, into the receiver's inbox, and returns; so a send never
// waits for its receive, and every rank may send before it receives.
// Receives match by (source, tag), oldest message first (MPI's
// non-overtaking rule).  Large copies happen outside the job mutex.
//
// A large message (EAGER_WAIT_BYTES and up) with no receive posted yet
// first waits, for one spin budget, for a receive to be posted: copying
// straight into the receive buffer is one copy, where buffering is an
// allocation (page faults, for a large one) and two copies.  A ping-pong
// often sends just before its peer posts.  The wait is bounded, so a send
// still never waits for its receive for long.
//
// A posted receive waits for its `done` flag: spin, then block.
#define _POSIX_C_SOURCE 200809L
#include "comm/threads.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EAGER_WAIT_BYTES (64u << 10)

static px_status truncation(top *r, size_t got) {
  char msg[MSG_MAX];
  snprintf(msg, sizeof msg, "recv: the message from rank %d with tag %d has %zu bytes but the receive buffer holds %zu",
           r->peer, r->tag, got, r->count * px_dtype_size(r->dtype));
  pxt_op_set_error(r, PX_ERR_INVALID, msg);
  return PX_ERR_INVALID;
}

/* Under j->mu: unlinks and returns the oldest receive posted at `dst` for
 * (src, tag), or NULL.  Oldest first keeps MPI's non-overtaking order. */
static top *take_posted_locked(tgroup *g, int dst, int src, int tag) {
  for (top **pp = &g->posted[dst]; *pp; pp = &(*pp)->next) {
    top *r = *pp;
    if (r->peer != src || r->tag != tag) continue;
    *pp = r->next;
    r->posted = false;  // its waiter now waits for `done`, whatever the clock says
    return r;
  }
  return NULL;
}

/* Eager send: into the posted receive, else into the receiver's inbox.
 * Large copies happen outside the job mutex. */
static px_status t_deliver(top *op) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tjob *j = tc->job;
  size_t bytes = op->count * px_dtype_size(op->dtype);
  tmsg *m = NULL;
  bool waited = bytes < EAGER_WAIT_BYTES;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    if (j->failed) {
      pxt_op_fail_from_job(op);
      pthread_mutex_unlock(&j->mu);
      free(m);
      return px_error(op->status, "%s", op->msg);
    }
    top *r = take_posted_locked(g, op->peer, tc->rank, op->tag);
    if (r) {
      pthread_mutex_unlock(&j->mu);
      size_t room = r->count * px_dtype_size(r->dtype);
      if (bytes > room) truncation(r, bytes);
      else if (bytes) memcpy(r->recv, m ? (const void *)m->data : op->send, bytes);
      free(m);
      // Last touch of r: its waiter may free it once it sees this.
      atomic_store(&r->done, true);
      pxt_wake(j);
      return PX_OK;
    }
    if (m) {
      tmsg **tail = &g->inbox[op->peer];
      while (*tail) tail = &(*tail)->next;
      *tail = m;
      pthread_cond_broadcast(&j->cv);
      pthread_mutex_unlock(&j->mu);
      return PX_OK;
    }
    if (!waited) {
      // Large: give the receiver a moment to post (see the top).
      unsigned was = atomic_load(&g->nposted[op->peer]);
      pthread_mutex_unlock(&j->mu);
      waited = true;
      if (pxt_spin_change(j, &g->nposted[op->peer], was)) continue;
      // None came: buffer (one posted meanwhile is found below).
    } else {
      pthread_mutex_unlock(&j->mu);
    }
    // No receive yet: copy the message, then look again (one may have been
    // posted meanwhile, and it would not look in the inbox).
    m = malloc(sizeof *m + bytes);
    if (!m) return px_error(PX_ERR_NOMEM, "send: out of memory buffering %zu bytes for rank %d", bytes, op->peer);
    m->src = tc->rank;
    m->tag = op->tag;
    m->bytes = bytes;
    m->next = NULL;
    if (bytes) memcpy(m->data, op->send, bytes);
  }
}

/* Matches an arrived message or posts the receive.  `op` must outlive the
 * posting (until done). */
static px_status t_post_recv(top *op) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  if (j->failed) {
    pxt_op_fail_from_job(op);
    op->done = true;
    pthread_mutex_unlock(&j->mu);
    return op->status;
  }
  for (tmsg **pp = &g->inbox[tc->rank]; *pp; pp = &(*pp)->next) {
    tmsg *m = *pp;
    if (m->src != op->peer || m->tag != op->tag) continue;
    *pp = m->next;
    pthread_mutex_unlock(&j->mu);
    size_t room = op->count * px_dtype_size(op->dtype);
    if (m->bytes > room) truncation(op, m->bytes);
    else if (m->bytes) memcpy(op->recv, m->data, m->bytes);
    free(m);
    atomic_store(&op->done, true);  // nobody else knows this op yet
    return op->status;
  }
  op->posted = true;
  op->next = NULL;
  top **tail = &g->posted[tc->rank];
  while (*tail) tail = &(*tail)->next;
  *tail = op;
  atomic_fetch_add(&g->nposted[tc->rank], 1);
  pthread_mutex_unlock(&j->mu);
  return PX_OK;
}

/* Under j->mu: a receive given up by its waiter leaves the posted list. */
static void unlink_posted_locked(tgroup *g, int dst, top *op) {
  for (top **pp = &g->posted[dst]; *pp; pp = &(*pp)->next)
    if (*pp == op) {
      *pp = op->next;
      op->posted = false;
      return;
    }
}

/* Waits for a posted receive under the watchdog: spins for the job's
 * budget (a ping-pong's reply usually arrives within it), then blocks. */
void pxt_wait_recv(top *op) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tjob *j = tc->job;
  if (pxt_spin_flag(j, &op->done)) return;
  deadline d = pxt_deadline_in(op->timeout);
  pthread_mutex_lock(&j->mu);
  // Counted before the first look at `done`: the sender stores it, then
  // wakes us only if it sees a sleeper (pxt_wake).
  atomic_fetch_add(&j->sleepers, 1);
  while (!op->done) {
    // Once a sender has taken it (posted == false) it completes shortly.
    if (op->posted && j->failed) {
      unlink_posted_locked(g, tc->rank, op);
      pxt_op_fail_from_job(op);
      break;
    }
    // Its sender returned: whatever it sent was delivered when sent.
    if (op->posted && j->finished && j->finished[g->world_rank[op->peer]]) {
      unlink_posted_locked(g, tc->rank, op);
      pxt_gone_locked(op, op->peer);
      break;
    }
    if (pxt_job_wait(j, op->posted ? &d : NULL) == ETIMEDOUT && !op->done && op->posted && !j->failed) {
      bool *missing = calloc((size_t)g->size, sizeof *missing);
      if (missing) {
        missing[op->peer] = true;
        pxt_watchdog_locked(op, missing);
      } else {
        pxt_job_fail_locked(j, PX_ERR_TIMEOUT, "watchdog fired (out of memory listing the ranks)");
        pxt_op_fail_from_job(op);
      }
      free(missing);
      unlink_posted_locked(g, tc->rank, op);
      break;
    }
  }
  atomic_fetch_sub(&j->sleepers, 1);
  atomic_store(&op->done, true);
  pthread_mutex_unlock(&j->mu);
}

px_status pxt_send(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag) {
  top o;
  pxt_op_init(&o, c, K_SEND);
  o.send = buf;
  o.count = count;
  o.dtype = dtype;
  o.peer = dst;
  o.tag = tag;
  return t_deliver(&o);
}

px_status pxt_recv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag) {
  top o;
  pxt_op_init(&o, c, K_RECV);
  o.recv = buf;
  o.count = count;
  o.dtype = dtype;
  o.peer = src;
  o.tag = tag;
  // Once posted, `done` belongs to the sender and the mutex: pxt_wait_recv
  // reads it under the lock (and returns at once if it matched already).
  if (t_post_recv(&o) == PX_OK) pxt_wait_recv(&o);
  if (o.status) px_error(o.status, "%s", o.msg);
  return o.status;
}

px_status pxt_isend(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag, px_request **req) {
  top *o = malloc(sizeof *o);
  if (!o) return px_error(PX_ERR_NOMEM, "isend: out of memory for a request");
  pxt_op_init(o, c, K_SEND);
  o->send = buf;
  o->count = count;
  o->dtype = dtype;
  o->peer = dst;
  o->tag = tag;
  // Eager: the data is copied out now, so the request is already complete.
  px_status st = t_deliver(o);
  if (st) {
    free(o);
    return st;
  }
  atomic_store(&o->done, true);
  *req = &o->base;
  return PX_OK;
}

px_status pxt_irecv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag, px_request **req) {
  top *o = malloc(sizeof *o);
  if (!o) return px_error(PX_ERR_NOMEM, "irecv: out of memory for a request");
  pxt_op_init(o, c, K_RECV);
  o->recv = buf;
  o->count = count;
  o->dtype = dtype;
  o->peer = src;
  o->tag = tag;
  px_status st = t_post_recv(o);
  if (st) {
    px_error(st, "%s", o->msg);
    free(o);
    return st;
  }
  *req = &o->base;
  return PX_OK;
}
