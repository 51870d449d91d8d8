// The NCCL backend (comm.h, "NCCL: the GPUs' communicator"): collectives
// on device buffers over NCCL, on the calling thread's communication
// stream.
//
//   start  cudaEventRecord(ready, compute); cudaStreamWaitEvent(comm, ready);
//          ncclXxx(..., comm); cudaEventRecord(done, comm)
//   test   cudaEventQuery(done)
//   wait   poll done (and ncclCommGetAsyncError) until it completes or the
//          comm's timeout passes (then ncclCommAbort, PX_ERR_TIMEOUT naming
//          the collective, its count and the label); then
//          cudaStreamWaitEvent(compute, done) so later kernels see the result
//   blocking = start + wait
//
// Host buffers are staged through device memory (blocking; the i-variants
// then return a completed request), so the library's small host-side
// agreements (layout checks, DDP's join, px_comm_mean) work on an NCCL
// communicator too.  Point-to-point is refused: NCCL matches sends and
// receives by order, not tag, and a send posted before a receive on the
// same stream deadlocks an exchange, which px_comm's contract allows.
//
// Compiled only with CUDA (PX_HAVE_CUDA); comm.c has the refusal otherwise.
#define _POSIX_C_SOURCE 200809L
#ifdef PX_HAVE_CUDA
#include "comm/internal.h"
#include "base/internal.h"
#include "tensor/cuda/k_optim.h" /* px_cuda_is_device_memory */
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h declares f() for f(void) */
#include <nccl.h>
#pragma GCC diagnostic pop

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct nccl_impl {
  ncclComm_t nc;
  int device;         /* the CUDA device every rank's thread must have current */
  cudaEvent_t ready;  /* recorded on the compute stream before each operation */
  void *scratch;      /* 256 device bytes: the barrier's element */
  px_comm *bootstrap; /* the world's bootstrap: px_comm_abort ends the job through it */
  bool aborted;
  char abort_msg[256];
  ncclComm_t aborting;    /* handed to the abort thread */
  pthread_t abort_thread; /* joined by n_free */
  bool abort_running;
} nccl_impl;

typedef enum { OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_BARRIER } op_kind;

typedef struct nccl_req {
  px_request base;
  px_comm *c;
  cudaEvent_t done; /* NULL: completed already (a staged host operation) */
  op_kind kind;
  size_t count;
} nccl_req;

extern const px_comm_ops px_comm_nccl_ops;

static const char *op_name(op_kind k) {
  switch (k) {
  case OP_ALLREDUCE: return "allreduce";
  case OP_BROADCAST: return "broadcast";
  case OP_ALLGATHER: return "allgather";
  case OP_REDUCE_SCATTER: return "reduce_scatter";
  case OP_BARRIER: return "barrier";
  }
  return "collective";
}

static nccl_impl *impl_of(px_comm *c) { return c->impl; }

static px_status cuda_st(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return PX_OK;
  return px_error(PX_ERR_COMM, "nccl: %s: %s", what, cudaGetErrorString(e));
}

static px_status nccl_st(ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return PX_OK;
  return px_error(PX_ERR_COMM, "nccl: %s: %s", what, ncclGetErrorString(r));
}

static px_status check_usable(px_comm *c, const char *what) {
  nccl_impl *im = impl_of(c);
  if (im->aborted) return px_error(PX_ERR_COMM, "nccl: %s on an aborted communicator (%s)", what, im->abort_msg);
  int dev = px_cuda_current_device();
  if (dev != im->device)
    return px_error(PX_ERR_INVALID,
                    "nccl: %s from a thread whose current device is %d, but the communicator "
                    "was made on device %d (call it from the thread that made it)",
                    what, dev, im->device);
  return PX_OK;
}

static bool reduction_type(px_dtype t, ncclDataType_t *out) {
  switch (t) {
  case PX_F32: *out = ncclFloat32; return true;
  case PX_F64: *out = ncclFloat64; return true;
  case PX_I32: *out = ncclInt32; return true;
  case PX_I64: *out = ncclInt64; return true;
  case PX_BF16: *out = ncclBfloat16; return true;
  case PX_F16: *out = ncclFloat16; return true;
  default: return false;
  }
}

static ncclRedOp_t red_op(px_reduce_op op) {
  switch (op) {
  case PX_SUM: return ncclSum;
  case PX_AVG: return ncclAvg;
  case PX_MIN: return ncclMin;
  case PX_MAX: return ncclMax;
  }
  return ncclSum;
}

