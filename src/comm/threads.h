/* comm/threads.h — the objects of the threads backend, shared by its
 * files, one concept each: threads.c (the backend table and px_comm_run's
 * launcher), threads_wait.c (deadlines, spin-then-block waits),
 * threads_fail.c (job failure, the watchdog's messages), threads_group.c
 * (jobs, groups, each rank's tcomm), threads_rendezvous.c,
 * threads_coll.c (collectives), threads_progress.c (the queue and progress
 * thread), threads_p2p.c (point-to-point) and threads_reduce.c (the
 * reduction kernels).  threads.c's opening comment says how they fit
 * together.  Include after _POSIX_C_SOURCE. */
#ifndef PX_COMM_THREADS_H
#define PX_COMM_THREADS_H

#include "comm/internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define MSG_MAX 512

/* All-reduces up to this many bytes take the two-rendezvous path (each rank
 * reduces the whole buffer into this scratch); larger ones split the work. */
#ifndef SMALL_BYTES
#define SMALL_BYTES (16u << 10)
#endif
/* Outputs from this many bytes are written with non-temporal stores
 * (threads_reduce.c, the all-gather's pushes): half the L3 of the Zen 4
 * they were measured on, past which an output would not stay in the cache
 * for the caller anyway.  Smaller outputs fit the L3, and streaming them
 * to memory made the all-gather of 4 and 8 MiB several times slower than
 * ordinary stores (4 MiB was the threshold until 2026-11-28; the figures:
 * docs/PERFORMANCE.md, "Figures behind code comments"). */
#ifndef STREAM_BYTES
#define STREAM_BYTES (16u << 20)
#endif
/* A wait polls with a cpu pause for SPIN_PAUSE_NS, then with sched_yield
 * until its budget is spent (SPIN_NS; fewer when ranks outnumber cores,
 * which yield from the start), then blocks.  Yielding lets a peer that
 * shares this core (other programs' load, or our own progress threads)
 * run, where a pure spin would hold the core the peer needs. */
#define SPIN_PAUSE_NS 4000
#define SPIN_NS 100000
#define SPIN_NS_OVERSUBSCRIBED 20000

typedef enum tkind {
  K_ALLREDUCE,
  K_BROADCAST,
  K_ALLGATHER,
  K_REDUCE_SCATTER,
  K_BARRIER,
  K_SPLIT,
  K_SEND,
  K_RECV
} tkind;

/* Where a communicator's asynchronous operations run (threads.c's opening
 * comment, "Asynchronous operations"): on its progress thread from the
 * start, or held for the rank's own waits when the ranks' threads already
 * fill the cores.  PX_COMM_THREADS_PROGRESS=thread|wait|auto (default). */
typedef enum tprogress { PROGRESS_AUTO, PROGRESS_THREAD, PROGRESS_WAIT } tprogress;
/* A held operation that a px_request_test finds still queued after this
 * long is handed to the progress thread (a program that only tests must
 * see it complete). */
#define HOLD_TEST_NS 1000000

struct tcomm;

typedef struct tjob {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast on every change a blocked waiter may wait for */
  /* Threads blocked (or about to block) on cv.  A change that a waiter may
   * wait for is published with a seq_cst store and then, only if this is
   * non-zero, broadcast under mu (pxt_wake): so the fast path takes no lock
   * and no wake-up is lost (the waiter counts itself, then re-checks). */
  atomic_int sleepers;
  int spin_ns;        /* how long a wait spins before it blocks */
  bool spin_yield;    /* more ranks than cores: yield from a spin's start */
  int refs;           /* px_comm_run's, and one per group */
  atomic_bool failed; /* written under mu; read anywhere */
  px_status fail_status;
  char fail_msg[MSG_MAX];
  bool have_exit;
  int first_exit_code;
  bool *finished; /* (world size) the rank's function has returned */
  /* Asynchronous progress. */
  tprogress progress;
  int nranks;          /* ranks of the world */
  long cores;          /* online cores, 0 if unknown */
  struct tcomm *comms; /* every live communicator of the job, under mu */
  atomic_int held;     /* communicators whose queue is held for their rank */
} tjob;

struct tgroup;

/* What a rank brings to a collective. */
typedef struct tpost {
  tkind kind;
  const void *send;
  void *recv;
  size_t count;
  px_dtype dtype;
  px_reduce_op op;
  int root;
  int color, key;
} tpost;

/* A message sent before its receive was posted. */
typedef struct tmsg {
  int src, tag;
  size_t bytes;
  struct tmsg *next;
  unsigned char data[];
} tmsg;

typedef struct top top;

/* One rank's side of a group's rendezvous, alone on its cache line(s) so
 * that ranks polling each other's slots share no line they write. */
