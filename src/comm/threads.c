// The threads backend: N ranks as threads of one process, talking through
// shared memory.
//
// Objects.  A *job* is everything one px_comm_run started: the failure
// state, and one mutex and condition variable that every *blocked* wait of
// every communicator uses, so a failure anywhere wakes and fails every
// waiter at once.  A *group* is one communicator as all its ranks see it
// (the world, or a piece of a split): one slot per rank (a rendezvous
// counter and a busy flag, each slot on its own cache line), the posts
// where ranks publish their buffers, and the mailboxes of point-to-point.
// Each rank holds a px_comm whose impl is its *tcomm*: its rank in the
// group and its queue of started operations.
//
// Rendezvous.  A rank's rendezvous on a group are numbered 1, 2, 3, ...;
// arriving at number k is writing the post (at a collective's first
// rendezvous) and then storing k into the rank's own slot; waiting is
// polling the other slots until each holds at least k.  No lock and no
// counter that all ranks write: a small collective costs a few cache-line
// transfers, not condition-variable wake-ups.  Every rank then compares
// the posts (all see the same ones), so a mismatch of collectives fails
// every rank with one message.  Posts alternate between two arrays by the
// parity of the collective: a rank may start collective m+1 while a peer
// still reads m's posts, never m+2.
//
// Waiting: spin, then block.  A wait polls for SPIN_PAUSE_NS with a cpu
// pause, then with sched_yield until SPIN_NS (the peer may need this core:
// other load, or ranks outnumbering cores, where the spin yields from the
// start and gives up after SPIN_NS_OVERSUBSCRIBED), then blocks on the
// job's condition variable.  So a peer that arrives within ~100 us is seen
// within a cache-line transfer, and a rank waiting for a stalled peer
// sleeps (test_comm_threads_waiting_rank_sleeps).  No wake-up is lost: a
// blocking waiter counts itself in job->sleepers and then checks again;
// a publisher stores (seq_cst), then reads sleepers and broadcasts under
// the mutex only if someone may sleep (pxt_wake).
//
// Collectives.  After the first rendezvous the ranks work directly on each
// other's buffers.  An all-reduce takes one of two paths, both computing
// each element once, in rank order 0, 1, ..., N-1, so the result is
// bitwise the same on every rank and in every run, and equal to the serial
// x0 ∘ x1 ∘ ... ∘ x(N-1):
//   - up to SMALL_BYTES (16 KiB) every rank reduces the whole buffer into a
//     scratch, and copies it home after a second rendezvous;
//   - past that, ranks claim chunks of ~64 KiB from a shared counter; the
//     claimer reduces the chunk of all N buffers and writes the result into
//     all N: every buffer is read once and written once (the copy bound's
//     traffic, below), two rendezvous in all, and a rank slowed by other
//     load simply claims fewer chunks.  (A reduce-scatter + all-gather
//     split, rank r reducing slice r, moves (3N-1)/(2N) of that, 1.25x at
//     N = 2; it served above 32 MiB until it measured slower than the
//     chunks there: docs/PERFORMANCE.md, "Figures behind code comments".)
// A reduce-scatter and an all-gather work on N blocks (block q: rank q's
// recv, resp. rank q's send): up to SMALL_BYTES in all each rank does its
// own block; past that, ranks claim pieces of all blocks from the same
// kind of counter, so a rank slowed by other load does less.  A
// reduce-scatter piece is reduced in rank order straight into its owner's
// recv (the same bits whoever computes it); an all-gather piece is pushed
// from its owner's send into all N recvs, read from memory once and
// written N times (N+1 blocks of traffic against the 2N of every rank
// pulling every block into its own recv).  A broadcast is a memcpy from
// the root's buffer.  The reductions are one fused pass
// (threads_reduce.c); outputs from STREAM_BYTES (16 MiB) are written with
// non-temporal stores (reductions, the all-gather's pushes) or by memcpy,
// which streams large copies past the cache by itself.
//
// The copy bound.  A large collective can be no faster than the memory
// traffic it needs; the least, per rank, with B the buffer (all-reduce,
// broadcast), the send total (reduce-scatter) or the recv total
// (all-gather):
//   all-reduce      read B, write B (every buffer read and written once)
//   reduce-scatter  read B, write B/N
//   all-gather      read B, write B (in place: (N-1)/N of that)
//   broadcast       non-roots read B, write B
// The bound is the time N threads take to memcpy, all at once, as many
// bytes each (a memcpy of X reads X and writes X, so X = (reads+writes)/2:
// B for all-reduce, all-gather and broadcast, (N+1)·B/(2N) for the
// reduce-scatter).  The time of a collective against that memcpy time,
// measured in the same run, is its fraction of the bound.
//
// Asynchronous operations.  i* operations go into the tcomm's FIFO queue,
// served by a progress thread that the first one starts; so operations of
// one communicator run in the order they started.  A blocking collective
// runs on the caller's thread when the queue is empty (no hand-off), else
// it queues behind the others.  A rank waiting for a queued operation
// (px_request_wait, or a blocking call behind the queue) runs the queue's
// head itself when the progress thread is not running one, so a wait never
// idles until the progress thread wakes up; one runner at a time keeps the
// order.  Each communicator has its own queue: one queue per rank would
// deadlock a program that starts collectives on two communicators in
// different orders on different ranks, which MPI allows.
//
// Held queues.  When the world's ranks, each with its share of OpenMP
// threads, already fill the cores (2 ranks × 1 thread on 2 cores), the
// progress thread can only run by taking a core from some rank's compute:
// waking it, its spins in the rendezvous and the hand-backs cost more than
// the operation (2-rank DDP of the MLP at batch 16 on 2 cores ran at 0.70
// of twice one rank with it, 0.87-0.89 without: docs/PERFORMANCE.md,
// "Figures behind code comments").  So there an i* operation is queued
// *held*: the progress thread leaves the queue alone and the rank runs it
// in its own wait, where its peers meet it.  A held operation still
// completes without its rank's wait, as under MPI, where any blocked call
// moves every pending operation: a wait anywhere in the job that is about
// to block (its spin over: some rank is not coming) hands every held
// queue to its progress thread, and a px_request_test that finds its
// operation held for HOLD_TEST_NS does the same for its queue.
// PX_COMM_THREADS_PROGRESS=thread|wait forces one way (default auto).
//
// Point-to-point (threads_p2p.c) is eager and never queued: a send copies
// the message into the receiver's posted buffer or inbox and returns; a
// posted receive spins, then blocks, on its `done` flag.
//
// Watchdog and failure.  Every wait that can block for a peer has the
// operation's deadline: once the spin is over it is a timed wait.  The
// first rank whose deadline passes prints which operation, label and ranks
// it was waiting on, and fails the job; a rank whose function returns
// non-zero, or that calls px_comm_abort, fails it too.  Spinning waits
// also watch the job's `failed` flag.  A failed job stays failed: every
// pending and later operation returns the error (PX_ERR_TIMEOUT or
// PX_ERR_COMM) with the reason.
//
// Buffer lifetime under failure.  Between rendezvous a rank may be reading
// a peer's buffer; a peer must not return (and perhaps free that buffer)
// meanwhile.  A rank in such a data phase sets its slot's `busy` flag, then
// checks `failed`; a failing rank has stored `failed`, and waits until no
// slot is busy before it returns (the two seq_cst store-then-load pairs
// make sure one of them sees the other).  Data phases are pure copies and
// arithmetic, so that wait is short.
#define _POSIX_C_SOURCE 200809L
#include "comm/threads.h"

