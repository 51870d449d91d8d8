// The MPI backend (MPI-3: Open MPI, MPICH), compiled when CMake finds MPI.
//
// The blocking collectives (all-reduce, all-gather, reduce-scatter,
// broadcast, barrier) call MPI's blocking ones, which run Open MPI's tuned
// algorithms: faster than its non-blocking ones (libnbc) at some sizes.
// MPI's blocking calls cannot time out, and a watchdog is the difference
// between a job that hangs until its allocation runs out and one that says
// where it stopped: so around each such call a watchdog thread is armed
// (mpi_watch.c) that throttles the call once it has stalled and ends the job
// at the deadline.  That needs MPI_THREAD_MULTIPLE (the watchdog thread
// calls MPI_Abort); where MPI does not provide it (a program that
// initialised MPI itself at a lower level, or PX_COMM_MPI_WAIT=poll), and
// for point-to-point and every asynchronous operation, the operation is a
// non-blocking MPI call and a blocking one waits on it at once:
//
// The wait (wait_req) polls MPI_Test back to back, with the deadline checked
// at every poll: Open MPI moves a non-blocking collective only inside MPI
// calls, so a rank that slept between polls held its collective still (the
// old naps made a small all-reduce two orders of magnitude slower than raw
// MPI's).  When ranks outnumber the node's cores, or once the wait passes
// 50 µs (it is then waiting for a peer, not for the transport), each poll
// yields the core to whatever else is runnable (on a loaded machine
// polling without yielding lost to the old naps, and yielding won it back).
// The figures behind both: docs/PERFORMANCE.md, "Figures behind code
// comments".  After 0.25 s
// without completion (plus 4 ns a byte: a 256 MiB one gets 1.3 s) the
// operation has stalled, and the wait naps between polls (growing to 2 ms),
// so a rank waiting for a late peer costs a few % of a core, not all of it.
// Requests handed out (DDP's buckets) move when their owner tests them: DDP
// does so at every module's grads_ready during backward.
//
// MPI cannot tell which peers are missing; plexus's side channel
// (mpi_side.c) can: every collective of a communicator is numbered, a rank
// whose wait stalls tells the other members which one it waits in, and at
// expiry the watchdog names the members it has not heard from at that
// number, with their host and what they said last.  Then it ends the job
// with MPI_Abort (from the waiting thread in wait_req, from the watchdog
// thread around a blocking call): the peers are stuck in the collective and
// no return value can reach them.
//
// Errors: our communicators use MPI_ERRORS_RETURN, and a failed MPI call
// becomes PX_ERR_COMM with MPI_Error_string's text.
#define _POSIX_C_SOURCE 200809L
#include "base/internal.h"
#include "comm/internal.h"
#include "comm/mpi_side.h"
#include "comm/mpi_watch.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

/* Started by a launcher?  Each launcher leaves its mark in the environment:
 *   Open MPI's mpirun/mpiexec  OMPI_COMM_WORLD_SIZE (and PMIX_RANK);
 *   MPICH/Hydra, Intel MPI     PMI_SIZE, MPI_LOCALNRANKS;
 *   any PMIx launcher          PMIX_RANK;
 *   Slurm's srun               SLURM_PROCID with SLURM_NTASKS > 1, counted
 *                              only when a PMI (PMI_FD, PMI_RANK or
 *                              PMIX_NAMESPACE) is there too: srun without
 *                              --mpi starts independent processes, and a
 *                              plain `srun -n1` or an sbatch script is not
 *                              an MPI job. */
bool px_comm_mpi_launched(void) {
  if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") || getenv("MPI_LOCALNRANKS"))
    return true;
  const char *procid = getenv("SLURM_PROCID"), *ntasks = getenv("SLURM_NTASKS");
  bool pmi = getenv("PMI_FD") || getenv("PMI_RANK") || getenv("PMIX_NAMESPACE");
  return procid && ntasks && atoi(ntasks) > 1 && pmi;
}

#ifndef PX_HAVE_MPI

bool px_comm_mpi_available(void) { return false; }

px_status px_comm_init_mpi(px_comm **out) {
  if (out) *out = NULL;
  return px_error(PX_ERR_UNSUPPORTED,
                  "px_comm_init_mpi: plexus was built without MPI; install an MPI (apt-get install "
                  "libopenmpi-dev) and rebuild, or use px_comm_run's threads backend");
}

void px_comm_finalize_mpi(void) {}

px_status px_comm_mpi_run(px_rank_fn fn, void *arg, int *exit_code) { return px_comm_init_mpi(NULL); }

#else

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

bool px_comm_mpi_available(void) { return true; }

static bool we_initialized;
/* Blocking collectives call MPI's blocking ones under the watchdog thread
 * (MPI provides MPI_THREAD_MULTIPLE and the thread started). */
static bool blocking_calls;
static const px_comm_ops px_comm_mpi_ops_table;