typedef struct tslot {
  _Alignas(64) atomic_uint_least64_t seq; /* rendezvous this rank has reached */
  atomic_bool busy;                       /* between rendezvous, reading peers' buffers */
} tslot;

typedef struct tgroup {
  tjob *job;
  int size;
  int refs;        /* one per member's tcomm */
  int *world_rank; /* (size) rank in the px_comm_run world, for messages */
  bool is_world;
  /* Rendezvous. */
  tslot *slot; /* (size) */
  /* Chunks of a large all-reduce claimed so far, by collective parity;
   * group rank 0 zeroes the next collective's at each first rendezvous.
   * One cache line of its own (every rank claims from it). */
  atomic_size_t *claim;
  tpost *post[2]; /* (size) each: posts of even and odd collectives */
  /* Split results, under job->mu: written by group rank 0 for the split
   * whose first rendezvous was number split_seq. */
  uint64_t split_seq;
  struct tgroup **split_group; /* (size) */
  int *split_rank;             /* (size) */
  /* Point-to-point, per destination rank, oldest first. */
  tmsg **inbox;         /* (size) */
  top **posted;         /* (size) receives waiting for their send */
  atomic_uint *nposted; /* (size) receives ever posted at each rank, for a
                          * large send to watch without the mutex */
} tgroup;

typedef struct tcomm {
  px_comm *c;
  tjob *job;
  tgroup *g;
  int rank;
  int world_rank;
  const void **srcs; /* (size) scratch for reductions */
  const void **blk;  /* (size) scratch for pxt_reduce_to_all */
  bool *missing;     /* (size) scratch for the watchdog: ranks not arrived */
  /* Used by one thread at a time (the caller or the progress thread,
   * handed over under job->mu). */
  uint64_t seq;   /* rendezvous this rank has reached on g */
  uint64_t ncoll; /* collectives started on g: parity picks g->post[] */
  void *small;    /* scratch of SMALL_BYTES for small all-reduces, lazily */
  /* Started operations, oldest first; the head stays until it completes. */
  top *head, *tail;
  pthread_cond_t qcv;
  bool started, stop;
  bool running; /* a thread is running the head of the queue */
  /* The queue is held for this rank's waits: the progress thread leaves it
   * alone until a wait blocks or a test finds it stale (threads.c).
   * Written under job->mu; read without it by px_request_test. */
  atomic_bool held;
  pthread_t thread;
  struct tcomm *jnext; /* job->comms */
} tcomm;

/* One operation; a heap copy of it is the px_request of an i* call. */
struct top {
  px_request base;
  tcomm *tc;
  tkind kind;
  const void *send;
  void *recv;
  size_t count;
  px_dtype dtype;
  px_reduce_op op;
  int root;
  int peer, tag;
  int color, key;
  px_comm *split_out;
  char label[PX_COMM_LABEL_MAX];
  double timeout;
  struct timespec queued_at; /* when an i* operation was queued */
  bool posted;               /* a receive in its group's posted list */
  atomic_bool done;          /* set last (release); the waiter may then free it */
  px_status status;
  char msg[2 * MSG_MAX]; /* room for the job's reason and what was given up */
  top *next;
};

/* ---- Deadlines --------------------------------------------------------------- */

typedef struct deadline {
  bool set;
  struct timespec at; /* CLOCK_MONOTONIC */
} deadline;

/* ---- Shared by threads.c and threads_p2p.c -------------------------------- */

deadline pxt_deadline_in(double seconds);
/* Waits on the job's condition variable: 0, or ETIMEDOUT once d passed.
 * Under j->mu, counted in j->sleepers. */
int pxt_job_wait(tjob *j, const deadline *d);
/* After a seq_cst store that a waiter may wait for: wakes blocked waiters
 * (takes j->mu only when some are blocked).  Not under j->mu. */
void pxt_wake(tjob *j);
/* Polls `flag` for the job's spin budget; true once it is set.  False when
 * the budget ran out or the job failed: then block (under j->mu, with
 * j->sleepers counted) and check again. */
bool pxt_spin_flag(tjob *j, atomic_bool *flag);
/* Polls *p for the job's spin budget; true once it differs from `was`. */
bool pxt_spin_change(tjob *j, atomic_uint *p, unsigned was);

/* Under j->mu, by a wait about to block (threads_progress.c): hands every
 * held queue of the job to its progress thread, so an operation that a
 * peer waits for moves even while its own rank waits for something else. */
void pxt_release_held_locked(tjob *j);

/* Under j->mu.  The first failure wins; later ones are consequences. */
void pxt_job_fail_locked(tjob *j, px_status st, const char *msg);
void pxt_op_set_error(top *op, px_status st, const char *msg);
/* Under j->mu: the job failed elsewhere; say why and what op gave up. */
void pxt_op_fail_from_job(top *op);
/* Under j->mu: op's deadline passed waiting for the ranks in `missing`
 * (group ranks): print, fail the job with PX_ERR_TIMEOUT, set op's error. */
