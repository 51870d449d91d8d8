/* plexus/comm.h — px_comm: ranks, collectives, point-to-point, sub-groups.
 *
 * Every parallel strategy speaks this one interface (DESIGN decision 3); the
 * backend is chosen at start-up:
 *   self     a world of one (no communication at all);
 *   threads  N ranks as threads of one process over shared memory, no MPI;
 *   mpi      MPI-3 (Open MPI, MPICH) under mpirun / mpiexec / srun;
 *   nccl     NCCL over the GPUs (built with CUDA): made from any of the
 *            above with px_comm_nccl_create; its buffers are DEVICE memory.
 *
 * All buffers are host memory (nccl: device memory; see below).  Collectives are called by every rank of the
 * communicator in the same order (as in MPI).  In-place: allreduce and
 * broadcast work on `buf`.  Counts are elements, not bytes.
 *
 * Watchdog (DESIGN decision 6): every blocking wait has a deadline (default
 * 600 s, px_comm_set_timeout).  When it passes, the rank prints which
 * collective it was in, the label set by the caller (step, bucket) and which
 * ranks it was waiting on, and the whole job ends with that error: MPI_Abort
 * under MPI; under threads every rank's pending and future calls fail with
 * PX_ERR_TIMEOUT so px_comm_run returns.  A rank that fails (returns non-zero
 * from its function, or calls px_comm_abort) makes its peers fail the same
 * way instead of hanging. */
#ifndef PLEXUS_COMM_H
#define PLEXUS_COMM_H

#include "plexus/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

typedef struct px_comm px_comm;
typedef struct px_request px_request;

typedef enum px_reduce_op { PX_SUM = 0, PX_AVG, PX_MIN, PX_MAX } px_reduce_op;
typedef enum px_comm_backend { PX_COMM_SELF = 0, PX_COMM_THREADS, PX_COMM_MPI, PX_COMM_NCCL } px_comm_backend;

/* ---- Start-up ---------------------------------------------------------------
 * px_comm_run is the usual entry point:
 *   - started by an MPI launcher (mpirun, mpiexec, srun with PMI/PMIx) and
 *     plexus built with MPI: initialises MPI, calls fn once in this process
 *     with the world communicator, finalises;
 *   - else n_threads > 1: runs fn on n_threads threads, each with its own
 *     rank of a threads communicator, and joins them;
 *   - else: fn once with a world of one.
 * *exit_code is the first non-zero value any rank returned (0 if all
 * succeeded).  Returns an error status only if the backend could not start.
 * The communicator passed to fn belongs to px_comm_run (px_comm_free
 * ignores it).  Under MPI a rank whose fn returns non-zero ends the job
 * with MPI_Abort(that code) instead of returning, so its peers cannot hang.
 * Launches it cannot join fail before fn runs, with a message saying how to
 * launch: torchrun's variables (WORLD_SIZE > 1, RANK, LOCAL_RANK) without
 * an MPI launcher (PX_ERR_UNSUPPORTED), and an MPI world of another size
 * than WORLD_SIZE or the launcher's count (PX_ERR_COMM, every rank alike);
 * PX_IGNORE_LAUNCH_ENV=1 skips both (docs/PARALLEL.md). */
typedef int (*px_rank_fn)(px_comm *comm, void *arg);
px_status px_comm_run(int n_threads, px_rank_fn fn, void *arg, int *exit_code);

/* True when this process was started by an MPI launcher. */
bool px_comm_mpi_launched(void);
/* True when plexus was built with the MPI backend. */
bool px_comm_mpi_available(void);

/* Lower-level starts, for programs that manage the lifetime themselves. */
px_status px_comm_init_self(px_comm **out);
/* px_comm_init_mpi initialises MPI if the program has not, at
 * MPI_THREAD_MULTIPLE: a watchdog thread watches MPI's blocking collectives
 * (docs/PARALLEL.md, "How a rank waits under MPI").  With
 * PX_COMM_MPI_WAIT=poll in the environment, or MPI already initialised
 * below MULTIPLE, blocking collectives use plexus's polling wait instead. */
px_status px_comm_init_mpi(px_comm **out);
void px_comm_finalize_mpi(void); /* MPI_Finalize if we initialised it */

/* ---- NCCL: the GPUs' communicator ----------------------------------------
 * Collective over `bootstrap` (self, threads or MPI: one process per GPU, or
 * one thread per GPU under threads as FluxDistributed.jl does): rank 0 makes
 * an NCCL unique id and broadcasts it over bootstrap, every rank joins with
 * the calling thread's current device (px_cuda_init(local rank) must have
 * run on this thread; under threads each thread needs its own GPU).  Same
 * rank, size, local rank, timeout and label as the bootstrap, which must
 * outlive the new communicator (px_comm_abort on it aborts the bootstrap
 * too, so the job ends as the bootstrap's backend ends it).
 *   Buffers are DEVICE pointers (host pointers also work: they are staged
 * through device memory, blocking).  Every operation runs on the calling
 * thread's communication stream after the work already queued on its
 * compute stream; completing a request (px_request_wait) makes the compute
 * stream wait for the collective, and blocks the host until the collective
 * has finished, under the watchdog: past the timeout the NCCL communicator
 * is aborted and the wait returns PX_ERR_TIMEOUT naming the collective, its
 * element count and the label.  Reductions: F32, F64, I32, I64 and BF16
 * (PX_AVG is ncclAvg); broadcast and allgather move any dtype.  Point-to-point
 * (send/recv) is not supported (PX_ERR_UNSUPPORTED).  A thread must use a
 * communicator only with its own device current.
 *   Without CUDA/NCCL in the build, or without a GPU: PX_ERR_UNSUPPORTED
 * with a message saying so. */