typedef struct mcomm {
  MPI_Comm comm;
  int world_rank;
  bool crowded; /* more ranks on this node than cores: waits yield */
  /* For the side channel (mpi_side.h): the communicator's key, equal on
   * its members; the collectives started on it (each one's number); the
   * splits made from it (a child's key is derived from it); the world rank
   * of each of its ranks. */
  uint64_t key;
  atomic_uint_least64_t started;
  uint64_t splits;
  int *members;
} mcomm;

static MPI_Comm comm_of(const px_comm *c) { return ((const mcomm *)c->impl)->comm; }
static int world_rank_of(const px_comm *c) { return ((const mcomm *)c->impl)->world_rank; }

/* One operation in flight.  AVG is MPI_SUM followed by a division, done
 * once when the request is first seen complete. */
typedef struct mreq {
  px_request base;
  px_comm *c;
  MPI_Request req;
  const char *what;
  int peer;     /* point-to-point: the other rank; else -1 */
  uint64_t seq; /* a collective's number on its communicator */
  bool told;    /* its stall was told on the side channel */
  char label[PX_COMM_LABEL_MAX];
  double timeout;
  double spin;    /* seconds to poll without a nap (wait_req) */
  bool blocking;  /* a blocking px_comm call: may use MPI's blocking one */
  bool completed; /* it did: no request to wait for */
  bool finished;  /* post-processing done */
  void *avg_buf;  /* divide avg_count elements by the size */
  size_t avg_count;
  px_dtype dtype;
  void *staged;    /* reduce_scatter into a temporary, then ... */
  void *staged_to; /* ... copied here (recv overlapped send) */
  size_t staged_bytes;
  bool heap;
} mreq;

static px_status mpi_failed(int rc, const char *call, const char *what, const char *file, int line) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
  return px_error(PX_ERR_COMM, "%s: %s failed (%s:%d): %s", what, call, file, line, s);
}

#define MPI_TRY(what, call)                                                          \
  do {                                                                               \
    int rc_ = (call);                                                                \
    if (rc_ != MPI_SUCCESS) return mpi_failed(rc_, #call, what, __FILE__, __LINE__); \
  } while (0)

static MPI_Datatype reduce_type(px_dtype t) {
  switch (t) {
  case PX_F32: return MPI_FLOAT;
  case PX_F64: return MPI_DOUBLE;
  case PX_I32: return MPI_INT32_T;
  default: return MPI_INT64_T;
  }
}

/* Broadcast, gather and point-to-point move bytes: any element of the
 * same width will do, and whole elements keep counts below INT_MAX longer
 * than MPI_BYTE would. */
static MPI_Datatype move_type(px_dtype t) {
  switch (px_dtype_size(t)) {
  case 1: return MPI_UINT8_T;
  case 2: return MPI_UINT16_T;
  case 4: return MPI_UINT32_T;
  default: return MPI_UINT64_T;
  }
}

static MPI_Op mpi_op(px_reduce_op op) {
  switch (op) {
  case PX_MIN: return MPI_MIN;
  case PX_MAX: return MPI_MAX;
  default: return MPI_SUM;
  }
}

static px_status fits_int(const char *what, size_t count) {
  if (count > INT_MAX)
    return px_error(PX_ERR_UNSUPPORTED,
                    "%s: count %zu exceeds MPI's int counts (%d); split the buffer into smaller calls", what, count,
                    INT_MAX);
  return PX_OK;
}

/* Seconds a wait polls without sleeping before it takes its operation for
 * stalled (a peer is late, or gone) and starts to nap between polls:
 * SPIN_SECONDS, plus 4 ns a byte (250 MB/s, far below any transport) for
 * operations big enough to take that long when healthy. */
#define SPIN_SECONDS 0.25
static double spin_seconds(size_t bytes) { return SPIN_SECONDS + 4e-9 * (double)bytes; }

/* ---- Fault injection (tests) -------------------------------------------------------
 * PX_COMM_FAULT="RANK:SIGNAL:WHEN:N:LABEL" makes world rank RANK send itself
 * SIGNAL (KILL, STOP, TERM, ...: a name without SIG, or a number) at its
 * N-th collective (from 1) whose label contains LABEL: WHEN "before" as it
 * enters it (it never takes part), "after" once it has posted its share (a
 * non-blocking one: DDP's buckets; a blocking one once it has returned).
 * The fault tests (tests/test_mpi_faults_name_the_rank_and_resume.py) use it
 * to land a kill -9 or a SIGSTOP mid-backward, mid-all-reduce or
 * mid-checkpoint every time; it is read once, at px_comm_init_mpi, and costs
 * a pointer test per collective when unset. */
static struct fault {
  int rank, signo, nth, seen;
  bool after;
  char label[PX_COMM_LABEL_MAX];
} fault_spec, *fault;

static int signal_number(const char *name) {
  static const struct {
    const char *name;
    int signo;
  } names[] = {{"KILL", SIGKILL}, {"STOP", SIGSTOP}, {"TERM", SIGTERM}, {"INT", SIGINT},
               {"SEGV", SIGSEGV}, {"ABRT", SIGABRT}, {"USR1", SIGUSR1}};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strcmp(name, names[i].name) == 0) return names[i].signo;
  return atoi(name);
}

