// px_comm: the object every backend shares, argument checks and the
// printing helpers (the px_comm_run launcher, which starts the backends, is
// launch.c: this file calls no backend's start-up).  Backends (self.c,
// threads.c, mpi.c) only ever see validated arguments, so each check and
// its message lives here once.
#define _POSIX_C_SOURCE 200809L
#include "comm/internal.h"
#include "comm/fingerprint.h"
#include "base/internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

px_comm *px_comm_alloc(const px_comm_ops *ops, px_comm_backend backend, int rank, int size) {
  px_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->ops = ops;
  c->backend = backend;
  c->rank = c->local_rank = rank;
  c->size = c->local_size = size;
  c->timeout = PX_COMM_DEFAULT_TIMEOUT;
  c->debug_collectives = pxf_env_enabled();
  return c;
}

bool px_comm_reducible(px_dtype dtype) {
  return dtype == PX_F32 || dtype == PX_F64 || dtype == PX_I32 || dtype == PX_I64;
}

const char *px_comm_op_name(px_reduce_op op) {
  switch (op) {
  case PX_SUM: return "SUM";
  case PX_AVG: return "AVG";
  case PX_MIN: return "MIN";
  case PX_MAX: return "MAX";
  }
  return "?";
}

void px_comm_divide(void *buf, size_t count, px_dtype dtype, int n) {
  // For a power-of-two n, x × (1/n) is x / n to the bit (threads_reduce.c,
  // AVGP2FIN) without a division per element.
  const bool pow2 = (n & (n - 1)) == 0;
  switch (dtype) {
  case PX_F32: {
    float *p = buf;
    const float r = 1.0f / (float)n;
    if (pow2)
      for (size_t i = 0; i < count; i++) p[i] *= r;
    else
      for (size_t i = 0; i < count; i++) p[i] /= (float)n;
  } break;
  case PX_F64: {
    double *p = buf;
    const double r = 1.0 / (double)n;
    if (pow2)
      for (size_t i = 0; i < count; i++) p[i] *= r;
    else
      for (size_t i = 0; i < count; i++) p[i] /= (double)n;
  } break;
  case PX_I32: {
    int32_t *p = buf;
    for (size_t i = 0; i < count; i++) p[i] /= n;
  } break;
  case PX_I64: {
    int64_t *p = buf;
    for (size_t i = 0; i < count; i++) p[i] /= n;
  } break;
  default: break;
  }
}

const char *px_comm_backend_name(px_comm_backend b) {
  switch (b) {
  case PX_COMM_SELF: return "self";
  case PX_COMM_THREADS: return "threads";
  case PX_COMM_MPI: return "mpi";
  case PX_COMM_NCCL: return "nccl";
  }
  return "unknown";
}

/* ---- NCCL in a build without CUDA -------------------------------------------
 * The backend itself is src/comm/nccl.c, compiled only with CUDA. */
#ifndef PX_HAVE_CUDA
px_status px_comm_nccl_create(px_comm *bootstrap, px_comm **out) {
  (void)bootstrap;
  if (out) *out = NULL;
  return px_error(PX_ERR_UNSUPPORTED,
                  "px_comm_nccl_create: plexus was built without CUDA/NCCL; rebuild with the "
                  "CUDA toolkit and NCCL installed to use the GPUs' communicator");
}

bool px_comm_nccl_available(void) { return false; }
#endif

/* ---- Who am I --------------------------------------------------------------
 * A NULL communicator reads as a world of one, so logging code that runs
 * before start-up needs no special case. */
int px_comm_rank(const px_comm *c) { return c ? c->rank : 0; }
int px_comm_size(const px_comm *c) { return c ? c->size : 1; }
int px_comm_local_rank(const px_comm *c) { return c ? c->local_rank : 0; }
int px_comm_local_size(const px_comm *c) { return c ? c->local_size : 1; }
px_comm_backend px_comm_backend_of(const px_comm *c) { return c ? c->backend : PX_COMM_SELF; }

void px_comm_set_timeout(px_comm *c, double seconds) {
  if (!c) return;
  c->timeout = (isnan(seconds) || seconds <= 0) ? 0 : seconds;
}