#include <errno.h>
#include <omp.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- The backend table ------------------------------------------------------------ */

static px_status t_allreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op) {
  top o;
  pxt_op_init(&o, c, K_ALLREDUCE);
  o.recv = buf;
  o.count = count;
  o.dtype = dtype;
  o.op = op;
  return pxt_run_blocking(&o);
}

static px_status t_broadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root) {
  top o;
  pxt_op_init(&o, c, K_BROADCAST);
  o.recv = buf;
  o.count = count;
  o.dtype = dtype;
  o.root = root;
  return pxt_run_blocking(&o);
}

static px_status t_allgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype) {
  top o;
  pxt_op_init(&o, c, K_ALLGATHER);
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dtype = dtype;
  return pxt_run_blocking(&o);
}

static px_status t_reduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                  px_reduce_op op) {
  top o;
  pxt_op_init(&o, c, K_REDUCE_SCATTER);
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dtype = dtype;
  o.op = op;
  return pxt_run_blocking(&o);
}

static px_status t_barrier(px_comm *c) {
  top o;
  pxt_op_init(&o, c, K_BARRIER);
  return pxt_run_blocking(&o);
}

static px_status t_iallreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op, px_request **req) {
  top o;
  pxt_op_init(&o, c, K_ALLREDUCE);
  o.recv = buf;
  o.count = count;
  o.dtype = dtype;
  o.op = op;
  return pxt_start_async(&o, req);
}