static void fault_parse(int world_rank) {
  const char *spec = getenv("PX_COMM_FAULT");
  if (!spec || !spec[0]) return;
  char sig[16] = "", when[16] = "";
  int rank = -1, nth = 0, used = 0;
  if (sscanf(spec, "%d:%15[^:]:%15[^:]:%d:%n", &rank, sig, when, &nth, &used) != 4 || used == 0 || nth < 1 ||
      (strcmp(when, "before") != 0 && strcmp(when, "after") != 0) || signal_number(sig) <= 0) {
    fprintf(stderr,
            "plexus: warning: PX_COMM_FAULT=\"%s\" ignored: expected RANK:SIGNAL:before|after:N:LABEL, "
            "e.g. 1:STOP:before:1:DDP step 6, bucket 0\n",
            spec);
    return;
  }
  if (rank != world_rank) return;
  fault_spec = (struct fault){.rank = rank, .signo = signal_number(sig), .nth = nth, .after = when[0] == 'a'};
  snprintf(fault_spec.label, sizeof fault_spec.label, "%s", spec + used);
  fault = &fault_spec;
}

/* A collective at its start (after = false) or once posted (after = true). */
static void fault_point(const mreq *r, bool after) {
  if (!fault || r->peer >= 0 || fault->after != after || !strstr(r->label, fault->label)) return;
  if (++fault->seen != fault->nth) return;
  fprintf(stderr, "plexus: rank %d: PX_COMM_FAULT: signal %d %s %s (%s)\n", fault->rank, fault->signo,
          after ? "after posting" : "before", r->what, r->label);
  fflush(stderr);
  fault = NULL;
  raise(fault_spec.signo);
}

static void req_init(mreq *r, px_comm *c, const char *what, int peer, size_t bytes, bool blocking) {
  memset(r, 0, sizeof *r);
  r->blocking = blocking;
  r->spin = spin_seconds(bytes);
  r->base.ops = &px_comm_mpi_ops_table;
  r->c = c;
  r->req = MPI_REQUEST_NULL;
  r->what = what;
  r->peer = peer;
  r->timeout = c->timeout;
  memcpy(r->label, c->label, sizeof r->label);
  // Every rank starts a communicator's collectives in the same order, so
  // their numbers agree (relaxed: one thread calls them at a time).
  if (peer < 0) r->seq = atomic_fetch_add_explicit(&((mcomm *)c->impl)->started, 1, memory_order_relaxed) + 1;
  if (fault) fault_point(r, false);
}

/* The side channel's view of a collective (mpi_side.h). */
static px_mpi_call call_of(const mreq *r) {
  mcomm *m = r->c->impl;
  return (px_mpi_call){.key = m->key,
                       .seq = r->seq,
                       .started = atomic_load_explicit(&m->started, memory_order_relaxed),
                       .members = m->members,
                       .n = r->c->size,
                       .world_rank = m->world_rank,
                       .what = r->what,
                       .label = r->label};
}

/* "waiting on ranks ..." for the watchdog's message. */
static void verdict_of(const mreq *r, char *out, size_t cap) {
  if (r->peer >= 0) {
    const mcomm *m = r->c->impl;
    px_mpi_watch_peer_verdict(m->members[r->peer], r->peer, out, cap);
    return;
  }
  px_mpi_call call = call_of(r);
  px_mpi_side_verdict(&call, out, cap);
}

/* ---- Completion ---------------------------------------------------------------- */

static void finish(mreq *r) {
  if (r->finished) return;
  r->finished = true;
  if (r->avg_buf) px_comm_divide(r->avg_buf, r->avg_count, r->dtype, r->c->size);
  if (r->staged) {
    memcpy(r->staged_to, r->staged, r->staged_bytes);
    free(r->staged);
    r->staged = NULL;
  }
}

static void discard(mreq *r) {
  free(r->staged);
  r->staged = NULL;
}

static px_status watchdog_abort(mreq *r) {
  const char *label = r->label[0] ? r->label : "no label set";
  char verdict[1400];
  verdict_of(r, verdict, sizeof verdict);
  px_mpi_watch_message(world_rank_of(r->c), r->what, label, r->timeout, verdict);
  // The documented exception to "library code never ends the process":
  // the peers are blocked in MPI and only the launcher can free them.
  MPI_Abort(MPI_COMM_WORLD, 1);
  discard(r);
  return px_error(PX_ERR_TIMEOUT, "%s (%s): watchdog fired after %g s and MPI_Abort returned", r->what, label,
                  r->timeout);
}