/* ---- Starting and completing ------------------------------------------------- */

static px_status req_new(px_comm *c, op_kind k, size_t count, nccl_req **out) {
  nccl_req *r = calloc(1, sizeof *r);
  if (!r) return px_error(PX_ERR_NOMEM, "nccl: out of memory for a request");
  r->base.ops = &px_comm_nccl_ops;
  r->c = c;
  r->kind = k;
  r->count = count;
  *out = r;
  return PX_OK;
}

static void req_free(nccl_req *r) {
  if (!r) return;
  if (r->done) cudaEventDestroy(r->done);
  free(r);
}

/* Queues the operation on the comm stream after the compute stream's work.
 * Device pointers only.  count: elements (allgather: per rank; reduce_scatter:
 * the received piece). */
static px_status start_device(px_comm *c, op_kind k, const void *send, void *recv, size_t count, px_dtype dtype,
                              px_reduce_op op, int root, nccl_req **out) {
  *out = NULL;
  nccl_impl *im = impl_of(c);
  cudaStream_t compute = px_cuda_compute_stream(), comm = px_cuda_comm_stream();
  nccl_req *r = NULL;
  TRY(req_new(c, k, count, &r));
  px_status st = cuda_st(cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming), "cudaEventCreate");
  if (st == PX_OK) st = cuda_st(cudaEventRecord(im->ready, compute), "cudaEventRecord on the compute stream");
  if (st == PX_OK) st = cuda_st(cudaStreamWaitEvent(comm, im->ready, 0), "cudaStreamWaitEvent on the comm stream");
  if (st != PX_OK) {
    req_free(r);
    return st;
  }
  const size_t es = px_dtype_size(dtype);
  ncclDataType_t nt = ncclFloat32;
  ncclResult_t res = ncclSuccess;
  switch (k) {
  case OP_ALLREDUCE:
  case OP_BARRIER:
    reduction_type(dtype, &nt);
    res = ncclAllReduce(send, recv, count, nt, red_op(op), im->nc, comm);
    break;
  case OP_REDUCE_SCATTER:
    reduction_type(dtype, &nt);
    res = ncclReduceScatter(send, recv, count, nt, red_op(op), im->nc, comm);
    break;
  case OP_BROADCAST:  // bytes as they are: any dtype
    res = ncclBroadcast(send, recv, count * es, ncclUint8, root, im->nc, comm);
    break;
  case OP_ALLGATHER: res = ncclAllGather(send, recv, count * es, ncclUint8, im->nc, comm); break;
  }
  char what[96];
  snprintf(what, sizeof what, "%s of %zu elements", op_name(k), count);
  st = nccl_st(res, what);
  if (st == PX_OK) st = cuda_st(cudaEventRecord(r->done, comm), "cudaEventRecord on the comm stream");
  if (st != PX_OK) {
    req_free(r);
    return st;
  }
  *out = r;
  return PX_OK;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void nap_us(long us) {
  struct timespec ts = {0, us * 1000L};
  nanosleep(&ts, NULL);
}

static void *abort_main(void *arg) {
  nccl_impl *im = arg;
  cudaSetDevice(im->device);
  ncclCommAbort(im->aborting);
  return NULL;
}

/* Marks the communicator aborted (every later operation fails at once) and
 * aborts the NCCL communicator on a helper thread: ncclCommAbort frees
 * device memory, which waits for the work already queued on the device, so
 * with a stream held up (a host function, a kernel that never ends) it
 * returns only when that work does (in the watchdog test, a 3 s stall held
 * the caller 3 s past a 0.5 s timeout).  The caller gets its error at the
 * bound; n_free joins the thread. */
static void abort_nccl(nccl_impl *im, const char *why) {
  if (im->aborted) return;
  im->aborted = true;
  snprintf(im->abort_msg, sizeof im->abort_msg, "%s", why);
  im->aborting = im->nc;
  im->nc = NULL;
  if (!im->aborting) return;
  if (pthread_create(&im->abort_thread, NULL, abort_main, im) == 0) im->abort_running = true;
  else ncclCommAbort(im->aborting);
}

/* Polls r's event until it completes, NCCL reports an error, or the
 * timeout passes.  Spins (yielding) for the first millisecond, then naps. */