double px_comm_timeout(const px_comm *c) { return c ? c->timeout : 0; }

void px_comm_set_label(px_comm *c, const char *label) {
  if (!c) return;
  snprintf(c->label, sizeof c->label, "%s", label ? label : "");
}

void px_comm_abort(px_comm *c, const char *why) {
  if (c) c->ops->abort(c, why ? why : "px_comm_abort");
}

void px_comm_free(px_comm *c) {
  if (!c || c->owned_by_run) return;
  c->ops->free(c);
}

/* ---- Argument checks ------------------------------------------------------- */

static px_status check_comm(const px_comm *c, const char *what) {
  if (!c) return px_error(PX_ERR_INVALID, "%s: the communicator is NULL", what);
  return PX_OK;
}

static px_status check_buf(const char *what, const char *name, const void *p, size_t count) {
  if (!p && count > 0) return px_error(PX_ERR_INVALID, "%s: %s is NULL but count is %zu", what, name, count);
  return PX_OK;
}

static px_status check_dtype(const char *what, px_dtype dtype) {
  if ((unsigned)dtype >= PX_DTYPE_COUNT)
    return px_error(PX_ERR_INVALID, "%s: dtype %d is not a px_dtype", what, (int)dtype);
  return PX_OK;
}

/* NCCL also reduces bf16 (mixed precision's optional bf16 gradient
 * reduction); the host backends reduce F32, F64, I32 and I64. */
static px_status check_reduction(const px_comm *c, const char *what, px_dtype dtype, px_reduce_op op) {
  px_status st = check_dtype(what, dtype);
  if (st) return st;
  if (!px_comm_reducible(dtype) && !(dtype == PX_BF16 && c->backend == PX_COMM_NCCL))
    return px_error(PX_ERR_UNSUPPORTED,
                    "%s: dtype %s is not supported for reductions (F32, F64, I32 and I64 are); "
                    "convert the buffer first",
                    what, px_dtype_name(dtype));
  if ((unsigned)op > PX_MAX)
    return px_error(PX_ERR_INVALID, "%s: reduce op %d is not one of PX_SUM, PX_AVG, PX_MIN, PX_MAX", what, (int)op);
  return PX_OK;
}

static px_status check_rank(const px_comm *c, const char *what, const char *role, int r) {
  if (r < 0 || r >= c->size)
    return px_error(PX_ERR_INVALID, "%s: %s %d is out of range for a communicator of size %d (ranks 0..%d)", what, role,
                    r, c->size, c->size - 1);
  return PX_OK;
}

static px_status check_tag(const char *what, int tag) {
  if (tag < 0) return px_error(PX_ERR_INVALID, "%s: tag %d is negative; tags are >= 0", what, tag);
  return PX_OK;
}

static px_status check_req(const char *what, px_request **req) {
  if (!req) return px_error(PX_ERR_INVALID, "%s: req is NULL (where should the request go?)", what);
  *req = NULL;
  return PX_OK;
}

/* ---- Collectives and point-to-point: check, then hand to the backend -------
 * Each collective is defined with its caller's site (px_comm_*_at, what the
 * header's macros call); the plain names, in parentheses so the macros leave
 * them alone, are the same with the site unknown.  With the debug mode on,
 * the fingerprints are compared after the argument checks, before the
 * backend runs anything (fingerprint.c). */

void px_comm_set_debug_collectives(px_comm *c, bool on) {
  if (c) c->debug_collectives = on;
}

bool px_comm_debug_collectives(const px_comm *c) { return c && c->debug_collectives; }

static px_status fingerprint(px_comm *c, pxf_kind kind, size_t count, px_dtype dtype, int op, int root,
                             const char *file, int line) {
  pxf_call call = {.kind = kind, .count = count, .dtype = dtype, .op = op, .root = root, .file = file, .line = line};
  return pxf_check(c, &call);
}

