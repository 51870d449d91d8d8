// The self backend: a world of one.  Reductions are the identity (the AVG
// of one value is that value), gathers copy, barriers return at once.
//
// Point-to-point to oneself works through a queue, as MPI's does: a send
// to rank 0 is copied into the queue and a receive takes the oldest
// message with its tag, so a ring exchange written for N ranks also runs
// with one.  A receive with no matching send can never complete in a world
// of one, so it fails with PX_ERR_INVALID instead of waiting forever.
#define _POSIX_C_SOURCE 200809L
#include "comm/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct self_msg {
  int tag;
  size_t bytes;
  struct self_msg *next;
  unsigned char data[];
} self_msg;

typedef struct self_req {
  px_request base;
  px_comm *comm;
  bool done;
  px_status status;
  char msg[256];
  // A posted receive waiting for a later isend.
  void *buf;
  size_t bytes;
  int tag;
  struct self_req *next;
} self_req;

typedef struct self_state {
  self_msg *queue;   // sent, not yet received, oldest first
  self_req *posted;  // irecvs waiting for a send, oldest first
  bool aborted;
  char abort_msg[256];
} self_state;

static self_state *state(px_comm *c) { return c->impl; }

static px_status check_alive(px_comm *c, const char *what) {
  self_state *s = state(c);
  if (s->aborted) return px_error(PX_ERR_COMM, "%s: %s", what, s->abort_msg);
  return PX_OK;
}

static px_status s_allreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op) {
  return check_alive(c, "allreduce");
}

static px_status s_broadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root) {
  return check_alive(c, "broadcast");
}

static px_status s_allgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype) {
  px_status st = check_alive(c, "allgather");
  if (!st && send != recv && count) memmove(recv, send, count * px_dtype_size(dtype));
  return st;
}

static px_status s_reduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                  px_reduce_op op) {
  px_status st = check_alive(c, "reduce_scatter");
  if (!st && send != recv && count) memmove(recv, send, count * px_dtype_size(dtype));
  return st;
}

static px_status s_barrier(px_comm *c) { return check_alive(c, "barrier"); }

static px_status truncated(const char *what, size_t got, size_t room, int tag) {
  return px_error(PX_ERR_INVALID,
                  "%s: the message from rank 0 with tag %d has %zu bytes but the receive buffer holds %zu", what, tag,
                  got, room);
}

static px_status s_send(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag) {
  px_status st = check_alive(c, "send");
  if (st) return st;
  size_t bytes = count * px_dtype_size(dtype);
  self_state *s = state(c);
  // A receive already posted takes the data directly.
  for (self_req **pp = &s->posted; *pp; pp = &(*pp)->next) {
    self_req *r = *pp;
    if (r->tag != tag) continue;
    *pp = r->next;
    r->done = true;
    if (bytes > r->bytes) {
      r->status = truncated("recv", bytes, r->bytes, tag);
      snprintf(r->msg, sizeof r->msg, "%s", px_last_error());
    } else if (bytes) {
      memcpy(r->buf, buf, bytes);
    }
    return PX_OK;
  }
  self_msg *m = malloc(sizeof *m + bytes);
  if (!m) return px_error(PX_ERR_NOMEM, "send: out of memory queueing %zu bytes to rank 0", bytes);
  m->tag = tag;
  m->bytes = bytes;
  m->next = NULL;
  if (bytes) memcpy(m->data, buf, bytes);
  self_msg **tail = &s->queue;
  while (*tail) tail = &(*tail)->next;
  *tail = m;
  return PX_OK;
}

/* Takes the oldest queued message with `tag`; PX_ERR_NOT_FOUND if none. */
static px_status take_message(px_comm *c, void *buf, size_t bytes, int tag, const char *what) {
  self_state *s = state(c);
  for (self_msg **pp = &s->queue; *pp; pp = &(*pp)->next) {
    self_msg *m = *pp;
    if (m->tag != tag) continue;
    *pp = m->next;
    px_status st = PX_OK;
    if (m->bytes > bytes) st = truncated(what, m->bytes, bytes, tag);
    else if (m->bytes) memcpy(buf, m->data, m->bytes);
    free(m);
    return st;
  }
  return PX_ERR_NOT_FOUND;
}

static px_status never(const char *what, int tag) {
  return px_error(PX_ERR_INVALID,
                  "%s: no message with tag %d was sent to rank 0, and in a world of one no other rank "
                  "can send it: the receive would wait forever",
                  what, tag);
}

static px_status s_recv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag) {
  px_status st = check_alive(c, "recv");
  if (st) return st;
  st = take_message(c, buf, count * px_dtype_size(dtype), tag, "recv");
  return st == PX_ERR_NOT_FOUND ? never("recv", tag) : st;
}

static self_req *new_req(px_comm *c) {
  self_req *r = calloc(1, sizeof *r);
  if (r) {
    r->base.ops = &px_comm_self_ops;
    r->comm = c;
  }
  return r;
}