static px_status poll_done(nccl_req *r) {
  px_comm *c = r->c;
  nccl_impl *im = impl_of(c);
  if (!r->done) return PX_OK;
  const double t0 = now_s(), timeout = c->timeout;
  for (unsigned polls = 0;; polls++) {
    cudaError_t e = cudaEventQuery(r->done);
    if (e == cudaSuccess) return PX_OK;
    if (e != cudaErrorNotReady) {
      char what[96];
      snprintf(what, sizeof what, "%s of %zu elements", op_name(r->kind), r->count);
      return px_error(PX_ERR_COMM, "nccl: %s (%s): %s", what, c->label[0] ? c->label : "no label set",
                      cudaGetErrorString(e));
    }
    if (im->aborted)
      return px_error(PX_ERR_COMM, "nccl: %s of %zu elements: the communicator was aborted (%s)", op_name(r->kind),
                      r->count, im->abort_msg);
    if ((polls & 63) == 0) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(im->nc, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s of %zu elements (%s) failed: %s", op_name(r->kind), r->count,
                 c->label[0] ? c->label : "no label set", ncclGetErrorString(async));
        abort_nccl(im, msg);
        return px_error(PX_ERR_COMM, "nccl: rank %d: %s", c->rank, msg);
      }
    }
    const double waited = now_s() - t0;
    if (timeout > 0 && waited > timeout) {
      char msg[256];
      snprintf(msg, sizeof msg,
               "rank %d: watchdog: nccl %s of %zu elements (%s) did not complete within %g s; "
               "aborting the NCCL communicator",
               c->rank, op_name(r->kind), r->count, c->label[0] ? c->label : "no label set", timeout);
      fprintf(stderr, "plexus: %s\n", msg);
      fflush(stderr);
      abort_nccl(im, msg);
      return px_error(PX_ERR_TIMEOUT, "%s", msg);
    }
    if (waited < 1e-3) sched_yield();
    else nap_us(waited < 0.1 ? 20 : 200);
  }
}

/* Completes r: the host waits (watchdog), the compute stream is ordered
 * after the collective.  Frees r. */
static px_status finish(nccl_req *r) {
  px_status st = poll_done(r);
  if (st == PX_OK && r->done)
    st = cuda_st(cudaStreamWaitEvent(px_cuda_compute_stream(), r->done, 0),
                 "cudaStreamWaitEvent on the compute stream");
  req_free(r);
  return st;
}

/* ---- Host buffers: staged through device memory -------------------------------- */

static px_status is_device(const void *p, bool *dev) {
  return px_cuda_is_device_memory(p, dev); /* its message names the pointer */
}

/* Runs one collective to completion.  send_bytes / recv_bytes: the sizes of
 * the two buffers (in place: send == recv). */
static px_status run(px_comm *c, op_kind k, const void *send, void *recv, size_t count, px_dtype dtype, px_reduce_op op,
                     int root, size_t send_bytes, size_t recv_bytes) {
  TRY(check_usable(c, op_name(k)));
  if (count == 0) return PX_OK;  // every rank passes the same count: all skip alike
  const bool in_place = send == recv;
  bool send_dev = true, recv_dev = true;
  if (send_bytes) TRY(is_device(send, &send_dev));
  if (recv_bytes) TRY(is_device(recv, &recv_dev));
  void *ds = (void *)send, *dr = recv;
  px_status st = PX_OK;
  if (!send_dev) {
    ds = px_cuda_malloc(send_bytes);
    if (!ds)
      return px_error(PX_ERR_NOMEM, "nccl: %s: no device memory to stage %zu host bytes", op_name(k), send_bytes);
    st = px_cuda_to_device(ds, send, send_bytes);
  }
  if (in_place) dr = ds;
  else if (!recv_dev && st == PX_OK) {
    dr = px_cuda_malloc(recv_bytes);
    if (!dr) st = px_error(PX_ERR_NOMEM, "nccl: %s: no device memory to stage %zu host bytes", op_name(k), recv_bytes);
  }
  nccl_req *r = NULL;
  if (st == PX_OK) st = start_device(c, k, ds, dr, count, dtype, op, root, &r);
  if (st == PX_OK) st = finish(r);
  if (st == PX_OK && !recv_dev && recv_bytes) st = px_cuda_to_host(recv, dr, recv_bytes);
  if (st == PX_OK) st = cuda_st(cudaStreamSynchronize(px_cuda_comm_stream()), "cudaStreamSynchronize (comm stream)");
  if (!send_dev) px_cuda_free(ds);
  if (!in_place && !recv_dev) px_cuda_free(dr);
  return st;
}