px_status px_comm_allreduce_at(const char *file, int line, px_comm *c, void *buf, size_t count, px_dtype dtype,
                               px_reduce_op op) {
  TRY(check_comm(c, "allreduce"));
  TRY(check_reduction(c, "allreduce", dtype, op));
  TRY(check_buf("allreduce", "buf", buf, count));
  if (c->debug_collectives) TRY(fingerprint(c, PXF_ALLREDUCE, count, dtype, (int)op, -1, file, line));
  return c->ops->allreduce(c, buf, count, dtype, op);
}

px_status(px_comm_allreduce)(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op) {
  return px_comm_allreduce_at(NULL, 0, c, buf, count, dtype, op);
}

px_status px_comm_broadcast_at(const char *file, int line, px_comm *c, void *buf, size_t count, px_dtype dtype,
                               int root) {
  TRY(check_comm(c, "broadcast"));
  TRY(check_dtype("broadcast", dtype));
  TRY(check_rank(c, "broadcast", "root", root));
  TRY(check_buf("broadcast", "buf", buf, count));
  if (c->debug_collectives) TRY(fingerprint(c, PXF_BROADCAST, count, dtype, -1, root, file, line));
  return c->ops->broadcast(c, buf, count, dtype, root);
}

px_status(px_comm_broadcast)(px_comm *c, void *buf, size_t count, px_dtype dtype, int root) {
  return px_comm_broadcast_at(NULL, 0, c, buf, count, dtype, root);
}

px_status px_comm_allgather_at(const char *file, int line, px_comm *c, const void *send, void *recv, size_t count,
                               px_dtype dtype) {
  TRY(check_comm(c, "allgather"));
  TRY(check_dtype("allgather", dtype));
  TRY(check_buf("allgather", "send", send, count));
  TRY(check_buf("allgather", "recv", recv, count));
  if (c->debug_collectives) TRY(fingerprint(c, PXF_ALLGATHER, count, dtype, -1, -1, file, line));
  return c->ops->allgather(c, send, recv, count, dtype);
}

px_status(px_comm_allgather)(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype) {
  return px_comm_allgather_at(NULL, 0, c, send, recv, count, dtype);
}

px_status px_comm_reduce_scatter_at(const char *file, int line, px_comm *c, const void *send, void *recv, size_t count,
                                    px_dtype dtype, px_reduce_op op) {
  TRY(check_comm(c, "reduce_scatter"));
  TRY(check_reduction(c, "reduce_scatter", dtype, op));
  TRY(check_buf("reduce_scatter", "send", send, count));
  TRY(check_buf("reduce_scatter", "recv", recv, count));
  if (c->debug_collectives) TRY(fingerprint(c, PXF_REDUCE_SCATTER, count, dtype, (int)op, -1, file, line));
  return c->ops->reduce_scatter(c, send, recv, count, dtype, op);
}

px_status(px_comm_reduce_scatter)(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                  px_reduce_op op) {
  return px_comm_reduce_scatter_at(NULL, 0, c, send, recv, count, dtype, op);
}

px_status px_comm_barrier_at(const char *file, int line, px_comm *c) {
  TRY(check_comm(c, "barrier"));
  if (c->debug_collectives) TRY(fingerprint(c, PXF_BARRIER, 0, PX_U8, -1, -1, file, line));
  return c->ops->barrier(c);
}

px_status(px_comm_barrier)(px_comm *c) { return px_comm_barrier_at(NULL, 0, c); }

px_status px_comm_send(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag) {
  TRY(check_comm(c, "send"));
  TRY(check_dtype("send", dtype));
  TRY(check_rank(c, "send", "dst", dst));
  TRY(check_tag("send", tag));
  TRY(check_buf("send", "buf", buf, count));
  return c->ops->send(c, buf, count, dtype, dst, tag);
}

px_status px_comm_recv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag) {
  TRY(check_comm(c, "recv"));
  TRY(check_dtype("recv", dtype));
  TRY(check_rank(c, "recv", "src", src));
  TRY(check_tag("recv", tag));
  TRY(check_buf("recv", "buf", buf, count));
  return c->ops->recv(c, buf, count, dtype, src, tag);
}