/* A wait longer than this is waiting for a peer, not for the transport:
 * from here each poll yields the core to whatever else is runnable on it
 * (on a loaded node, possibly what the peer waits for). */
#define YIELD_AFTER_SECONDS 50e-6
/* Naps of a stalled wait: from NAP_MIN_NS doubling to NAP_MAX_NS. */
#define NAP_MIN_NS 20000L
#define NAP_MAX_NS 2000000L

/* Open MPI moves a non-blocking operation only inside MPI calls (it has no
 * progress thread): a rank that sleeps between polls holds its collective
 * still, and its peers with it.  So a wait polls MPI_Test back to back while
 * the operation can be moving: the first r->spin seconds (spin_seconds:
 * 0.25 s, more for big messages).  When ranks outnumber the node's cores,
 * or after YIELD_AFTER_SECONDS, each poll is followed by sched_yield, so a
 * peer (or whatever it waits for) that shares the core gets it; a call
 * that no one else wants returns at once.  After r->spin
 * the operation has stalled: naps grow from 20 µs to 2 ms, and a rank
 * waiting for a stalled peer uses a few % of a core instead of all of it.
 * The watchdog's deadline is checked at every poll either way. */
static px_status wait_req(mreq *r) {
  const double start = px_time_now();
  const bool crowded = ((const mcomm *)r->c->impl)->crowded;
  long nap_ns = NAP_MIN_NS;
  double last_drain = 0;
  for (;;) {
    int flag = 0;
    int rc = MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      discard(r);
      return mpi_failed(rc, "MPI_Test", r->what, __FILE__, __LINE__);
    }
    if (flag) {
      if (r->told) {
        px_mpi_call call = call_of(r);
        px_mpi_side_cleared(&call);
      }
      finish(r);
      return PX_OK;
    }
    const double now = px_time_now(), waited = now - start;
    if (r->timeout > 0 && waited > r->timeout) return watchdog_abort(r);
    if (waited < r->spin) {
      if (crowded || waited > YIELD_AFTER_SECONDS) sched_yield();
      continue;
    }
    // Stalled: a collective tells its members, once, and reads what they
    // said every 50 ms (mpi_side.h).
    if (r->peer < 0 && !r->told) {
      px_mpi_call call = call_of(r);
      px_mpi_side_stalled(&call);
      r->told = true;
      last_drain = now;
    } else if (r->peer < 0 && now - last_drain > 0.05) {
      px_mpi_side_drain();
      last_drain = now;
    }
    if (px_mpi_watch_term_since(start)) {
      char verdict[1400];
      verdict_of(r, verdict, sizeof verdict);
      px_mpi_watch_term_message(world_rank_of(r->c), r->what, r->label, waited, verdict);
    }
    struct timespec ts = {0, nap_ns};
    nanosleep(&ts, NULL);
    nap_ns = nap_ns * 2 > NAP_MAX_NS ? NAP_MAX_NS : nap_ns * 2;
  }
}

/* A blocking operation: done already (MPI's blocking call), or the
 * started request, waited for at once. */
static px_status run_now(px_status started, mreq *r) {
  if (started) return started;
  if (r->completed) {
    finish(r);
    if (fault) fault_point(r, true);
    return PX_OK;
  }
  px_status st = wait_req(r);
  if (fault && st == PX_OK) fault_point(r, true);
  return st;
}

/* Whether a blocking px_comm call runs MPI's blocking call now, with the
 * watchdog thread armed; px_mpi_watch_disarm after it. */
static bool block_now(mreq *r) {
  if (!r->blocking || !blocking_calls) return false;
  px_mpi_call call = call_of(r);
  r->completed = px_mpi_watch_arm(r->what, r->label, world_rank_of(r->c), r->peer, r->timeout, r->spin,
                                  r->peer < 0 ? &call : NULL);
  return r->completed;
}

/* MPI's blocking call under the watchdog, or the non-blocking one. */
#define BLOCK_OR_START(r, rc, blocking_call, start_call) \
  do {                                                   \
    if (block_now(r)) {                                  \
      (rc) = (blocking_call);                            \
      px_mpi_watch_disarm();                             \
    } else {                                             \
      (rc) = (start_call);                               \
    }                                                    \
  } while (0)

/* An asynchronous one: the started request, moved to the heap. */
static px_status hand_out(px_status started, const mreq *r, px_request **req) {
  if (started) return started;
  mreq *h = malloc(sizeof *h);
  if (!h) {
    // The operation is under way and its buffers are in MPI's hands:
    // complete it before reporting, so nothing writes them afterwards.
    mreq copy = *r;
    wait_req(&copy);
    return px_error(PX_ERR_NOMEM, "%s: out of memory for a request", r->what);
  }
  *h = *r;
  h->heap = true;
  *req = &h->base;
  if (fault) fault_point(h, true);
  return PX_OK;
}