px_status px_comm_nccl_create(px_comm *bootstrap, px_comm **out);
/* True when plexus was built with CUDA and NCCL and this process sees a GPU. */
bool px_comm_nccl_available(void);

/* Free a communicator (NULL, and those px_comm_run owns, are left alone). */
void px_comm_free(px_comm *c);

/* ---- Who am I --------------------------------------------------------------
 * A NULL communicator reads as a world of one (rank 0, size 1, self). */
int px_comm_rank(const px_comm *c);
int px_comm_size(const px_comm *c);
/* Rank and size among the ranks on this node (MPI: MPI_COMM_TYPE_SHARED;
 * threads: same as rank and size). */
int px_comm_local_rank(const px_comm *c);
int px_comm_local_size(const px_comm *c);
px_comm_backend px_comm_backend_of(const px_comm *c);
const char *px_comm_backend_name(px_comm_backend b);

/* ---- Watchdog and failure -------------------------------------------------
 * seconds <= 0 turns the watchdog off for c. */
void px_comm_set_timeout(px_comm *c, double seconds);
double px_comm_timeout(const px_comm *c);
/* Context printed by the watchdog ("step 12, bucket 3"); copied. */
void px_comm_set_label(px_comm *c, const char *label);
/* End the job with `why` (printed once with the rank): MPI_Abort under MPI;
 * under threads all ranks' communication fails with PX_ERR_COMM. */
void px_comm_abort(px_comm *c, const char *why);

/* ---- Blocking collectives --------------------------------------------------
 * dtype: PX_F32, PX_F64, PX_I32, PX_I64 for reductions; any dtype for
 * broadcast, gather and point-to-point (bytes are moved as they are).
 * PX_AVG is the sum divided by the size (integers: truncated). */
px_status px_comm_allreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op);
px_status px_comm_broadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root);
/* recv: size × count elements, rank r's block at r × count. */
px_status px_comm_allgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype);
/* send: size × count elements; rank r receives the reduction of block r. */
px_status px_comm_reduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                 px_reduce_op op);
px_status px_comm_barrier(px_comm *c);
/* Point-to-point: tags >= 0; a receive matches the oldest message from src
 * with its tag, and may be larger than the message (not smaller).  A send
 * may or may not wait for its receive (threads and self copy the message
 * and return; MPI waits for large ones): when every rank sends before it
 * receives, use isend.  Self: sending to oneself queues the message; a
 * receive that no earlier send matches fails with PX_ERR_INVALID. */
px_status px_comm_send(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag);
px_status px_comm_recv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag);

/* ---- Asynchronous variants -------------------------------------------------
 * Start the operation and return at once with a request; the buffers must
 * stay untouched until px_request_wait returns.  Collectives of one
 * communicator complete in the order they were started on every rank;
 * point-to-point operations are matched by source and tag (as in MPI), not
 * ordered with the collectives. */
px_status px_comm_iallreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op, px_request **req);
px_status px_comm_ibroadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root, px_request **req);
px_status px_comm_iallgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype, px_request **req);
px_status px_comm_ireduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                  px_reduce_op op, px_request **req);
px_status px_comm_isend(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag, px_request **req);
px_status px_comm_irecv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag, px_request **req);
/* *done = whether it completed; does not free. */
px_status px_request_test(px_request *r, bool *done);
/* Waits (under the watchdog) and frees the request. */
px_status px_request_wait(px_request *r);

/* ---- Sub-groups -------------------------------------------------------------
 * Ranks with the same color form a new communicator, ordered by key then by
 * old rank (MPI_Comm_split).  Collective over c.  The new communicator
 * inherits the timeout.  A negative color leaves the rank out: *out = NULL
 * (MPI_UNDEFINED). */
px_status px_comm_split(px_comm *c, int color, int key, px_comm **out);

/* ---- Helpers for training scripts ----------------------------------------- */
/* Global mean of a scalar metric (the course's all_reduce(loss, AVG)). */
px_status px_comm_mean(px_comm *c, double *value);
/* printf on rank 0 only. */
void px_print0(const px_comm *c, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 2, 3)))
#endif
  ;
/* Every rank prints, in rank order, each line prefixed "[rank r/size] "
 * (FluxMPI's fluxmpi_println).  Collective. */
px_status px_print_ordered(px_comm *c, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 2, 3)))
#endif
  ;