/* The asynchronous form: device buffers start and return a request; a host
 * buffer runs the operation to completion and returns a completed one. */
static px_status run_async(px_comm *c, op_kind k, const void *send, void *recv, size_t count, px_dtype dtype,
                           px_reduce_op op, int root, size_t send_bytes, size_t recv_bytes, px_request **req) {
  TRY(check_usable(c, op_name(k)));
  bool send_dev = true, recv_dev = true;
  if (send_bytes) TRY(is_device(send, &send_dev));
  if (recv_bytes) TRY(is_device(recv, &recv_dev));
  nccl_req *r = NULL;
  if (send_dev && recv_dev && count > 0) {
    TRY(start_device(c, k, send, recv, count, dtype, op, root, &r));
  } else {
    TRY(run(c, k, send, recv, count, dtype, op, root, send_bytes, recv_bytes));
    TRY(req_new(c, k, count, &r));
  }
  *req = &r->base;
  return PX_OK;
}

static px_status check_reduce_type(px_dtype dtype, const char *what) {
  ncclDataType_t nt;
  if (!reduction_type(dtype, &nt))
    return px_error(PX_ERR_UNSUPPORTED, "nccl: %s: dtype %s cannot be reduced", what, px_dtype_name(dtype));
  return PX_OK;
}

/* ---- The ops table ----------------------------------------------------------------- */

static px_status n_allreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op) {
  TRY(check_reduce_type(dtype, "allreduce"));
  const size_t b = count * px_dtype_size(dtype);
  return run(c, OP_ALLREDUCE, buf, buf, count, dtype, op, 0, b, b);
}

static px_status n_broadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root) {
  const size_t b = count * px_dtype_size(dtype);
  return run(c, OP_BROADCAST, buf, buf, count, dtype, PX_SUM, root, b, b);
}

static px_status n_allgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype) {
  const size_t b = count * px_dtype_size(dtype);
  return run(c, OP_ALLGATHER, send, recv, count, dtype, PX_SUM, 0, b, b * (size_t)c->size);
}

static px_status n_reduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                  px_reduce_op op) {
  TRY(check_reduce_type(dtype, "reduce_scatter"));
  const size_t b = count * px_dtype_size(dtype);
  return run(c, OP_REDUCE_SCATTER, send, recv, count, dtype, op, 0, b * (size_t)c->size, b);
}

static px_status n_barrier(px_comm *c) {
  TRY(check_usable(c, "barrier"));
  nccl_impl *im = impl_of(c);
  nccl_req *r = NULL;
  TRY(start_device(c, OP_BARRIER, im->scratch, im->scratch, 1, PX_I32, PX_SUM, 0, &r));
  TRY(finish(r));
  return cuda_st(cudaStreamSynchronize(px_cuda_comm_stream()), "cudaStreamSynchronize (comm stream)");
}

static px_status no_p2p(const char *what) {
  return px_error(PX_ERR_UNSUPPORTED,
                  "nccl: %s: point-to-point messages are not supported on an NCCL "
                  "communicator (NCCL matches them by order, not tag); use the bootstrap communicator",
                  what);
}

static px_status n_send(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag) {
  return no_p2p("send");
}

static px_status n_recv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag) {
  return no_p2p("recv");
}

static px_status n_isend(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag,
                         px_request **req) {
  return no_p2p("isend");
}

static px_status n_irecv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag, px_request **req) {
  return no_p2p("irecv");
}

static px_status n_iallreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op, px_request **req) {
  TRY(check_reduce_type(dtype, "iallreduce"));
  const size_t b = count * px_dtype_size(dtype);
  return run_async(c, OP_ALLREDUCE, buf, buf, count, dtype, op, 0, b, b, req);
}

static px_status n_ibroadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root, px_request **req) {
  const size_t b = count * px_dtype_size(dtype);
  return run_async(c, OP_BROADCAST, buf, buf, count, dtype, PX_SUM, root, b, b, req);
}

static px_status n_iallgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                              px_request **req) {
  const size_t b = count * px_dtype_size(dtype);
  return run_async(c, OP_ALLGATHER, send, recv, count, dtype, PX_SUM, 0, b, b * (size_t)c->size, req);
}

static px_status n_ireduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                   px_reduce_op op, px_request **req) {
  TRY(check_reduce_type(dtype, "ireduce_scatter"));
  const size_t b = count * px_dtype_size(dtype);
  return run_async(c, OP_REDUCE_SCATTER, send, recv, count, dtype, op, 0, b * (size_t)c->size, b, req);
}