/* ---- Starting operations --------------------------------------------------------- */

/* Reduce-scatters of this many bytes of input and more take the
 * non-blocking call even when blocking (start_reduce_scatter says why). */
#define RS_BLOCKING_BELOW (256u << 10)

static px_status start_allreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op, mreq *r,
                                 bool blocking) {
  req_init(r, c, "allreduce", -1, count * px_dtype_size(dtype), blocking);
  px_status st = fits_int(r->what, count);
  if (st) return st;
  if (op == PX_AVG) {
    r->avg_buf = buf;
    r->avg_count = count;
    r->dtype = dtype;
  }
  int rc;
  BLOCK_OR_START(r, rc, MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, reduce_type(dtype), mpi_op(op), comm_of(c)),
                 MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, reduce_type(dtype), mpi_op(op), comm_of(c), &r->req));
  if (rc != MPI_SUCCESS) return mpi_failed(rc, "MPI_(I)allreduce", r->what, __FILE__, __LINE__);
  return PX_OK;
}

static px_status start_broadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root, mreq *r,
                                 bool blocking) {
  req_init(r, c, "broadcast", -1, count * px_dtype_size(dtype), blocking);
  px_status st = fits_int(r->what, count);
  if (st) return st;
  int rc;
  BLOCK_OR_START(r, rc, MPI_Bcast(buf, (int)count, move_type(dtype), root, comm_of(c)),
                 MPI_Ibcast(buf, (int)count, move_type(dtype), root, comm_of(c), &r->req));
  if (rc != MPI_SUCCESS) return mpi_failed(rc, "MPI_(I)bcast", r->what, __FILE__, __LINE__);
  return PX_OK;
}

static px_status start_allgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype, mreq *r,
                                 bool blocking) {
  req_init(r, c, "allgather", -1, (size_t)c->size * count * px_dtype_size(dtype), blocking);
  px_status st = fits_int(r->what, count);
  if (st) return st;
  size_t bytes = count * px_dtype_size(dtype);
  // Sending one's own block of recv is MPI_IN_PLACE (ZeRO gathers shards so).
  const void *from = send == (const char *)recv + (size_t)c->rank * bytes ? MPI_IN_PLACE : send;
  const MPI_Datatype t = move_type(dtype);
  int rc;
  BLOCK_OR_START(r, rc, MPI_Allgather(from, (int)count, t, recv, (int)count, t, comm_of(c)),
                 MPI_Iallgather(from, (int)count, t, recv, (int)count, t, comm_of(c), &r->req));
  if (rc != MPI_SUCCESS) return mpi_failed(rc, "MPI_(I)allgather", r->what, __FILE__, __LINE__);
  return PX_OK;
}

static px_status start_reduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                      px_reduce_op op, mreq *r, bool blocking) {
  req_init(r, c, "reduce_scatter", -1, (size_t)c->size * count * px_dtype_size(dtype), blocking);
  px_status st = fits_int(r->what, count);
  if (st) return st;
  size_t bytes = count * px_dtype_size(dtype);
  const char *s = send, *d = recv;
  void *into = recv;
  // MPI forbids overlapping buffers (its MPI_IN_PLACE means something
  // else here); the threads backend allows recv inside send, so stage it.
  if (bytes && d < s + (size_t)c->size * bytes && s < d + bytes) {
    r->staged = malloc(bytes);
    if (!r->staged) return px_error(PX_ERR_NOMEM, "reduce_scatter: out of memory staging %zu bytes", bytes);
    r->staged_to = recv;
    r->staged_bytes = bytes;
    into = r->staged;
  }
  if (op == PX_AVG) {
    r->avg_buf = into;
    r->avg_count = count;
    r->dtype = dtype;
  }
  const MPI_Datatype t = reduce_type(dtype);
  // Measured (2 ranks, Open MPI 4.1, docs/PERFORMANCE.md): Open MPI's
  // blocking reduce-scatter ran 1.7-3x slower than libnbc's non-blocking
  // one from 256 KiB of input up, and faster below; so the blocking call
  // only below that.
  if ((size_t)c->size * bytes >= RS_BLOCKING_BELOW) r->blocking = false;
  int rc;
  BLOCK_OR_START(r, rc, MPI_Reduce_scatter_block(send, into, (int)count, t, mpi_op(op), comm_of(c)),
                 MPI_Ireduce_scatter_block(send, into, (int)count, t, mpi_op(op), comm_of(c), &r->req));
  if (rc != MPI_SUCCESS) {
    discard(r);
    return mpi_failed(rc, "MPI_(I)reduce_scatter_block", r->what, __FILE__, __LINE__);
  }
  return PX_OK;
}