static px_status t_ibroadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root, px_request **req) {
  top o;
  pxt_op_init(&o, c, K_BROADCAST);
  o.recv = buf;
  o.count = count;
  o.dtype = dtype;
  o.root = root;
  return pxt_start_async(&o, req);
}

static px_status t_iallgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                              px_request **req) {
  top o;
  pxt_op_init(&o, c, K_ALLGATHER);
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dtype = dtype;
  return pxt_start_async(&o, req);
}

static px_status t_ireduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                   px_reduce_op op, px_request **req) {
  top o;
  pxt_op_init(&o, c, K_REDUCE_SCATTER);
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dtype = dtype;
  o.op = op;
  return pxt_start_async(&o, req);
}

static px_status t_request_test(px_request *base, bool *done) {
  top *op = (top *)base;
  tjob *j = op->tc->job;
  (void)j;
  *done = atomic_load_explicit(&op->done, memory_order_acquire);
  if (!*done && op->kind != K_SEND && op->kind != K_RECV) pxt_test_queued(op);
  return PX_OK;
}

static px_status t_request_wait(px_request *base) {
  top *op = (top *)base;
  tjob *j = op->tc->job;
  if (op->kind == K_RECV) {
    pxt_wait_recv(op);
  } else {
    // Collectives run under their own deadline (on the progress thread
    // or this one) and always complete, so this wait needs no clock.
    (void)j;
    pxt_wait_queued(op);
  }
  px_status st = op->status;
  if (st) px_error(st, "%s", op->msg);
  free(op);
  return st;
}

static px_status t_split(px_comm *c, int color, int key, px_comm **out) {
  top o;
  pxt_op_init(&o, c, K_SPLIT);
  o.color = color;
  o.key = key;
  px_status st = pxt_run_blocking(&o);
  *out = o.split_out;
  return st;
}

static void t_abort(px_comm *c, const char *why) {
  tcomm *tc = c->impl;
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  if (!j->failed) {
    char msg[MSG_MAX];
    snprintf(msg, sizeof msg, "rank %d aborted: %s", tc->world_rank, why);
    fprintf(stderr, "plexus: rank %d: abort: %s\n", tc->world_rank, why);
    pxt_job_fail_locked(j, PX_ERR_COMM, msg);
  }
  pthread_mutex_unlock(&j->mu);
}

const px_comm_ops px_comm_threads_ops = {
  .name = "threads",
  .allreduce = t_allreduce,
  .broadcast = t_broadcast,
  .allgather = t_allgather,
  .reduce_scatter = t_reduce_scatter,
  .barrier = t_barrier,
  .send = pxt_send,
  .recv = pxt_recv,
  .iallreduce = t_iallreduce,
  .ibroadcast = t_ibroadcast,
  .iallgather = t_iallgather,
  .ireduce_scatter = t_ireduce_scatter,
  .isend = pxt_isend,
  .irecv = pxt_irecv,
  .request_test = t_request_test,
  .request_wait = t_request_wait,
  .split = t_split,
  .abort = t_abort,
  .free = pxt_tcomm_free,
};

/* ---- px_comm_run with threads ------------------------------------------------------ */

typedef struct trank {
  px_comm *c;
  px_rank_fn fn;
  void *arg;
  int omp_threads; /* this rank's share of the cores */
  pthread_t thread;
} trank;