px_status px_comm_iallreduce_at(const char *file, int line, px_comm *c, void *buf, size_t count, px_dtype dtype,
                                px_reduce_op op, px_request **req) {
  TRY(check_req("iallreduce", req));
  TRY(check_comm(c, "iallreduce"));
  TRY(check_reduction(c, "iallreduce", dtype, op));
  TRY(check_buf("iallreduce", "buf", buf, count));
  if (c->debug_collectives) TRY(fingerprint(c, PXF_IALLREDUCE, count, dtype, (int)op, -1, file, line));
  return c->ops->iallreduce(c, buf, count, dtype, op, req);
}

px_status(px_comm_iallreduce)(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op, px_request **req) {
  return px_comm_iallreduce_at(NULL, 0, c, buf, count, dtype, op, req);
}

px_status px_comm_ibroadcast_at(const char *file, int line, px_comm *c, void *buf, size_t count, px_dtype dtype,
                                int root, px_request **req) {
  TRY(check_req("ibroadcast", req));
  TRY(check_comm(c, "ibroadcast"));
  TRY(check_dtype("ibroadcast", dtype));
  TRY(check_rank(c, "ibroadcast", "root", root));
  TRY(check_buf("ibroadcast", "buf", buf, count));
  if (c->debug_collectives) TRY(fingerprint(c, PXF_IBROADCAST, count, dtype, -1, root, file, line));
  return c->ops->ibroadcast(c, buf, count, dtype, root, req);
}

px_status(px_comm_ibroadcast)(px_comm *c, void *buf, size_t count, px_dtype dtype, int root, px_request **req) {
  return px_comm_ibroadcast_at(NULL, 0, c, buf, count, dtype, root, req);
}

px_status px_comm_iallgather_at(const char *file, int line, px_comm *c, const void *send, void *recv, size_t count,
                                px_dtype dtype, px_request **req) {
  TRY(check_req("iallgather", req));
  TRY(check_comm(c, "iallgather"));
  TRY(check_dtype("iallgather", dtype));
  TRY(check_buf("iallgather", "send", send, count));
  TRY(check_buf("iallgather", "recv", recv, count));
  if (c->debug_collectives) TRY(fingerprint(c, PXF_IALLGATHER, count, dtype, -1, -1, file, line));
  return c->ops->iallgather(c, send, recv, count, dtype, req);
}

px_status(px_comm_iallgather)(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                              px_request **req) {
  return px_comm_iallgather_at(NULL, 0, c, send, recv, count, dtype, req);
}

px_status px_comm_ireduce_scatter_at(const char *file, int line, px_comm *c, const void *send, void *recv, size_t count,
                                     px_dtype dtype, px_reduce_op op, px_request **req) {
  TRY(check_req("ireduce_scatter", req));
  TRY(check_comm(c, "ireduce_scatter"));
  TRY(check_reduction(c, "ireduce_scatter", dtype, op));
  TRY(check_buf("ireduce_scatter", "send", send, count));
  TRY(check_buf("ireduce_scatter", "recv", recv, count));
  if (c->debug_collectives) TRY(fingerprint(c, PXF_IREDUCE_SCATTER, count, dtype, (int)op, -1, file, line));
  return c->ops->ireduce_scatter(c, send, recv, count, dtype, op, req);
}

px_status(px_comm_ireduce_scatter)(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                   px_reduce_op op, px_request **req) {
  return px_comm_ireduce_scatter_at(NULL, 0, c, send, recv, count, dtype, op, req);
}

px_status px_comm_isend(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag, px_request **req) {
  TRY(check_req("isend", req));
  TRY(check_comm(c, "isend"));
  TRY(check_dtype("isend", dtype));
  TRY(check_rank(c, "isend", "dst", dst));
  TRY(check_tag("isend", tag));
  TRY(check_buf("isend", "buf", buf, count));
  return c->ops->isend(c, buf, count, dtype, dst, tag, req);
}

px_status px_comm_irecv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag, px_request **req) {
  TRY(check_req("irecv", req));
  TRY(check_comm(c, "irecv"));
  TRY(check_dtype("irecv", dtype));
  TRY(check_rank(c, "irecv", "src", src));
  TRY(check_tag("irecv", tag));
  TRY(check_buf("irecv", "buf", buf, count));
  return c->ops->irecv(c, buf, count, dtype, src, tag, req);
}