/* Every operation but irecv completes while it starts; the request only
 * carries its status to px_request_wait. */
static px_status done_req(px_comm *c, px_status st, px_request **req) {
  if (st) return st;
  self_req *r = new_req(c);
  if (!r) return px_error(PX_ERR_NOMEM, "out of memory for a request");
  r->done = true;
  *req = &r->base;
  return PX_OK;
}

static px_status s_iallreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op, px_request **req) {
  return done_req(c, s_allreduce(c, buf, count, dtype, op), req);
}

static px_status s_ibroadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root, px_request **req) {
  return done_req(c, s_broadcast(c, buf, count, dtype, root), req);
}

static px_status s_iallgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                              px_request **req) {
  return done_req(c, s_allgather(c, send, recv, count, dtype), req);
}

static px_status s_ireduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                   px_reduce_op op, px_request **req) {
  return done_req(c, s_reduce_scatter(c, send, recv, count, dtype, op), req);
}

static px_status s_isend(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag,
                         px_request **req) {
  return done_req(c, s_send(c, buf, count, dtype, dst, tag), req);
}

static px_status s_irecv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag, px_request **req) {
  px_status st = check_alive(c, "irecv");
  if (st) return st;
  size_t bytes = count * px_dtype_size(dtype);
  st = take_message(c, buf, bytes, tag, "irecv");
  if (st != PX_ERR_NOT_FOUND) return done_req(c, st, req);
  // Not sent yet: a later isend to self may still match it.
  self_req *r = new_req(c);
  if (!r) return px_error(PX_ERR_NOMEM, "irecv: out of memory for a request");
  r->buf = buf;
  r->bytes = bytes;
  r->tag = tag;
  self_req **tail = &state(c)->posted;
  while (*tail) tail = &(*tail)->next;
  *tail = r;
  *req = &r->base;
  return PX_OK;
}

static px_status s_request_test(px_request *base, bool *done) {
  *done = ((self_req *)base)->done;
  return PX_OK;
}

static px_status s_request_wait(px_request *base) {
  self_req *r = (self_req *)base;
  px_status st = r->status;
  if (!r->done) {
    if (r->comm) {
      self_state *s = state(r->comm);
      for (self_req **pp = &s->posted; *pp; pp = &(*pp)->next)
        if (*pp == r) {
          *pp = r->next;
          break;
        }
    }
    st = never("irecv", r->tag);
  } else if (st) {
    px_error(st, "%s", r->msg);
  }
  free(r);
  return st;
}

static px_status s_split(px_comm *c, int color, int key, px_comm **out) {
  px_status st = check_alive(c, "split");
  if (st || color < 0) return st;
  px_comm *n;
  st = px_comm_init_self(&n);
  if (!st) n->timeout = c->timeout;
  *out = st ? NULL : n;
  return st;
}

static void s_abort(px_comm *c, const char *why) {
  self_state *s = state(c);
  if (s->aborted) return;
  s->aborted = true;
  snprintf(s->abort_msg, sizeof s->abort_msg, "rank 0 aborted: %s", why);
  fprintf(stderr, "plexus: rank 0: abort: %s\n", why);
}

static void s_free(px_comm *c) {
  self_state *s = state(c);
  while (s->queue) {
    self_msg *m = s->queue;
    s->queue = m->next;
    free(m);
  }
  // Requests stay the caller's; they only lose their link to the queue.
  for (self_req *r = s->posted; r; r = r->next) r->comm = NULL;
  free(s);
  free(c);
}

const px_comm_ops px_comm_self_ops = {
  .name = "self",
  .allreduce = s_allreduce,
  .broadcast = s_broadcast,
  .allgather = s_allgather,
  .reduce_scatter = s_reduce_scatter,
  .barrier = s_barrier,
  .send = s_send,
  .recv = s_recv,
  .iallreduce = s_iallreduce,
  .ibroadcast = s_ibroadcast,
  .iallgather = s_iallgather,
  .ireduce_scatter = s_ireduce_scatter,
  .isend = s_isend,
  .irecv = s_irecv,
  .request_test = s_request_test,
  .request_wait = s_request_wait,
  .split = s_split,
  .abort = s_abort,
  .free = s_free,
};

px_status px_comm_init_self(px_comm **out) {
  if (!out) return px_error(PX_ERR_INVALID, "px_comm_init_self: out is NULL");
  *out = NULL;
  px_comm *c = px_comm_alloc(&px_comm_self_ops, PX_COMM_SELF, 0, 1);
  self_state *s = calloc(1, sizeof *s);
  if (!c || !s) {
    free(c);
    free(s);
    return px_error(PX_ERR_NOMEM, "px_comm_init_self: out of memory");
  }
  c->impl = s;
  *out = c;
  return PX_OK;
}
