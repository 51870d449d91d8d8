// Sums over ranks in rank order (rank_sum.h draws the algorithms).
#include "parallel/rank_sum.h"
#include "comm/fingerprint.h"  // the sums below are collectives made of messages

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Messages carry CHUNK floats (a segment's last one fewer).  A round's
 * receives run DEPTH chunks ahead of the sends whose storage they reuse, so
 * the first DEPTH chunks of each contribution (its "head") need memory of
 * their own: (N-1)·DEPTH·CHUNK floats an operation at most, whatever the
 * buffer's length.  CHUNK is a multiple of ADD_BLOCK, so no block of the
 * sum straddles a head and the rest of its contribution. */
enum { CHUNK = 131072, DEPTH = 2, ADD_BLOCK = 512 };
enum { K_NATIVE, K_RS, K_AR };
enum { P_EXCHANGE, P_GATHER, P_DONE };
enum { TAG_SPAN = 8192 }; /* operations in flight never come near this */

struct pxr_sum {
  int kind;
  px_request *native;
  px_comm *c;
  int rank, size, tag;
  int phase;   /* P_EXCHANGE, P_GATHER (AR), P_DONE */
  float *buf;  /* the N segments (RS: send; AR: buf) */
  float *out;  /* the sum of segment `rank` (RS: recv; AR: its segment of buf) */
  size_t base; /* segment e: base + (e < rem) floats at e·base + min(e, rem) */
  size_t rem;
  size_t head;               /* H = min(len(rank), DEPTH·CHUNK) */
  float *heads;              /* (N-1)·H floats: round k's head at (k-1)·H */
  px_request **sreq, **rreq; /* (N-1)·cap: round k's chunk i at (k-1)·cap + i; the gather's from 0 */
  int ns, nr, cap;           /* gather's sends and receives; chunks a segment at most */
  int *next_recv;            /* (N-1) round k's next receive to post */
  const float **src;         /* (N) the sources of one block of the sum */
};

px_status pxr_init(pxr_ctx *x, px_comm *comm) {
  *x = (pxr_ctx){.comm = comm};
  if (px_comm_backend_of(comm) != PX_COMM_MPI || px_comm_size(comm) < 3) return PX_OK;
  px_comm_set_label(comm, "rank-order sums: private communicator");
  return px_comm_split(comm, 0, px_comm_rank(comm), &x->p2p);
}

void pxr_fini(pxr_ctx *x) {
  if (x->p2p) px_comm_free(x->p2p);
  x->p2p = NULL;
}

static size_t seg_off(const pxr_sum *s, int e) {
  size_t u = (size_t)e;
  return u * s->base + (u < s->rem ? u : s->rem);
}
static size_t seg_len(const pxr_sum *s, int e) { return s->base + ((size_t)e < s->rem ? 1 : 0); }
static size_t n_chunks(size_t len) { return (len + CHUNK - 1) / CHUNK; }

static void sum_free(pxr_sum *s) {
  if (!s) return;
  free(s->heads);
  free(s->src);
  free(s->sreq);
  free(s->rreq);
  free(s->next_recv);
  free(s);
}

/* An operation over buf's N segments (base, rem) on the private
 * communicator: heads for its contributions, request slots for a round's
 * chunks (or the gather's N-1 messages each way). */
static pxr_sum *sum_new(pxr_ctx *x, int kind, float *buf, size_t base, size_t rem) {
  pxr_sum *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->kind = kind;
  s->c = x->p2p;
  s->rank = px_comm_rank(x->p2p);
  s->size = px_comm_size(x->p2p);
  s->tag = (int)(x->seq++ % TAG_SPAN) * 2;
  s->buf = buf;
  s->base = base;
  s->rem = rem;
  const size_t len = seg_len(s, s->rank), most = base + (rem ? 1 : 0);
  s->head = len < (size_t)DEPTH * CHUNK ? len : (size_t)DEPTH * CHUNK;
  s->cap = most ? (int)n_chunks(most) : 1;
  const size_t nq = (size_t)(s->size - 1) * (size_t)s->cap;
  s->src = calloc((size_t)s->size, sizeof *s->src);
  s->sreq = calloc(nq, sizeof *s->sreq);
  s->rreq = calloc(nq, sizeof *s->rreq);
  s->next_recv = calloc((size_t)s->size, sizeof *s->next_recv);
  const size_t nh = (size_t)(s->size - 1) * s->head;
  s->heads = nh ? malloc(nh * sizeof(float)) : NULL;
  if (!s->src || !s->sreq || !s->rreq || !s->next_recv || (nh && !s->heads)) {
    sum_free(s);
    return NULL;
  }
  return s;
}

/* out[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ... in float; out may be one of
 * the x_j (the block is read whole before it is written).  len <= ADD_BLOCK. */
static void add_in_rank_order(float *out, const float *const *x, int n, size_t len) {
  float acc[ADD_BLOCK];
  memcpy(acc, x[0], len * sizeof(float));
  for (int j = 1; j < n; j++) {
    const float *xj = x[j];
    for (size_t i = 0; i < len; i++) acc[i] += xj[i];
  }
  memcpy(out, acc, len * sizeof(float));
}

/* Completes *q (block) or tests it; a completed request is freed and
 * cleared.  *ok: it is complete (NULL counts as complete). */
static px_status req_done(px_request **q, bool block, bool *ok) {
  *ok = true;
  if (!*q) return PX_OK;
  if (!block) {
    px_status st = px_request_test(*q, ok);
    if (st != PX_OK || !*ok) return st;
  }
  px_status st = px_request_wait(*q);
  *q = NULL;
  return st;
}

/* ---- Exchange rounds ---------------------------------------------------------
 * Round k (1..N-1): rank r sends segment r+k to rank r+k and receives rank
 * r-k's contribution to segment r.  Element e of that contribution lands in
 * round k's head (e < H) or at e - H in segment r+k, this rank's own
 * contribution to which has then been sent: the receive of chunk i >= DEPTH
 * waits for the send of chunk i - DEPTH, whose place it takes.  Segment r
 * itself is never sent or written until the sum.  The rounds touch
 * disjoint memory and run at once.  No deadlock: a rank waits for a send
 * of (round k, chunk i) only to post a receive, after posting every
 * receive of the rounds before k, and the peer that must receive it in
 * turn waits for a send of an earlier round or of an earlier chunk. */

static const float *contribution(const pxr_sum *s, int k, size_t e) {
  const int to = (s->rank + k) % s->size;
  return e < s->head ? s->heads + (size_t)(k - 1) * s->head + e : s->buf + seg_off(s, to) + (e - s->head);
}

static px_status rounds_start(pxr_sum *s) {
  s->phase = P_EXCHANGE;
  for (int k = 1; k < s->size; k++) {
    const int to = (s->rank + k) % s->size;
    const size_t S = seg_len(s, to), off = seg_off(s, to);
    s->next_recv[k - 1] = 0;
    for (size_t e0 = 0; e0 < S; e0 += CHUNK) {
      const size_t n = S - e0 < CHUNK ? S - e0 : CHUNK;
      px_status st = px_comm_isend(s->c, s->buf + off + e0, n, PX_F32, to, s->tag,
                                   &s->sreq[(size_t)(k - 1) * s->cap + e0 / CHUNK]);
      if (st != PX_OK) return st;
    }
  }
  return PX_OK;
}

/* Posts each round's receives as far as its sends allow, then completes
 * them all (block: waits; else returns with *finished false at the first
 * request still in flight). */
static px_status rounds_progress(pxr_sum *s, bool block, bool *finished) {
  const int N = s->size;
  const size_t L = seg_len(s, s->rank);
  const int nr = (int)n_chunks(L);
  *finished = false;
  bool ok, all_posted = true;
  px_status st;
  for (int k = 1; k < N; k++) {
    const int from = (s->rank - k + N) % N;
    px_request **sreq = s->sreq + (size_t)(k - 1) * s->cap, **rreq = s->rreq + (size_t)(k - 1) * s->cap;
    while (s->next_recv[k - 1] < nr) {
      const int i = s->next_recv[k - 1];
      const size_t e0 = (size_t)i * CHUNK, n = L - e0 < CHUNK ? L - e0 : CHUNK;
      if (e0 >= s->head) {  // H = DEPTH·CHUNK here: chunk i takes send chunk i - DEPTH's place
        if ((st = req_done(&sreq[i - DEPTH], block, &ok)) != PX_OK) return st;
        if (!ok) break;
      }
      st = px_comm_irecv(s->c, (float *)contribution(s, k, e0), n, PX_F32, from, s->tag, &rreq[i]);
      if (st != PX_OK) return st;
      s->next_recv[k - 1]++;
    }
    if (s->next_recv[k - 1] < nr) all_posted = false;
  }
  if (!all_posted) return PX_OK;
  for (size_t q = 0; q < (size_t)(N - 1) * s->cap; q++) {
    if ((st = req_done(&s->sreq[q], block, &ok)) != PX_OK) return st;
    if (!ok) return PX_OK;
    if ((st = req_done(&s->rreq[q], block, &ok)) != PX_OK) return st;
    if (!ok) return PX_OK;
  }
  *finished = true;
  return PX_OK;
}

/* Every contribution to segment r is in: out = x_0 + x_1 + ... */
static void sum_segment(pxr_sum *s) {
  const int r = s->rank, N = s->size;
  const size_t L = seg_len(s, r);
  const float *own = s->buf + seg_off(s, r);
  for (size_t i0 = 0; i0 < L; i0 += ADD_BLOCK) {
    const size_t m = L - i0 < ADD_BLOCK ? L - i0 : ADD_BLOCK;
    for (int j = 0; j < N; j++) s->src[j] = j == r ? own + i0 : contribution(s, (r - j + N) % N, i0);
    add_in_rank_order(s->out + i0, s->src, N, m);
  }
}

/* ---- All-reduce's gather: every rank sends its summed segment to every other */

static px_status gather_start(pxr_sum *s) {
  const int r = s->rank, N = s->size;
  px_status st = PX_OK;
  s->phase = P_GATHER;
  s->ns = s->nr = 0;
  for (int j = 0; j < N && st == PX_OK; j++) {
    if (j == r) continue;
    if (seg_len(s, r))
      st = px_comm_isend(s->c, s->buf + seg_off(s, r), seg_len(s, r), PX_F32, j, s->tag + 1, &s->sreq[s->ns++]);
    if (st == PX_OK && seg_len(s, j))
      st = px_comm_irecv(s->c, s->buf + seg_off(s, j), seg_len(s, j), PX_F32, j, s->tag + 1, &s->rreq[s->nr++]);
  }
  return st;
}

static px_status gather_progress(pxr_sum *s, bool block, bool *finished) {
  bool ok;
  px_status st;
  *finished = false;
  for (int i = 0; i < s->ns; i++) {
    if ((st = req_done(&s->sreq[i], block, &ok)) != PX_OK) return st;
    if (!ok) return PX_OK;
  }
  for (int i = 0; i < s->nr; i++) {
    if ((st = req_done(&s->rreq[i], block, &ok)) != PX_OK) return st;
    if (!ok) return PX_OK;
  }
  *finished = true;
  return PX_OK;
}

/* ---- Progress --------------------------------------------------------------- */

/* Moves the operation on (block: to its end).  *done: it completed. */
static px_status advance(pxr_sum *s, bool block, bool *done) {
  *done = false;
  while (s->phase != P_DONE) {
    bool fin;
    px_status st = s->phase == P_EXCHANGE ? rounds_progress(s, block, &fin) : gather_progress(s, block, &fin);
    if (st != PX_OK) return st;
    if (!fin) return PX_OK;
    if (s->phase == P_EXCHANGE) {
      sum_segment(s);
      if (s->kind == K_AR) st = gather_start(s);
      else s->phase = P_DONE;
    } else {
      s->phase = P_DONE;
    }
    if (st != PX_OK) return st;
  }
  *done = true;
  return PX_OK;
}

/* With the collective fingerprints on (PX_DEBUG_COLLECTIVES), a sum made of
 * messages is checked as the collective it is, on the caller's
 * communicator (whose label the caller set), before any message: a rank
 * that sums another count, or skips a sum, is reported instead of
 * exchanging mismatched pieces. */
static px_status fingerprint(pxr_ctx *x, pxf_kind kind, size_t count, int line) {
  if (!px_comm_debug_collectives(x->comm)) return PX_OK;
  pxf_call call =
    {.kind = kind, .count = count, .dtype = PX_F32, .op = PX_SUM, .root = -1, .file = __FILE__, .line = line};
  return pxf_check(x->comm, &call);
}

static px_status start(pxr_sum *s) {
  bool done;
  px_status st = rounds_start(s);
  if (st == PX_OK) st = advance(s, false, &done);
  return st;
}

px_status pxr_reduce_scatter(pxr_ctx *x, float *send, float *recv, size_t piece, pxr_sum **out) {
  *out = NULL;
  if (!x->p2p) {
    pxr_sum *s = calloc(1, sizeof *s);
    if (!s) return px_error(PX_ERR_NOMEM, "reduce-scatter: out of memory");
    px_status st = px_comm_ireduce_scatter(x->comm, send, recv, piece, PX_F32, PX_SUM, &s->native);
    if (st != PX_OK) {
      free(s);
      return st;
    }
    *out = s;
    return PX_OK;
  }
  px_status fst = fingerprint(x, PXF_IREDUCE_SCATTER, piece, __LINE__);
  if (fst != PX_OK) return fst;
  pxr_sum *s = sum_new(x, K_RS, send, piece, 0);
  if (!s) return px_error(PX_ERR_NOMEM, "reduce-scatter: out of memory for the heads of a piece of %zu floats", piece);
  s->out = recv;
  px_status st = start(s);
  if (st != PX_OK) {
    sum_free(s);
    return st;
  }
  *out = s;
  return PX_OK;
}

px_status pxr_allreduce_native(pxr_ctx *x, void *buf, size_t count, px_dtype dtype, px_reduce_op op, pxr_sum **out) {
  *out = NULL;
  pxr_sum *s = calloc(1, sizeof *s); /* kind K_NATIVE */
  if (!s) return px_error(PX_ERR_NOMEM, "all-reduce: out of memory");
  px_status st = px_comm_iallreduce(x->comm, buf, count, dtype, op, &s->native);
  if (st != PX_OK) {
    free(s);
    return st;
  }
  *out = s;
  return PX_OK;
}

px_status pxr_allreduce(pxr_ctx *x, float *buf, size_t count, pxr_sum **out) {
  *out = NULL;
  if (!x->p2p) {
    pxr_sum *s = calloc(1, sizeof *s);
    if (!s) return px_error(PX_ERR_NOMEM, "all-reduce: out of memory");
    px_status st = px_comm_iallreduce(x->comm, buf, count, PX_F32, PX_SUM, &s->native);
    if (st != PX_OK) {
      free(s);
      return st;
    }
    *out = s;
    return PX_OK;
  }
  px_status fst = fingerprint(x, PXF_IALLREDUCE, count, __LINE__);
  if (fst != PX_OK) return fst;
  const size_t N = (size_t)px_comm_size(x->p2p);
  pxr_sum *s = sum_new(x, K_AR, buf, count / N, count % N);
  if (!s) return px_error(PX_ERR_NOMEM, "all-reduce: out of memory for the heads of %zu floats", count);
  s->out = buf + seg_off(s, s->rank);
  px_status st = start(s);
  if (st != PX_OK) {
    sum_free(s);
    return st;
  }
  *out = s;
  return PX_OK;
}

px_status pxr_test(pxr_sum *s, bool *done) {
  if (s->kind == K_NATIVE) return px_request_test(s->native, done);
  return advance(s, false, done);
}

px_status pxr_wait(pxr_sum *s) {
  if (!s) return PX_OK;
  px_status st;
  if (s->kind == K_NATIVE) {
    st = px_request_wait(s->native);
  } else {
    bool done;
    st = advance(s, true, &done);
  }
  sum_free(s);
  return st;
}