static void *rank_main(void *arg) {
  trank *t = arg;
  tcomm *tc = t->c->impl;
  tjob *j = tc->job;
  // N ranks share the machine: each rank's kernels (OpenMP, and OpenBLAS's
  // OpenMP build, which follows the caller's setting) get 1/N of the threads.
  omp_set_num_threads(t->omp_threads);
  int rc = t->fn(t->c, t->arg);
  if (rc != 0) {
    pthread_mutex_lock(&j->mu);
    if (!j->have_exit) {
      j->have_exit = true;
      j->first_exit_code = rc;
    }
    if (!j->failed) {
      // Peers waiting for this rank would otherwise wait for the watchdog.
      char msg[MSG_MAX];
      snprintf(msg, sizeof msg, "rank %d failed (exit code %d)", tc->world_rank, rc);
      fprintf(stderr, "plexus: rank %d: returned %d; failing the other ranks' communication\n", tc->world_rank, rc);
      pxt_job_fail_locked(j, PX_ERR_COMM, msg);
    }
    pthread_mutex_unlock(&j->mu);
  }
  int me = tc->world_rank;
  t->c->owned_by_run = false;
  // After the free: it joins the progress thread, so everything this rank
  // started has run before its peers learn that it is gone.
  px_comm_free(t->c);
  pthread_mutex_lock(&j->mu);
  j->finished[me] = true;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

px_status px_comm_threads_run(int n, px_rank_fn fn, void *arg, int *exit_code) {
  const char *pv = getenv("PX_COMM_THREADS_PROGRESS");
  tprogress progress = PROGRESS_AUTO;
  if (pv && *pv) {
    if (strcmp(pv, "thread") == 0) progress = PROGRESS_THREAD;
    else if (strcmp(pv, "wait") == 0) progress = PROGRESS_WAIT;
    else if (strcmp(pv, "auto") != 0)
      return px_error(PX_ERR_INVALID, "px_comm_run: PX_COMM_THREADS_PROGRESS is \"%s\"; expected thread, wait or auto",
                      pv);
  }
  tjob *j = pxt_job_new();
  tgroup *g = j ? pxt_group_new_locked(j, n) : NULL;
  trank *ranks = calloc((size_t)n, sizeof *ranks);
  if (j) j->finished = calloc((size_t)n, sizeof *j->finished);
  if (!j || !g || !ranks || !j->finished) {
    if (j) free(j->finished);
    free(ranks);
    pxt_group_free(g);
    free(j);
    return px_error(PX_ERR_NOMEM, "px_comm_run: out of memory starting %d ranks", n);
  }
  g->is_world = true;
  for (int r = 0; r < n; r++) g->world_rank[r] = r;
  // More ranks than cores: a spinning rank may hold the core its peer
  // needs, so spins yield and give up sooner.
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  j->spin_yield = cores > 0 && n > cores;
  j->nranks = n;
  j->cores = cores > 0 ? cores : 0;
  j->progress = progress;
  j->spin_ns = j->spin_yield ? SPIN_NS_OVERSUBSCRIBED : SPIN_NS;
  int made = 0;
  for (; made < n; made++) {
    ranks[made].c = pxt_tcomm_new(j, g, made, PX_COMM_DEFAULT_TIMEOUT);
    if (!ranks[made].c) break;
    ranks[made].c->owned_by_run = true;
    ranks[made].fn = fn;
    ranks[made].arg = arg;
    ranks[made].omp_threads = omp_get_max_threads() / n > 1 ? omp_get_max_threads() / n : 1;
  }
  px_status st = PX_OK;
  int started = 0;
  if (made < n) {
    st = px_error(PX_ERR_NOMEM, "px_comm_run: out of memory for rank %d's communicator", made);
  } else {
    for (; started < n; started++)
      if (pthread_create(&ranks[started].thread, NULL, rank_main, &ranks[started]) != 0) break;
    if (started < n) {
      st = px_error(PX_ERR_INTERNAL, "px_comm_run: could not start the thread of rank %d of %d", started, n);
      pthread_mutex_lock(&j->mu);
      pxt_job_fail_locked(j, PX_ERR_COMM, "px_comm_run: not every rank could start");
      pthread_mutex_unlock(&j->mu);
    }
  }
  for (int r = 0; r < started; r++) pthread_join(ranks[r].thread, NULL);
  // Communicators whose thread never ran.
  for (int r = started; r < made; r++) {
    ranks[r].c->owned_by_run = false;
    px_comm_free(ranks[r].c);
  }
  // Member references of ranks that never got a communicator.
  for (int r = made; r < n; r++) pxt_group_unref(g);
  *exit_code = j->have_exit ? j->first_exit_code : 0;
  free(ranks);
  pxt_job_unref(j);
  return st;
}