px_status px_request_test(px_request *r, bool *done) {
  if (!r || !done) return px_error(PX_ERR_INVALID, "px_request_test: %s is NULL", r ? "done" : "the request");
  return r->ops->request_test(r, done);
}

px_status px_request_wait(px_request *r) {
  if (!r) return px_error(PX_ERR_INVALID, "px_request_wait: the request is NULL");
  return r->ops->request_wait(r);
}

px_status px_comm_split_at(const char *file, int line, px_comm *c, int color, int key, px_comm **out) {
  if (!out) return px_error(PX_ERR_INVALID, "split: out is NULL");
  *out = NULL;
  TRY(check_comm(c, "split"));
  // color and key differ between ranks by design: only the call is compared.
  if (c->debug_collectives) TRY(fingerprint(c, PXF_SPLIT, 0, PX_U8, -1, -1, file, line));
  TRY(c->ops->split(c, color, key, out));
  if (*out) (*out)->debug_collectives = c->debug_collectives;
  return PX_OK;
}

px_status(px_comm_split)(px_comm *c, int color, int key, px_comm **out) {
  return px_comm_split_at(NULL, 0, c, color, key, out);
}

/* ---- Helpers for training scripts ----------------------------------------- */

px_status px_comm_mean(px_comm *c, double *value) {
  if (!value) return px_error(PX_ERR_INVALID, "px_comm_mean: value is NULL");
  return px_comm_allreduce(c, value, 1, PX_F64, PX_AVG);
}

void px_print0(const px_comm *c, const char *fmt, ...) {
  if (px_comm_rank(c) != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  // Under MPI stdout is a pipe to the launcher: unflushed lines arrive late
  // or, after an abort, never.
  fflush(stdout);
}

/* Gathers every rank's text to rank 0, which prints it: taking turns with
 * barriers is not enough under MPI, where each process's stdout reaches the
 * terminal through the launcher in whatever order the pipes deliver. */
px_status px_print_ordered(px_comm *c, const char *fmt, ...) {
  TRY(check_comm(c, "px_print_ordered"));
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  char *mine = malloc((size_t)n + 1);
  // Every rank takes part in the collectives below even when its own
  // allocation failed; a missing rank would stall the others.
  int64_t len = mine ? n + 1 : -1;
  if (mine) {
    va_start(ap, fmt);
    vsnprintf(mine, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  int64_t ok_len[2] = {len < 0 ? 1 : 0, len};
  px_status st = px_comm_allreduce(c, ok_len, 2, PX_I64, PX_MAX);
  if (st) {
    free(mine);
    return st;
  }
  if (ok_len[0]) {
    free(mine);
    return px_error(PX_ERR_NOMEM, "px_print_ordered: a rank could not allocate its line");
  }
  size_t width = (size_t)ok_len[1];
  // Only rank 0 needs the lines, but allgather is what every backend has:
  // the other ranks receive them too and ignore them (lines are short).
  char *block = calloc(width, 1);
  char *all = calloc((size_t)c->size, width);
  int64_t fail = (!block || !all) ? 1 : 0;
  st = px_comm_allreduce(c, &fail, 1, PX_I64, PX_MAX);
  if (!st && fail) st = px_error(PX_ERR_NOMEM, "px_print_ordered: out of memory for %zu-byte lines", width);
  if (!st) {
    memcpy(block, mine, (size_t)n + 1);
    st = px_comm_allgather(c, block, all, width, PX_U8);
  }
  if (!st && c->rank == 0) {
    for (int r = 0; r < c->size; r++) {
      const char *line = all + (size_t)r * width;
      // One prefix per line, so multi-line text stays attributable.
      while (*line) {
        const char *nl = strchr(line, '\n');
        int k = nl ? (int)(nl - line) : (int)strlen(line);
        printf("[rank %d/%d] %.*s\n", r, c->size, k, line);
        line += k + (nl ? 1 : 0);
      }
      if (!all[(size_t)r * width]) printf("[rank %d/%d] \n", r, c->size);
    }
    fflush(stdout);
  }
  free(all);
  free(block);
  free(mine);
  return st;
}