void pxt_watchdog_locked(top *op, const bool *missing);
/* Under j->mu: group rank `gone` returned from its function while op
 * waits for it: print, fail the job with PX_ERR_COMM, set op's error. */
void pxt_gone_locked(top *op, int gone);
void pxt_op_init(top *op, px_comm *c, tkind kind);

px_status pxt_send(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag);
px_status pxt_recv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag);
px_status pxt_isend(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag, px_request **req);
px_status pxt_irecv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag, px_request **req);
/* Waits for a receive (under the watchdog) until it is done. */
void pxt_wait_recv(top *op);

/* threads_wait.c: one more poll of a spin-then-block wait within the job's
 * budget (after a pause or a yield), or false: block now.  `yield_now`:
 * the thread waited for may need this core. */
typedef struct spinner {
  int polls;
  bool yield; /* past the pause phase */
  struct timespec t0;
} spinner;
bool pxt_spin_more_as(const tjob *j, spinner *s, bool yield_now);
bool pxt_spin_more(const tjob *j, spinner *s);
/* Waits (spin, yielding, then block) until `flag` is set by a publisher
 * that calls pxt_wake after setting it, or by one holding j->mu. */
void pxt_wait_flag(tjob *j, atomic_bool *flag);

/* threads_fail.c */
const char *pxt_kind_name(tkind k);
/* Under j->mu: a group rank of op's group in `missing` whose function has
 * returned, or -1. */
int pxt_gone_rank_locked(const tcomm *tc, const bool *missing);

/* threads_group.c */
tjob *pxt_job_new(void);
void pxt_job_unref(tjob *j);
void pxt_group_free(tgroup *g);
/* Under j->mu: a group of `size` ranks, or NULL (out of memory). */
tgroup *pxt_group_new_locked(tjob *j, int size);
void pxt_group_unref(tgroup *g);
/* A rank's px_comm on group g; takes over one of g's member references. */
px_comm *pxt_tcomm_new(tjob *j, tgroup *g, int rank, double timeout);
void pxt_tcomm_free(px_comm *c);

/* threads_rendezvous.c: arrive at this rank's next rendezvous on op's
 * group (posting `post` at a collective's first) and wait for the peers;
 * enter_data: mark this rank busy reading peers' buffers afterwards. */
px_status pxt_rendezvous(top *op, const deadline *d, const tpost *post, bool enter_data);
/* Under j->mu: group rank 0 builds the groups of the split whose first
 * rendezvous was number k. */
void pxt_build_split_locked(tgroup *g, const tpost *post, uint64_t k);

/* threads_coll.c: runs op (a collective) on this thread. */
void pxt_execute(top *op);

/* threads_progress.c */
px_status pxt_run_blocking(top *op);
px_status pxt_start_async(const top *proto, px_request **req);
/* Waits for a queued operation, running the queue's head meanwhile. */
void pxt_wait_queued(top *op);
/* For px_request_test of a queued operation not yet done: hands its
 * queue to the progress thread if it has been held for HOLD_TEST_NS. */
void pxt_test_queued(top *op);
/* Adds tc to (removes it from) its job's list of communicators. */
void pxt_job_add_comm(tcomm *tc);
void pxt_job_remove_comm_locked(tcomm *tc);

/* threads_reduce.c: dst[i] = srcs[0][i] ∘ srcs[1][i] ∘ ... ∘ srcs[n-1][i]
 * (AVG: the sum, then divided by n), left to right, so the bits equal the
 * serial rank-order reduction.  dst may be one of the sources exactly,
 * never a partial overlap. */
void pxt_reduce(void *dst, const void *const *srcs, int n, size_t count, px_dtype dt, px_reduce_op op);
/* The same, with non-temporal stores or not as `stream` says (a piece of a
 * large output; never when dst is a source); pxt_reduce streams outputs of
 * STREAM_BYTES and more. */
void pxt_reduce_as(void *dst, const void *const *srcs, int n, size_t count, px_dtype dt, px_reduce_op op, bool stream);
/* The same reduction of bufs[0..n) (count elements each), written back
 * into every one of them: block by block, each block's sources are read
 * before its destinations are written.  blk: scratch of n pointers. */
void pxt_reduce_to_all(void *const *bufs, const void **blk, int n, size_t count, px_dtype dt, px_reduce_op op);
/* src (bytes) copied into each of dsts[0..n) but one that is src itself,
 * block by block so that src is read from memory once; `stream`: past the
 * cache (non-temporal stores, fenced before returning). */
void pxt_copy_to_all(void *const *dsts, int n, const void *src, size_t bytes, bool stream);

#endif