static px_status start_barrier(px_comm *c, mreq *r, const char *what) {
  req_init(r, c, what, -1, 0, true);
  int rc;
  BLOCK_OR_START(r, rc, MPI_Barrier(comm_of(c)), MPI_Ibarrier(comm_of(c), &r->req));
  if (rc != MPI_SUCCESS) return mpi_failed(rc, "MPI_(I)barrier", r->what, __FILE__, __LINE__);
  return PX_OK;
}

static px_status start_send(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag, mreq *r) {
  req_init(r, c, "send", dst, count * px_dtype_size(dtype), false);
  px_status st = fits_int(r->what, count);
  if (st) return st;
  MPI_TRY(r->what, MPI_Isend(buf, (int)count, move_type(dtype), dst, tag, comm_of(c), &r->req));
  return PX_OK;
}

static px_status start_recv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag, mreq *r) {
  req_init(r, c, "recv", src, count * px_dtype_size(dtype), false);
  px_status st = fits_int(r->what, count);
  if (st) return st;
  MPI_TRY(r->what, MPI_Irecv(buf, (int)count, move_type(dtype), src, tag, comm_of(c), &r->req));
  return PX_OK;
}

/* ---- The backend table ------------------------------------------------------------ */

static px_status m_allreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op) {
  mreq r;
  return run_now(start_allreduce(c, buf, count, dtype, op, &r, true), &r);
}
static px_status m_broadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root) {
  mreq r;
  return run_now(start_broadcast(c, buf, count, dtype, root, &r, true), &r);
}
static px_status m_allgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype) {
  mreq r;
  return run_now(start_allgather(c, send, recv, count, dtype, &r, true), &r);
}
static px_status m_reduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                  px_reduce_op op) {
  mreq r;
  return run_now(start_reduce_scatter(c, send, recv, count, dtype, op, &r, true), &r);
}
static px_status m_barrier(px_comm *c) {
  mreq r;
  return run_now(start_barrier(c, &r, "barrier"), &r);
}
static px_status m_send(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag) {
  mreq r;
  return run_now(start_send(c, buf, count, dtype, dst, tag, &r), &r);
}
static px_status m_recv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag) {
  mreq r;
  return run_now(start_recv(c, buf, count, dtype, src, tag, &r), &r);
}

static px_status m_iallreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op, px_request **req) {
  mreq r;
  return hand_out(start_allreduce(c, buf, count, dtype, op, &r, false), &r, req);
}
static px_status m_ibroadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root, px_request **req) {
  mreq r;
  return hand_out(start_broadcast(c, buf, count, dtype, root, &r, false), &r, req);
}
static px_status m_iallgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                              px_request **req) {
  mreq r;
  return hand_out(start_allgather(c, send, recv, count, dtype, &r, false), &r, req);
}
static px_status m_ireduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                   px_reduce_op op, px_request **req) {
  mreq r;
  return hand_out(start_reduce_scatter(c, send, recv, count, dtype, op, &r, false), &r, req);
}
static px_status m_isend(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag,
                         px_request **req) {
  mreq r;
  return hand_out(start_send(c, buf, count, dtype, dst, tag, &r), &r, req);
}
static px_status m_irecv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag, px_request **req) {
  mreq r;
  return hand_out(start_recv(c, buf, count, dtype, src, tag, &r), &r, req);
}

static px_status m_request_test(px_request *base, bool *done) {
  mreq *r = (mreq *)base;
  *done = r->finished;
  if (r->finished) return PX_OK;
  int flag = 0;
  int rc = MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) return mpi_failed(rc, "MPI_Test", r->what, __FILE__, __LINE__);
  if (flag) finish(r);
  *done = flag != 0;
  return PX_OK;
}

static px_status m_request_wait(px_request *base) {
  mreq *r = (mreq *)base;
  px_status st = r->finished ? PX_OK : wait_req(r);
  free(r);
  return st;
}

static px_status mcomm_wrap(MPI_Comm comm, uint64_t key, px_comm **out);

/* splitmix64's finaliser: communicator keys from small numbers. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static px_status m_split(px_comm *c, int color, int key, px_comm **out) {
  // MPI_Comm_split blocks with no deadline; a watched barrier first makes
  // sure every rank has reached the split before anyone enters it.
  mreq r;
  px_status st = run_now(start_barrier(c, &r, "split"), &r);
  if (st) return st;
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_TRY("split", MPI_Comm_split(comm_of(c), color < 0 ? MPI_UNDEFINED : color, key, &sub));
  // The child's key: the same on its members (same parent, same split of
  // it, same colour), another for every other child.
  mcomm *m = c->impl;
  const uint64_t child = mix64(m->key ^ mix64(++m->splits) ^ mix64(0x5157ULL + (uint64_t)(uint32_t)color));
  if (sub == MPI_COMM_NULL) return PX_OK;
  st = mcomm_wrap(sub, child, out);
  if (st) return st;
  (*out)->timeout = c->timeout;
  return PX_OK;
}

static void m_abort(px_comm *c, const char *why) {
  fprintf(stderr, "plexus: rank %d: abort: %s\n", world_rank_of(c), why);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Members lists of freed communicators: the watchdog thread may still be
 * telling them that a stalled call ended (px_mpi_side_cleared) just after
 * the caller returned and freed the communicator, so they are freed at
 * px_comm_finalize_mpi, after the side channel is closed. */