/* ---- Debugging: collective fingerprints ------------------------------------
 * A collective called with different arguments on different ranks (one
 * rank skips it, or passes another size) hangs or sums mismatched buffers.
 * With this mode on, every collective (blocking, asynchronous, and split)
 * first exchanges a small record of what each rank is about to call: the
 * operation, count, dtype, reduce op, root, the caller's file and line and
 * the communicator's call number (with the label, shown but not compared,
 * since labels may name a rank's part).  On the first divergence no rank
 * runs the collective and every rank returns PX_ERR_COMM with a message
 * naming both sides, e.g. "collective #17 differs between ranks (count):
 * rank 0 allreduce 1024 F32 SUM 'DDP step 3, bucket 2' at parallel/ddp.c:96;
 * rank 1 allreduce 512 F32 SUM ...".  A rank that skips a collective meets
 * the others with its next one (reported); one that never calls another
 * leaves the others waiting until the watchdog, whose message then names
 * the "fingerprint exchange before <op> #<n>".  Point-to-point calls are
 * not checked (their arguments differ by design).
 *   On for a communicator when PX_DEBUG_COLLECTIVES=1 (or on, true, yes,
 * detail) is in the environment as it is made (`plexus train
 * --debug-collectives` sets it), or after px_comm_set_debug_collectives;
 * sub-groups made by px_comm_split inherit it.  Every rank of a
 * communicator must agree (set it on every rank: mpirun -x
 * PX_DEBUG_COLLECTIVES=1), else the exchanges meet real collectives.  Off,
 * it costs one branch per collective; on, one blocking all-gather of 232
 * bytes a rank before each collective, which also makes asynchronous
 * collectives wait until every rank has started them (docs/RELIABILITY.md). */
void px_comm_set_debug_collectives(px_comm *c, bool on);
bool px_comm_debug_collectives(const px_comm *c);

/* The collectives with their caller's file and line, for the fingerprints:
 * the macros below make every px_comm_allreduce(...) etc. in a program that
 * includes this header call these with __FILE__ and __LINE__ (define
 * PX_COMM_NO_CALL_SITES before including it to call the plain functions,
 * whose site then reads "unknown").  file may be NULL. */
px_status px_comm_allreduce_at(const char *file, int line, px_comm *c, void *buf, size_t count, px_dtype dtype,
                               px_reduce_op op);
px_status px_comm_broadcast_at(const char *file, int line, px_comm *c, void *buf, size_t count, px_dtype dtype,
                               int root);
px_status px_comm_allgather_at(const char *file, int line, px_comm *c, const void *send, void *recv, size_t count,
                               px_dtype dtype);
px_status px_comm_reduce_scatter_at(const char *file, int line, px_comm *c, const void *send, void *recv, size_t count,
                                    px_dtype dtype, px_reduce_op op);
px_status px_comm_barrier_at(const char *file, int line, px_comm *c);
px_status px_comm_iallreduce_at(const char *file, int line, px_comm *c, void *buf, size_t count, px_dtype dtype,
                                px_reduce_op op, px_request **req);
px_status px_comm_ibroadcast_at(const char *file, int line, px_comm *c, void *buf, size_t count, px_dtype dtype,
                                int root, px_request **req);
px_status px_comm_iallgather_at(const char *file, int line, px_comm *c, const void *send, void *recv, size_t count,
                                px_dtype dtype, px_request **req);
px_status px_comm_ireduce_scatter_at(const char *file, int line, px_comm *c, const void *send, void *recv, size_t count,
                                     px_dtype dtype, px_reduce_op op, px_request **req);
px_status px_comm_split_at(const char *file, int line, px_comm *c, int color, int key, px_comm **out);

#ifndef PX_COMM_NO_CALL_SITES
#define px_comm_allreduce(...) px_comm_allreduce_at(__FILE__, __LINE__, __VA_ARGS__)
#define px_comm_broadcast(...) px_comm_broadcast_at(__FILE__, __LINE__, __VA_ARGS__)
#define px_comm_allgather(...) px_comm_allgather_at(__FILE__, __LINE__, __VA_ARGS__)
#define px_comm_reduce_scatter(...) px_comm_reduce_scatter_at(__FILE__, __LINE__, __VA_ARGS__)
#define px_comm_barrier(...) px_comm_barrier_at(__FILE__, __LINE__, __VA_ARGS__)
#define px_comm_iallreduce(...) px_comm_iallreduce_at(__FILE__, __LINE__, __VA_ARGS__)
#define px_comm_ibroadcast(...) px_comm_ibroadcast_at(__FILE__, __LINE__, __VA_ARGS__)
#define px_comm_iallgather(...) px_comm_iallgather_at(__FILE__, __LINE__, __VA_ARGS__)
#define px_comm_ireduce_scatter(...) px_comm_ireduce_scatter_at(__FILE__, __LINE__, __VA_ARGS__)
#define px_comm_split(...) px_comm_split_at(__FILE__, __LINE__, __VA_ARGS__)
#endif

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
