// Sums over ranks in rank order (rank_sum.h draws the algorithms).
#include "parallel/rank_sum.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_NATIVE, K_RS, K_AR };
enum { TAG_SPAN = 8192 };  /* operations in flight never come near this */

struct pxr_sum {
  int         kind;
  px_request *native;
  px_comm    *c;
  int         rank, size, tag;
  int         step;        /* RS: the round in flight (1..N-1), N: done; AR: 0 exchange, 1 gather, 2 done */
  float      *buf;         /* RS: send; AR: buf */
  float      *recv;        /* RS */
  size_t      piece;       /* RS: piece; AR: segment (ceil(count / N)) */
  size_t      count;       /* AR */
  float      *spare;
  const float **src;       /* (N) where contribution j lies */
  px_request **reqs;       /* (2N) in flight */
  int         n_reqs;
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

static void sum_free(pxr_sum *s) {
  if (!s) return;
  free(s->spare);
  free(s->src);
  free(s->reqs);
  free(s);
}

static pxr_sum *sum_new(pxr_ctx *x, int kind, size_t spare) {
  pxr_sum *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->kind = kind;
  s->c = x->p2p;
  s->rank = px_comm_rank(x->p2p);
  s->size = px_comm_size(x->p2p);
  s->tag = (int)(x->seq++ % TAG_SPAN) * 2;
  s->src = calloc((size_t)s->size, sizeof *s->src);
  s->reqs = calloc(2 * (size_t)s->size, sizeof *s->reqs);
  s->spare = spare ? malloc(spare * sizeof(float)) : NULL;
  if (!s->src || !s->reqs || (spare && !s->spare)) { sum_free(s); return NULL; }
  return s;
}

/* out[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ... in float; out may be one of
 * the x_j (a block is read whole before it is written). */
static void add_in_rank_order(float *out, const float *const *x, int n, size_t len) {
  enum { B = 512 };
  float acc[B];
  for (size_t i0 = 0; i0 < len; i0 += B) {
    size_t m = len - i0 < B ? len - i0 : B;
    memcpy(acc, x[0] + i0, m * sizeof(float));
    for (int j = 1; j < n; j++) {
      const float *xj = x[j] + i0;
      for (size_t i = 0; i < m; i++) acc[i] += xj[i];
    }
    memcpy(out + i0, acc, m * sizeof(float));
  }
}

static px_status post(pxr_sum *s, bool send, float *p, size_t n, int peer, int tag) {
  if (n == 0) return PX_OK;
  px_request **q = &s->reqs[s->n_reqs++];
  return send ? px_comm_isend(s->c, p, n, PX_F32, peer, tag, q) : px_comm_irecv(s->c, p, n, PX_F32, peer, tag, q);
}

/* ---- Reduce-scatter: round k ------------------------------------------------ */

static px_status rs_round(pxr_sum *s, int k) {
  const int r = s->rank, N = s->size, to = (r + k) % N, from = (r - k + N) % N;
  float *into = k == 1 ? s->spare : s->buf + (size_t)((r + k - 1) % N) * s->piece;
  s->src[from] = into;
  px_status st = post(s, false, into, s->piece, from, s->tag);
  if (st == PX_OK) st = post(s, true, s->buf + (size_t)to * s->piece, s->piece, to, s->tag);
  return st;
}

static px_status rs_next(pxr_sum *s) {
  if (++s->step < s->size) return rs_round(s, s->step);
  add_in_rank_order(s->recv, s->src, s->size, s->piece);
  return PX_OK;
}

/* ---- All-reduce ------------------------------------------------------------- */

static size_t seg_off(const pxr_sum *s, int e) {
  size_t o = (size_t)e * s->piece;
  return o < s->count ? o : s->count;
}
static size_t seg_len(const pxr_sum *s, int e) { return seg_off(s, e + 1) - seg_off(s, e); }

static px_status ar_next(pxr_sum *s) {
  const int r = s->rank, N = s->size;
  px_status st = PX_OK;
  if (s->step == 0) {
    // Every contribution to this rank's segment is in: add them, then send
    // the sum to everyone and receive theirs.
    add_in_rank_order(s->buf + seg_off(s, r), s->src, N, seg_len(s, r));
    for (int j = 0; j < N && st == PX_OK; j++) {
      if (j == r) continue;
      st = post(s, true, s->buf + seg_off(s, r), seg_len(s, r), j, s->tag + 1);
      if (st == PX_OK) st = post(s, false, s->buf + seg_off(s, j), seg_len(s, j), j, s->tag + 1);
    }
  }
  s->step++;
  return st;
}

/* ---- Progress --------------------------------------------------------------- */

/* Test (block: wait for) the requests in flight; when all are done, take
 * the next step.  *done: the whole operation completed. */
static px_status advance(pxr_sum *s, bool block, bool *done) {
  const int last = s->kind == K_RS ? s->size : 2;
  while (s->step < last) {
    for (int q = 0; q < s->n_reqs; q++) {
      if (!s->reqs[q]) continue;
      if (!block) {
        bool ok = false;
        px_status st = px_request_test(s->reqs[q], &ok);
        if (st != PX_OK) return st;
        if (!ok) { *done = false; return PX_OK; }
      }
      px_status st = px_request_wait(s->reqs[q]);
      s->reqs[q] = NULL;
      if (st != PX_OK) return st;
    }
    s->n_reqs = 0;
    px_status st = s->kind == K_RS ? rs_next(s) : ar_next(s);
    if (st != PX_OK) return st;
  }
  *done = true;
  return PX_OK;
}

px_status pxr_reduce_scatter(pxr_ctx *x, float *send, float *recv, size_t piece, pxr_sum **out) {
  *out = NULL;
  if (!x->p2p) {
    pxr_sum *s = calloc(1, sizeof *s);
    if (!s) return px_error(PX_ERR_NOMEM, "reduce-scatter: out of memory");
    px_status st = px_comm_ireduce_scatter(x->comm, send, recv, piece, PX_F32, PX_SUM, &s->native);
    if (st != PX_OK) { free(s); return st; }
    *out = s;
    return PX_OK;
  }
  pxr_sum *s = sum_new(x, K_RS, piece);
  if (!s) return px_error(PX_ERR_NOMEM, "reduce-scatter: out of memory for a spare piece of %zu floats", piece);
  s->buf = send;
  s->recv = recv;
  s->piece = piece;
  s->src[s->rank] = send + (size_t)s->rank * piece;
  s->step = 1;
  px_status st = rs_round(s, 1);
  bool done;
  if (st == PX_OK) st = advance(s, false, &done);
  if (st != PX_OK) { sum_free(s); return st; }
  *out = s;
  return PX_OK;
}

px_status pxr_allreduce(pxr_ctx *x, float *buf, size_t count, pxr_sum **out) {
  *out = NULL;
  if (!x->p2p) {
    pxr_sum *s = calloc(1, sizeof *s);
    if (!s) return px_error(PX_ERR_NOMEM, "all-reduce: out of memory");
    px_status st = px_comm_iallreduce(x->comm, buf, count, PX_F32, PX_SUM, &s->native);
    if (st != PX_OK) { free(s); return st; }
    *out = s;
    return PX_OK;
  }
  const int N = px_comm_size(x->p2p);
  const size_t seg = (count + (size_t)N - 1) / (size_t)N;
  pxr_sum *s = sum_new(x, K_AR, (size_t)(N - 1) * seg);
  if (!s) return px_error(PX_ERR_NOMEM, "all-reduce: out of memory for %zu spare floats", (size_t)(N - 1) * seg);
  s->buf = buf;
  s->count = count;
  s->piece = seg;
  const int r = s->rank;
  px_status st = PX_OK;
  for (int j = 0, k = 0; j < N && st == PX_OK; j++) {
    if (j == r) { s->src[j] = buf + seg_off(s, r); continue; }
    float *into = s->spare + (size_t)k++ * seg;
    s->src[j] = into;
    st = post(s, false, into, seg_len(s, r), j, s->tag);
    if (st == PX_OK) st = post(s, true, buf + seg_off(s, j), seg_len(s, j), j, s->tag);
  }
  bool done;
  if (st == PX_OK) st = advance(s, false, &done);
  if (st != PX_OK) { sum_free(s); return st; }
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