static pthread_mutex_t retired_mu = PTHREAD_MUTEX_INITIALIZER;
static int **retired;
static size_t n_retired, cap_retired;

static void retire_members(int *members) {
  pthread_mutex_lock(&retired_mu);
  if (n_retired == cap_retired) {
    size_t cap = cap_retired ? 2 * cap_retired : 16;
    int **grown = realloc(retired, cap * sizeof *grown);
    if (grown) {
      retired = grown;
      cap_retired = cap;
    }
  }
  if (n_retired < cap_retired) retired[n_retired++] = members;
  else free(members);  // out of memory: the race above is the lesser risk
  pthread_mutex_unlock(&retired_mu);
}

static void free_retired(void) {
  pthread_mutex_lock(&retired_mu);
  for (size_t i = 0; i < n_retired; i++) free(retired[i]);
  free(retired);
  retired = NULL;
  n_retired = cap_retired = 0;
  pthread_mutex_unlock(&retired_mu);
}

static void m_free(px_comm *c) {
  mcomm *m = c->impl;
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&m->comm);
  retire_members(m->members);
  free(m);
  free(c);
}

static const px_comm_ops px_comm_mpi_ops_table = {
  .name = "mpi",
  .allreduce = m_allreduce,
  .broadcast = m_broadcast,
  .allgather = m_allgather,
  .reduce_scatter = m_reduce_scatter,
  .barrier = m_barrier,
  .send = m_send,
  .recv = m_recv,
  .iallreduce = m_iallreduce,
  .ibroadcast = m_ibroadcast,
  .iallgather = m_iallgather,
  .ireduce_scatter = m_ireduce_scatter,
  .isend = m_isend,
  .irecv = m_irecv,
  .request_test = m_request_test,
  .request_wait = m_request_wait,
  .split = m_split,
  .abort = m_abort,
  .free = m_free,
};

/* Takes ownership of comm: a px_comm with errors returned, and local rank
 * and size among the ranks that share this node's memory. */
