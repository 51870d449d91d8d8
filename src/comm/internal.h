/* comm/internal.h — what the comm backends share: the px_comm object with
 * its backend table (ggml-style: a small table of functions, the object
 * first), the request header, and helpers used by more than one backend.
 *
 * comm.c validates every argument before it reaches a backend, so a backend
 * may assume: c and its buffers are non-NULL when count > 0, dtypes and
 * reduce ops are in range (and reducible where they must be), roots and
 * peers are ranks of c, tags are >= 0, req is non-NULL. */
#ifndef PX_COMM_INTERNAL_H
#define PX_COMM_INTERNAL_H

#include "plexus/comm.h"

#define PX_COMM_LABEL_MAX 128
#define PX_COMM_DEFAULT_TIMEOUT 600.0

typedef struct px_comm_ops {
  const char *name;
  /* Blocking collectives and point-to-point. */
  px_status (*allreduce)(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op);
  px_status (*broadcast)(px_comm *c, void *buf, size_t count, px_dtype dtype, int root);
  px_status (*allgather)(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype);
  px_status (*reduce_scatter)(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype, px_reduce_op op);
  px_status (*barrier)(px_comm *c);
  px_status (*send)(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag);
  px_status (*recv)(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag);
  /* Asynchronous variants: start, return a request. */
  px_status (*iallreduce)(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op, px_request **req);
  px_status (*ibroadcast)(px_comm *c, void *buf, size_t count, px_dtype dtype, int root, px_request **req);
  px_status (*iallgather)(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype, px_request **req);
  px_status (*ireduce_scatter)(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype, px_reduce_op op,
                               px_request **req);
  px_status (*isend)(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag, px_request **req);
  px_status (*irecv)(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag, px_request **req);
  px_status (*request_test)(px_request *r, bool *done);
  px_status (*request_wait)(px_request *r); /* frees r */
  /* Sub-groups, failure, teardown. */
  px_status (*split)(px_comm *c, int color, int key, px_comm **out);
  void (*abort)(px_comm *c, const char *why);
  void (*free)(px_comm *c);
} px_comm_ops;

struct px_comm {
  const px_comm_ops *ops;
  px_comm_backend backend;
  int rank, size;
  int local_rank, local_size;
  double timeout;                /* seconds; <= 0: no watchdog */
  char label[PX_COMM_LABEL_MAX]; /* printed by the watchdog */
  bool owned_by_run;             /* px_comm_run frees it, px_comm_free ignores it */
  bool debug_collectives;        /* fingerprint every collective first (fingerprint.c) */
  uint64_t debug_seq;            /* collectives checked so far on this rank */
  void *impl;                    /* the backend's state */
};

/* Every backend's request starts with this header, so px_request_test and
 * px_request_wait can find the table of the backend that made it. */
struct px_request {
  const px_comm_ops *ops;
};

/* A new px_comm with the common fields set (timeout default, empty label). */
px_comm *px_comm_alloc(const px_comm_ops *ops, px_comm_backend backend, int rank, int size);

/* buf[i] /= n for i < count: PX_AVG is the sum divided by the size, in the
 * element type (integers truncate toward zero). */
void px_comm_divide(void *buf, size_t count, px_dtype dtype, int n);

/* True for the dtypes reductions accept: F32, F64, I32, I64. */
bool px_comm_reducible(px_dtype dtype);

/* "allreduce", "broadcast", ... for messages. */
const char *px_comm_op_name(px_reduce_op op);

/* Backends. */
extern const px_comm_ops px_comm_self_ops;
extern const px_comm_ops px_comm_threads_ops;

/* Run fn on n threads, each with its rank of one threads communicator. */
px_status px_comm_threads_run(int n, px_rank_fn fn, void *arg, int *exit_code);
/* Under MPI: init, fn(world), abort on non-zero, finalize. */
px_status px_comm_mpi_run(px_rank_fn fn, void *arg, int *exit_code);

/* launch_env.c: launches plexus cannot join.  Before any rank starts: a
 * foreign launcher's variables (torchrun's WORLD_SIZE > 1, RANK, LOCAL_RANK)
 * without an MPI launch is an error saying how to launch.  Under MPI, a
 * world size other than the environment's (WORLD_SIZE, the launcher's
 * count) is one too.  PX_IGNORE_LAUNCH_ENV=1 skips both. */
px_status px_comm_check_launch_env(void);
px_status px_comm_check_world_size(int mpi_size);
/* px_comm_mpi_run with px_comm_check_world_size agreed by every rank first
 * (fn is not called and the error returned when it fails). */
px_status px_comm_mpi_run_checked(px_rank_fn fn, void *arg, int *exit_code);

#endif