static px_status n_request_test(px_request *base, bool *done) {
  nccl_req *r = (nccl_req *)base;
  *done = false;
  if (!r->done) {
    *done = true;
    return PX_OK;
  }
  nccl_impl *im = impl_of(r->c);
  if (im->aborted)
    return px_error(PX_ERR_COMM, "nccl: %s of %zu elements: the communicator was aborted (%s)", op_name(r->kind),
                    r->count, im->abort_msg);
  cudaError_t e = cudaEventQuery(r->done);
  if (e == cudaSuccess) {
    *done = true;
    return PX_OK;
  }
  if (e == cudaErrorNotReady) return PX_OK;
  return px_error(PX_ERR_COMM, "nccl: %s of %zu elements: %s", op_name(r->kind), r->count, cudaGetErrorString(e));
}

static px_status n_request_wait(px_request *base) { return finish((nccl_req *)base); }

/* ---- Communicators ------------------------------------------------------------------- */

static px_status make_comm(ncclComm_t nc, px_comm *bootstrap, int device, px_comm **out) {
  *out = NULL;
  int rank = 0, size = 1;
  px_status st = nccl_st(ncclCommUserRank(nc, &rank), "ncclCommUserRank");
  if (st == PX_OK) st = nccl_st(ncclCommCount(nc, &size), "ncclCommCount");
  nccl_impl *im = st == PX_OK ? calloc(1, sizeof *im) : NULL;
  px_comm *c = im ? px_comm_alloc(&px_comm_nccl_ops, PX_COMM_NCCL, rank, size) : NULL;
  if (st == PX_OK && !c) st = px_error(PX_ERR_NOMEM, "nccl: out of memory for a communicator");
  if (st == PX_OK) st = cuda_st(cudaEventCreateWithFlags(&im->ready, cudaEventDisableTiming), "cudaEventCreate");
  if (st == PX_OK) {
    im->scratch = px_cuda_malloc(256);
    if (!im->scratch) st = px_error(PX_ERR_NOMEM, "nccl: no device memory for the communicator's scratch");
  }
  if (st != PX_OK) {
    if (im && im->ready) cudaEventDestroy(im->ready);
    free(im);
    free(c);
    ncclCommDestroy(nc);
    return st;
  }
  im->nc = nc;
  im->device = device;
  im->bootstrap = bootstrap;
  c->impl = im;
  c->timeout = bootstrap ? bootstrap->timeout : PX_COMM_DEFAULT_TIMEOUT;
  *out = c;
  return PX_OK;
}

static uint64_t host_hash(void) {
  char name[256] = "";
  gethostname(name, sizeof name - 1);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h;
}

/* local rank and size from the hosts of c's ranks (allgather through c). */
static px_status set_local(px_comm *c) {
  int64_t mine = (int64_t)host_hash();
  int64_t *all = calloc((size_t)c->size, sizeof *all);
  if (!all) return px_error(PX_ERR_NOMEM, "nccl: out of memory");
  px_status st = n_allgather(c, &mine, all, 1, PX_I64);
  if (st == PX_OK) {
    int lr = 0, ls = 0;
    for (int r = 0; r < c->size; r++)
      if (all[r] == mine) {
        ls++;
        if (r < c->rank) lr++;
      }
    c->local_rank = lr;
    c->local_size = ls;
  }
  free(all);
  return st;
}

static px_status n_split(px_comm *c, int color, int key, px_comm **out) {
  TRY(check_usable(c, "split"));
  nccl_impl *im = impl_of(c);
  ncclComm_t nc = NULL;
  TRY(nccl_st(ncclCommSplit(im->nc, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, NULL), "ncclCommSplit"));
  if (color < 0 || !nc) return PX_OK;
  px_comm *s = NULL;
  TRY(make_comm(nc, im->bootstrap, im->device, &s));
  s->timeout = c->timeout;
  px_status st = set_local(s);
  if (st != PX_OK) {
    s->ops->free(s);
    return st;
  }
  *out = s;
  return PX_OK;
}

static void n_abort(px_comm *c, const char *why) {
  nccl_impl *im = impl_of(c);
  fprintf(stderr, "plexus: rank %d: %s\n", c->rank, why);
  fflush(stderr);
  abort_nccl(im, why);
  if (im->bootstrap) px_comm_abort(im->bootstrap, why);
}