static px_status mcomm_wrap(MPI_Comm comm, uint64_t key, px_comm **out) {
  int rank, size, wrank, lrank, lsize;
  MPI_Comm local = MPI_COMM_NULL;
  MPI_TRY("init", MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  MPI_TRY("init", MPI_Comm_rank(comm, &rank));
  MPI_TRY("init", MPI_Comm_size(comm, &size));
  MPI_TRY("init", MPI_Comm_rank(MPI_COMM_WORLD, &wrank));
  MPI_TRY("init", MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
  MPI_TRY("init", MPI_Comm_rank(local, &lrank));
  MPI_TRY("init", MPI_Comm_size(local, &lsize));
  MPI_Comm_free(&local);
  px_comm *c = px_comm_alloc(&px_comm_mpi_ops_table, PX_COMM_MPI, rank, size);
  mcomm *m = calloc(1, sizeof *m);
  int *members = malloc((size_t)size * sizeof *members);
  if (!c || !m || !members) {
    free(c);
    free(m);
    free(members);
    MPI_Comm_free(&comm);
    return px_error(PX_ERR_NOMEM, "mpi: out of memory for a communicator");
  }
  // The world rank of each rank (the side channel speaks world ranks).
  MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
  int ok = MPI_Comm_group(comm, &g) == MPI_SUCCESS && MPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS;
  for (int i = 0; i < size; i++) members[i] = i;
  if (ok) MPI_Group_translate_ranks(g, size, members, wg, members);
  if (g != MPI_GROUP_NULL) MPI_Group_free(&g);
  if (wg != MPI_GROUP_NULL) MPI_Group_free(&wg);
  m->comm = comm;
  m->world_rank = wrank;
  m->key = key;
  atomic_init(&m->started, 0);
  m->members = members;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  m->crowded = cores > 0 && lsize > cores;
  c->impl = m;
  c->local_rank = lrank;
  c->local_size = lsize;
  *out = c;
  return PX_OK;
}

px_status px_comm_init_mpi(px_comm **out) {
  if (!out) return px_error(PX_ERR_INVALID, "px_comm_init_mpi: out is NULL");
  *out = NULL;
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized) return px_error(PX_ERR_COMM, "px_comm_init_mpi: MPI was already finalized");
  const char *wait = getenv("PX_COMM_MPI_WAIT");
  const bool poll = wait && strcmp(wait, "poll") == 0;
  if (!inited) {
    // MULTIPLE: the watchdog thread (mpi_watch.c) calls MPI_Abort while
    // the caller sits in a blocking collective; measured at 2 ranks, raw
    // MPI's collectives ran about as fast as under SERIALIZED (docs/PERFORMANCE.md,
    // "Figures behind code comments").
    // PX_COMM_MPI_WAIT=poll asks for SERIALIZED and keeps every wait on
    // plexus's polling loop (the behaviour before the watchdog thread).
    //
    // Open MPI's non-blocking all-reduce (coll/libnbc) picks a binomial
    // tree (reduce to rank 0, then broadcast: twice the data through one
    // rank) for fewer than 4 ranks or an in-place buffer, which is every
    // call of ours: measured at 2 ranks it fell well behind MPI_Allreduce
    // from 1 MiB up, and its ring matched MPI_Allreduce at every size (the
    // figures: docs/PERFORMANCE.md, "Figures behind code comments").  Unless
    // the user chose an algorithm, ask for the ring; other MPIs ignore it.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    // Open MPI's shared-memory transport moves a large message between two
    // processes of a node with one process_vm_readv (CMA: "single copy") by
    // default, and that call pins every page it reads: measured here it ran
    // at a quarter of memcpy's speed, and the double copy through the
    // shared segment ("none") made every blocking collective faster from 64
    // KiB to 16 MiB (only the 256 MiB all-reduce was slower).  The double
    // copy moves a message in fragments, and a non-blocking collective
    // moves only while its ranks are inside MPI: with the default 32 KiB
    // fragments DDP's 1 MiB bucket, tested at each layer's backward hook,
    // finished after backward (test_ddp_buckets_complete_during_backward_mpi);
    // with 128 KiB fragments it finishes during backward and the blocking
    // collectives gain a little more (512 KiB was much slower).  DDP of a
    // small MLP at 2 ranks was 1.3-1.5x faster; the CNNs and the large MLP
    // did not change (the figures: docs/PERFORMANCE.md, "Figures behind code
    // comments").  Unless the user chose (mpirun --mca
    // btl_vader_single_copy_mechanism cma, or the variables in the
    // environment), ask for the double copy in 128 KiB fragments.
#if defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5
    setenv("OMPI_MCA_btl_sm_single_copy_mechanism", "none", 0);
    setenv("OMPI_MCA_btl_sm_max_send_size", "131072", 0);
#else
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
    setenv("OMPI_MCA_btl_vader_max_send_size", "131072", 0);
#endif
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, poll ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "MPI_Init_thread", "px_comm_init_mpi", __FILE__, __LINE__);
    we_initialized = true;
  }
  int level = MPI_THREAD_SINGLE;
  MPI_TRY("px_comm_init_mpi", MPI_Query_thread(&level));
  blocking_calls = !poll && level == MPI_THREAD_MULTIPLE && px_mpi_watch_start();
  // The watchdog's side channel (mpi_side.c); without it the watchdog
  // still ends the job, naming no rank.
  if (px_mpi_side_init() != 0)
    fprintf(stderr,
            "plexus: warning: the watchdog's side channel did not start; a watchdog will not name the "
            "ranks that did not arrive\n");
  int wrank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  fault_parse(wrank);
  px_mpi_watch_term_hook();
  MPI_Comm world = MPI_COMM_NULL;
  // A duplicate, so our messages never match the application's own.
  MPI_TRY("px_comm_init_mpi", MPI_Comm_dup(MPI_COMM_WORLD, &world));
  static uint64_t worlds;  // every rank makes its worlds in the same order
  px_status st = mcomm_wrap(world, mix64(++worlds), out);
  // A program that starts MPI itself (not through px_comm_run) gets the
  // core split too: the thread setting's default divides the node's cores
  // among its processes (tensor/threads.c).
  if (st == PX_OK) px_node_set_processes(px_comm_local_size(*out));
  return st;
}

void px_comm_finalize_mpi(void) {
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized) px_mpi_side_finalize();
  free_retired();
  if (we_initialized && !finalized) MPI_Finalize();
}

px_status px_comm_mpi_run(px_rank_fn fn, void *arg, int *exit_code) {
  px_comm *c;
  px_status st = px_comm_init_mpi(&c);
  if (st) return st;
  c->owned_by_run = true;
  int rc = fn(c, arg);
  if (rc != 0) {
    // Peers may be waiting in a collective this rank will never join;
    // MPI_Abort ends them too, with this rank's code.
    fprintf(stderr, "plexus: rank %d: returned %d; aborting the job so the other ranks do not hang\n", world_rank_of(c),
            rc);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, rc);
  }
  c->owned_by_run = false;
  px_comm_free(c);
  px_comm_finalize_mpi();
  *exit_code = rc;
  return PX_OK;
}

#endif