static void n_free(px_comm *c) {
  nccl_impl *im = impl_of(c);
  if (im) {
    if (!im->aborted && im->nc) ncclCommDestroy(im->nc);
    if (im->abort_running) pthread_join(im->abort_thread, NULL);
    if (im->ready) cudaEventDestroy(im->ready);
    px_cuda_free(im->scratch);
    free(im);
  }
  free(c);
}

const px_comm_ops px_comm_nccl_ops = {
  .name = "nccl",
  .allreduce = n_allreduce,
  .broadcast = n_broadcast,
  .allgather = n_allgather,
  .reduce_scatter = n_reduce_scatter,
  .barrier = n_barrier,
  .send = n_send,
  .recv = n_recv,
  .iallreduce = n_iallreduce,
  .ibroadcast = n_ibroadcast,
  .iallgather = n_iallgather,
  .ireduce_scatter = n_ireduce_scatter,
  .isend = n_isend,
  .irecv = n_irecv,
  .request_test = n_request_test,
  .request_wait = n_request_wait,
  .split = n_split,
  .abort = n_abort,
  .free = n_free,
};

bool px_comm_nccl_available(void) { return px_cuda_device_count() > 0; }

px_status px_comm_nccl_create(px_comm *bootstrap, px_comm **out) {
  if (!out) return px_error(PX_ERR_INVALID, "px_comm_nccl_create: out is NULL");
  *out = NULL;
  if (!bootstrap) return px_error(PX_ERR_INVALID, "px_comm_nccl_create: the bootstrap communicator is NULL");
  if (bootstrap->backend == PX_COMM_NCCL)
    return px_error(PX_ERR_INVALID,
                    "px_comm_nccl_create: the bootstrap is an NCCL communicator already "
                    "(use px_comm_split to make a sub-group)");
  // Every rank takes part in the agreement below, even one that failed
  // here: a rank missing from ncclCommInitRank would stall the others.
  const int device = px_cuda_current_device();
  px_status mine = PX_OK;
  char why[300] = "";
  if (device < 0) {
    mine = px_cuda_device_count() == 0
      ? px_error(PX_ERR_UNSUPPORTED,
                 "px_comm_nccl_create: no CUDA device is visible to this process "
                 "(rank %d); NCCL needs one GPU per rank",
                 bootstrap->rank)
      : px_error(PX_ERR_INVALID,
                 "px_comm_nccl_create: rank %d's thread has no current CUDA device; call "
                 "px_cuda_init(local rank) on it first",
                 bootstrap->rank);
    snprintf(why, sizeof why, "%s", px_last_error());
  }
  struct {
    int32_t ok;
    ncclUniqueId id;
  } hello;
  memset(&hello, 0, sizeof hello);
  hello.ok = mine == PX_OK;
  if (bootstrap->rank == 0 && mine == PX_OK) {
    mine = nccl_st(ncclGetUniqueId(&hello.id), "ncclGetUniqueId");
    if (mine != PX_OK) {
      snprintf(why, sizeof why, "%s", px_last_error());
      hello.ok = 0;
    }
  }
  int32_t all_ok = hello.ok;
  px_comm_set_label(bootstrap, "NCCL start-up: do all ranks have a GPU");
  TRY(px_comm_allreduce(bootstrap, &all_ok, 1, PX_I32, PX_MIN));
  if (!all_ok) {
    if (mine != PX_OK) return px_error(mine, "%s", why);
    return px_error(PX_ERR_COMM,
                    "px_comm_nccl_create: another rank could not join (no GPU, or px_cuda_init "
                    "not called on its thread); see its message");
  }
  px_comm_set_label(bootstrap, "NCCL start-up: broadcast of the unique id");
  TRY(px_comm_broadcast(bootstrap, &hello, sizeof hello, PX_U8, 0));
  ncclComm_t nc = NULL;
  char what[96];
  snprintf(what, sizeof what, "ncclCommInitRank (rank %d of %d, device %d)", bootstrap->rank, bootstrap->size, device);
  TRY(nccl_st(ncclCommInitRank(&nc, bootstrap->size, hello.id, bootstrap->rank), what));
  px_comm *c = NULL;
  TRY(make_comm(nc, bootstrap, device, &c));
  c->local_rank = bootstrap->local_rank;
  c->local_size = bootstrap->local_size;
  snprintf(c->label, sizeof c->label, "%s", bootstrap->label);
  *out = c;
  return PX_OK;
}

#else
typedef int px_nccl_needs_cuda; /* an empty translation unit is not ISO C */
#endif
