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
// other's buffers.  An all-reduce takes one of three paths, all computing
// each element once, in rank order 0, 1, ..., N-1, so the result is
// bitwise the same on every rank and in every run, and equal to the serial
// x0 ∘ x1 ∘ ... ∘ x(N-1):
//   - up to SMALL_BYTES (16 KiB) every rank reduces the whole buffer into a
//     scratch, and copies it home after a second rendezvous;
//   - up to CHUNKED_MAX_BYTES (32 MiB) ranks claim chunks of ~64 KiB from
//     a shared counter; the claimer reduces the chunk of all N buffers and
//     writes the result into all N: every buffer is read once and written
//     once, two rendezvous in all, and a rank slowed by other load simply
//     claims fewer chunks;
//   - past that, a reduce-scatter (rank r reduces slice r into its own
//     buffer) then an all-gather (each rank copies the other slices from
//     their owners), three rendezvous: in DRAM this measured 2-3x faster
//     than the chunks on the 2-core guest.
// A reduce-scatter reduces block r of all send buffers into recv; an
// all-gather and a broadcast are memcpy from the peers' buffers.  The
// reductions are one fused pass (threads_reduce.c); memcpy streams large
// copies past the cache by itself.
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
// measured in the same run, is its fraction of the bound.  (The sliced
// all-reduce moves (3N-1)·B/(2N) per rank, 1.25 B for N = 2: at most 80%
// of the bound by construction.)
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

/* All-reduces up to this many bytes take the two-rendezvous path (each rank
 * reduces the whole buffer into this scratch); larger ones split the work. */
#ifndef SMALL_BYTES
#define SMALL_BYTES (16u << 10)
#endif
/* A wait polls with a cpu pause for SPIN_PAUSE_NS, then with sched_yield
 * until its budget is spent (SPIN_NS; fewer when ranks outnumber cores,
 * which yield from the start), then blocks.  Yielding lets a peer that
 * shares this core (other programs' load, or our own progress threads)
 * run, where a pure spin would hold the core the peer needs. */
#define SPIN_PAUSE_NS 4000
#define SPIN_NS 100000
#define SPIN_NS_OVERSUBSCRIBED 20000

static const char *kind_name(tkind k) {
  static const char *names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                "barrier", "split", "send", "recv"};
  return names[k];
}

deadline pxt_deadline_in(double seconds) {
  deadline d = {0};
  if (!(seconds > 0) || isinf(seconds)) return d;
  clock_gettime(CLOCK_MONOTONIC, &d.at);
  double whole = floor(seconds);
  d.at.tv_sec += (time_t)whole;
  d.at.tv_nsec += (long)((seconds - whole) * 1e9);
  if (d.at.tv_nsec >= 1000000000L) {
    d.at.tv_sec++;
    d.at.tv_nsec -= 1000000000L;
  }
  d.set = true;
  return d;
}

/* 0, or ETIMEDOUT once the deadline has passed. */
int pxt_job_wait(tjob *j, const deadline *d) {
  if (!d || !d->set) return pthread_cond_wait(&j->cv, &j->mu);
  return pthread_cond_timedwait(&j->cv, &j->mu, &d->at);
}

/* ---- Spinning, then blocking ---------------------------------------------------
 * A wait first polls its condition (an atomic) for the job's spin budget,
 * so a peer that arrives within it costs a cache-line transfer instead of
 * a futex wake-up; then it blocks on the job's condition variable, so a
 * rank waiting for a stalled peer sleeps.  A blocked waiter counts itself
 * in j->sleepers before its last check; a publisher stores (seq_cst), then
 * reads j->sleepers and broadcasts only if someone may sleep. */

void pxt_wake(tjob *j) {
  if (atomic_load(&j->sleepers) == 0) return;
  pthread_mutex_lock(&j->mu);
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

typedef struct spinner {
  int polls;
  bool yield;  /* past the pause phase */
  struct timespec t0;
} spinner;

/* One more poll within the budget (after a pause or a yield), or false:
 * block now.  `yield_now`: the thread waited for may need this core. */
static bool spin_more_as(const tjob *j, spinner *s, bool yield_now) {
  if (s->polls++ == 0) {
    clock_gettime(CLOCK_MONOTONIC, &s->t0);
    s->yield = yield_now || j->spin_yield;
  } else if (s->yield || (s->polls & 15) == 0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long long ns = (long long)(t.tv_sec - s->t0.tv_sec) * 1000000000LL + (t.tv_nsec - s->t0.tv_nsec);
    if (ns >= j->spin_ns) return false;
    if (ns >= SPIN_PAUSE_NS) s->yield = true;
  }
  if (s->yield) sched_yield();
  else cpu_relax();
  return true;
}

static bool spin_more(const tjob *j, spinner *s) { return spin_more_as(j, s, false); }

bool pxt_spin_flag(tjob *j, atomic_bool *flag) {
  spinner sp = {0};
  do {
    if (atomic_load_explicit(flag, memory_order_acquire)) return true;
    if (atomic_load_explicit(&j->failed, memory_order_relaxed)) return false;
  } while (spin_more(j, &sp));
  return false;
}

bool pxt_spin_change(tjob *j, atomic_uint *p, unsigned was) {
  spinner sp = {0};
  do {
    if (atomic_load_explicit(p, memory_order_relaxed) != was) return true;
    if (atomic_load_explicit(&j->failed, memory_order_relaxed)) return false;
  } while (spin_more(j, &sp));
  return false;
}

/* Waits (spin, then block) until `flag` is set by a publisher that calls
 * pxt_wake after setting it, or by one holding j->mu that broadcasts.
 * Used for the progress thread's operations: this rank's own progress
 * thread does the work, maybe on this very core, so the spin yields. */
static void wait_flag(tjob *j, atomic_bool *flag) {
  spinner sp = {0};
  do {
    if (atomic_load_explicit(flag, memory_order_acquire)) return;
  } while (spin_more_as(j, &sp, true));
  pthread_mutex_lock(&j->mu);
  atomic_fetch_add(&j->sleepers, 1);
  while (!atomic_load(flag)) pthread_cond_wait(&j->cv, &j->mu);
  atomic_fetch_sub(&j->sleepers, 1);
  pthread_mutex_unlock(&j->mu);
}

/* ---- Failure ------------------------------------------------------------------ */

/* Under j->mu.  The first failure wins; later ones are consequences. */
void pxt_job_fail_locked(tjob *j, px_status st, const char *msg) {
  if (j->failed) return;
  j->fail_status = st;
  snprintf(j->fail_msg, sizeof j->fail_msg, "%s", msg);
  // Spinners see this store; sleepers get the broadcast.
  atomic_store(&j->failed, true);
  pthread_cond_broadcast(&j->cv);
}

void pxt_op_set_error(top *op, px_status st, const char *msg) {
  op->status = st;
  snprintf(op->msg, sizeof op->msg, "%s", msg);
}

static const char *label_of(const top *op) { return op->label[0] ? op->label : "no label set"; }

/* Under j->mu: the job failed elsewhere; say why and what this rank gave up. */
void pxt_op_fail_from_job(top *op) {
  tjob *j = op->tc->job;
  op->status = j->fail_status;
  snprintf(op->msg, sizeof op->msg, "%s; giving up %s (%s)", j->fail_msg, kind_name(op->kind), label_of(op));
}

/* Under j->mu: this rank's deadline passed.  `missing` are ranks of the
 * group that have not arrived. */
void pxt_watchdog_locked(top *op, const bool *missing) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  char list[200] = "[", wlist[200] = "[";
  size_t k = 1, wk = 1;
  int shown = 0;
  for (int r = 0; r < g->size; r++) {
    if (!missing[r]) continue;
    if (shown == 32) { // enough to act on; the rest would drown the message
      k += (size_t)snprintf(list + k, sizeof list - k, ", ...");
      wk += (size_t)snprintf(wlist + wk, sizeof wlist - wk, ", ...");
      break;
    }
    k += (size_t)snprintf(list + k, sizeof list - k, "%s%d", shown ? ", " : "", r);
    wk += (size_t)snprintf(wlist + wk, sizeof wlist - wk, "%s%d", shown ? ", " : "", g->world_rank[r]);
    shown++;
    if (k >= sizeof list - 8 || wk >= sizeof wlist - 8) break;
  }
  snprintf(list + (k < sizeof list - 2 ? k : sizeof list - 2), 2, "]");
  snprintf(wlist + (wk < sizeof wlist - 2 ? wk : sizeof wlist - 2), 2, "]");
  char msg[MSG_MAX];
  if (g->is_world)
    snprintf(msg, sizeof msg, "rank %d: watchdog: %s (%s) did not complete within %g s; waiting on ranks %s",
             tc->world_rank, kind_name(op->kind), label_of(op), op->timeout, list);
  else
    snprintf(msg, sizeof msg,
             "rank %d: watchdog: %s (%s) did not complete within %g s; waiting on ranks %s of this "
             "group of %d (world ranks %s)",
             tc->world_rank, kind_name(op->kind), label_of(op), op->timeout, list, g->size, wlist);
  fprintf(stderr, "plexus: %s\n", msg);
  pxt_job_fail_locked(tc->job, PX_ERR_TIMEOUT, msg);
  pxt_op_set_error(op, PX_ERR_TIMEOUT, msg);
}

/* Under j->mu: the first rank in `missing` whose function has returned, or
 * -1.  Such a rank can never arrive, so waiting for the watchdog would only
 * delay the same verdict (typically: a rank ran out of data a step early). */
static int gone_rank_locked(const tcomm *tc, const bool *missing) {
  const tgroup *g = tc->g;
  if (!tc->job->finished) return -1;
  for (int r = 0; r < g->size; r++)
    if (missing[r] && tc->job->finished[g->world_rank[r]]) return r;
  return -1;
}

/* Under j->mu: fail the job because group rank `gone` has returned. */
void pxt_gone_locked(top *op, int gone) {
  tcomm *tc = op->tc;
  char msg[MSG_MAX];
  if (op->kind == K_RECV)
    snprintf(msg, sizeof msg,
             "rank %d returned from its function without sending the message (tag %d) that rank %d waits for "
             "in recv (%s)", tc->g->world_rank[gone], op->tag, tc->world_rank, label_of(op));
  else
    snprintf(msg, sizeof msg,
             "rank %d returned from its function while rank %d waits for it in %s (%s); every rank must "
             "make the same collective calls",
             tc->g->world_rank[gone], tc->world_rank, kind_name(op->kind), label_of(op));
  fprintf(stderr, "plexus: %s\n", msg);
  pxt_job_fail_locked(tc->job, PX_ERR_COMM, msg);
  pxt_op_set_error(op, PX_ERR_COMM, msg);
}

/* ---- Groups and jobs --------------------------------------------------------- */

static tjob *job_new(void) {
  tjob *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  // Deadlines are monotonic: a clock step must not fire or starve the watchdog.
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&j->sleepers, 0);
  atomic_init(&j->failed, false);
  j->refs = 1;
  return j;
}

static void job_unref(tjob *j) {
  pthread_mutex_lock(&j->mu);
  bool last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pthread_cond_destroy(&j->cv);
  pthread_mutex_destroy(&j->mu);
  free(j->finished);
  free(j);
}

static void group_free(tgroup *g) {
  if (!g) return;
  if (g->inbox)
    for (int r = 0; r < g->size; r++)
      while (g->inbox[r]) {
        tmsg *m = g->inbox[r];
        g->inbox[r] = m->next;
        free(m);
      }
  free(g->world_rank);
  free(g->slot);
  free(g->claim);
  free(g->post[0]);
  free(g->post[1]);
  free(g->split_group);
  free(g->split_rank);
  free(g->inbox);
  free(g->posted);
  free(g->nposted);
  free(g);
}

/* Under j->mu (or before any thread runs): a group of `size` members, each
 * of whose tcomms will hold one reference; the group holds one on the job. */
static tgroup *group_new_locked(tjob *j, int size) {
  tgroup *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->job = j;
  g->size = size;
  g->refs = size;
  size_t n = (size_t)size;
  g->world_rank = calloc(n, sizeof *g->world_rank);
  // Whole cache lines, so no slot shares one with other data.
  g->slot = aligned_alloc(_Alignof(tslot), n * sizeof *g->slot);
  g->claim = aligned_alloc(64, 64);
  g->post[0] = calloc(n, sizeof *g->post[0]);
  g->post[1] = calloc(n, sizeof *g->post[1]);
  g->split_group = calloc(n, sizeof *g->split_group);
  g->split_rank = calloc(n, sizeof *g->split_rank);
  g->inbox = calloc(n, sizeof *g->inbox);
  g->posted = calloc(n, sizeof *g->posted);
  g->nposted = calloc(n, sizeof *g->nposted);
  if (!g->nposted || !g->claim ||!g->world_rank || !g->slot || !g->post[0] || !g->post[1] || !g->split_group || !g->split_rank ||
      !g->inbox || !g->posted) {
    group_free(g);
    return NULL;
  }
  for (size_t r = 0; r < n; r++) {
    atomic_init(&g->slot[r].seq, 0);
    atomic_init(&g->slot[r].busy, false);
    atomic_init(&g->nposted[r], 0);
  }
  atomic_init(&g->claim[0], 0);
  atomic_init(&g->claim[1], 0);
  j->refs++;
  return g;
}

/* Drops one member's reference; the last one frees the group. */
static void group_unref(tgroup *g) {
  tjob *j = g->job;
  pthread_mutex_lock(&j->mu);
  bool last = --g->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  group_free(g);
  job_unref(j);
}

/* ---- Rendezvous ---------------------------------------------------------------- */

static void describe(char *out, size_t n, const tpost *p) {
  switch (p->kind) {
  case K_ALLREDUCE:
  case K_REDUCE_SCATTER:
    snprintf(out, n, "%s (count %zu, %s, %s)", kind_name(p->kind), p->count, px_dtype_name(p->dtype),
             px_comm_op_name(p->op));
    break;
  case K_BROADCAST:
    snprintf(out, n, "%s (count %zu, %s, root %d)", kind_name(p->kind), p->count, px_dtype_name(p->dtype),
             p->root);
    break;
  case K_ALLGATHER:
    snprintf(out, n, "%s (count %zu, %s)", kind_name(p->kind), p->count, px_dtype_name(p->dtype));
    break;
  default:
    snprintf(out, n, "%s", kind_name(p->kind));
  }
}

static bool same_call(const tpost *a, const tpost *b) {
  if (a->kind != b->kind) return false;
  switch (a->kind) {
  case K_ALLREDUCE:
  case K_REDUCE_SCATTER:
    return a->count == b->count && a->dtype == b->dtype && a->op == b->op;
  case K_BROADCAST:
    return a->count * px_dtype_size(a->dtype) == b->count * px_dtype_size(b->dtype) && a->root == b->root;
  case K_ALLGATHER:
    return a->count * px_dtype_size(a->dtype) == b->count * px_dtype_size(b->dtype);
  default:
    return true;
  }
}

/* After the first rendezvous of a collective, on every rank: all posts are
 * in, and every rank compares the same posts, so all see a mismatch (and
 * the same first one).  A mismatch would make ranks read past each other's
 * buffers, so it ends the job.  False: the job failed. */
static bool check_calls(tcomm *tc) {
  tgroup *g = tc->g;
  const tpost *post = g->post[tc->ncoll & 1];
  for (int r = 1; r < g->size; r++) {
    if (same_call(&post[0], &post[r])) continue;
    char a[160], b[160], msg[MSG_MAX];
    describe(a, sizeof a, &post[0]);
    describe(b, sizeof b, &post[r]);
    snprintf(msg, sizeof msg,
             "collective mismatch: rank %d called %s but rank %d called %s; every rank must call the "
             "same collectives in the same order", g->world_rank[0], a, g->world_rank[r], b);
    pthread_mutex_lock(&g->job->mu);
    if (!g->job->failed) {
      fprintf(stderr, "plexus: %s\n", msg);
      pxt_job_fail_locked(g->job, PX_ERR_COMM, msg);
    }
    pthread_mutex_unlock(&g->job->mu);
    return false;
  }
  return true;
}

/* Under j->mu, by group rank 0 after the first rendezvous of a split (number
 * k): builds one group per color, members ordered by (key, old rank), and
 * publishes each rank's new group and rank in g->split_*, marked with k so
 * that no rank mistakes an older split's result for this one's. */
static void build_split_locked(tgroup *g, const tpost *post, uint64_t k) {
  tjob *j = g->job;
  int n = g->size;
  int *members = malloc((size_t)n * sizeof *members);
  bool *done = calloc((size_t)n, sizeof *done);
  g->split_seq = k;
  for (int r = 0; r < n; r++) {
    g->split_group[r] = NULL;
    g->split_rank[r] = -1;
  }
  if (!members || !done) goto nomem;
  for (int first = 0; first < n; first++) {
    if (done[first] || post[first].color < 0) continue;
    int color = post[first].color, m = 0;
    for (int r = first; r < n; r++) {
      if (done[r] || post[r].color != color) continue;
      done[r] = true;
      // Insertion sort by (key, old rank); old ranks arrive increasing.
      int at = m++;
      while (at > 0 && post[members[at - 1]].key > post[r].key) {
        members[at] = members[at - 1];
        at--;
      }
      members[at] = r;
    }
    tgroup *sub = group_new_locked(j, m);
    if (!sub) goto nomem;
    sub->is_world = false;
    for (int q = 0; q < m; q++) {
      sub->world_rank[q] = g->world_rank[members[q]];
      g->split_group[members[q]] = sub;
      g->split_rank[members[q]] = q;
    }
  }
  free(members);
  free(done);
  return;
nomem:
  free(members);
  free(done);
  // Groups already built are published; each member frees its share
  // after seeing the failure.
  fprintf(stderr, "plexus: split: out of memory building sub-groups\n");
  pxt_job_fail_locked(j, PX_ERR_NOMEM, "split: out of memory building sub-groups");
}

/* True once every rank of g has reached rendezvous k; *from is the first
 * rank not seen there yet (ranks before it need no second look). */
static bool all_reached(const tgroup *g, uint64_t k, int *from) {
  for (int r = *from; r < g->size; r++)
    if (atomic_load_explicit(&g->slot[r].seq, memory_order_acquire) < k) {
      *from = r;
      return false;
    }
  *from = g->size;
  return true;
}

/* Under j->mu: missing[r] = group rank r has not reached rendezvous k. */
static void list_missing_locked(tcomm *tc, uint64_t k) {
  for (int r = 0; r < tc->g->size; r++) tc->missing[r] = atomic_load(&tc->g->slot[r].seq) < k;
}

/* The blocking half of a rendezvous wait, after the spin: sleeps on the
 * job's condition variable under the watchdog.  True once all reached k;
 * false when the job failed (*fired: this rank's watchdog or gone-rank
 * verdict failed it, and op holds the message). */
static bool block_until_reached(top *op, const deadline *d, uint64_t k, bool *fired) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tjob *j = tc->job;
  bool ok = false;
  pthread_mutex_lock(&j->mu);
  atomic_fetch_add(&j->sleepers, 1);
  for (;;) {
    // Orders the count above (and each wake-up) before the loads of the
    // slots, which are only acquire: with the publisher's seq_cst store and
    // load of `sleepers`, one of the two sees the other.
    atomic_thread_fence(memory_order_seq_cst);
    int from = 0;
    if (all_reached(g, k, &from)) {
      ok = true;
      break;
    }
    if (j->failed) break;
    list_missing_locked(tc, k);
    int gone = gone_rank_locked(tc, tc->missing);
    if (gone >= 0) {
      pxt_gone_locked(op, gone);
      *fired = true;
      break;
    }
    if (pxt_job_wait(j, d) == ETIMEDOUT) {
      from = 0;
      if (all_reached(g, k, &from)) {
        ok = true;
        break;
      }
      if (!j->failed) {
        list_missing_locked(tc, k);
        pxt_watchdog_locked(op, tc->missing);
        *fired = true;
      }
      break;
    }
  }
  atomic_fetch_sub(&j->sleepers, 1);
  pthread_mutex_unlock(&j->mu);
  return ok;
}

/* Waits (spin, then block) until no rank of g is in a data phase. */
static void wait_not_busy(tjob *j, tgroup *g) {
  spinner sp = {0};
  int r = 0;
  do {
    // seq_cst: the other half of the Dekker pair in rendezvous.
    while (r < g->size && !atomic_load(&g->slot[r].busy)) r++;
    if (r == g->size) return;
  } while (spin_more(j, &sp));
  pthread_mutex_lock(&j->mu);
  atomic_fetch_add(&j->sleepers, 1);
  for (r = 0; r < g->size; r++)
    while (atomic_load(&g->slot[r].busy)) pthread_cond_wait(&j->cv, &j->mu);
  atomic_fetch_sub(&j->sleepers, 1);
  pthread_mutex_unlock(&j->mu);
}

/* Waits until every rank of the group has arrived.  `post` (at the first
 * rendezvous of an operation) is what this rank brings; `enter_data` says
 * the rank will read peers' buffers before its next rendezvous.
 *
 * Rendezvous are numbered per rank and group (tc->seq); arriving at number
 * k is one seq_cst store of k into the rank's own slot, and the wait polls
 * the others' slots until each holds >= k: no lock, no shared counter that
 * all ranks write.  Posts are written before that store, so a rank that
 * sees k in a peer's slot sees its post.  Posts alternate between two
 * arrays by the parity of the collective: a rank may start collective m+1
 * (and post) while a peer still reads collective m's posts, but not m+2,
 * which needs that peer at m+1's first rendezvous. */
static px_status rendezvous(top *op, const deadline *d, const tpost *post, bool enter_data) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tjob *j = tc->job;
  tslot *mine = &g->slot[tc->rank];
  bool fired = false;
  uint64_t k = ++tc->seq;
  // Done reading peers' buffers: a failing peer waits for this (and may
  // then return and free them); the wake below covers it.
  bool was_busy = atomic_load_explicit(&mine->busy, memory_order_relaxed);
  if (was_busy) atomic_store(&mine->busy, false);
  if (atomic_load(&j->failed)) {
    if (was_busy) pxt_wake(j);
    goto failed;
  }
  if (post) g->post[tc->ncoll & 1][tc->rank] = *post;
  atomic_store(&mine->seq, k);
  pxt_wake(j);
  spinner sp = {0};
  for (int from = 0; !all_reached(g, k, &from);) {
    if (atomic_load_explicit(&j->failed, memory_order_relaxed)) goto failed;
    if (!spin_more(j, &sp)) {
      if (!block_until_reached(op, d, k, &fired)) goto failed;
      break;
    }
  }
  if (post && !check_calls(tc)) goto failed;
  // Everyone is past the previous collective, and none can claim in the
  // next before rank 0 arrives there: its counter is free to zero.
  if (post && tc->rank == 0) atomic_store_explicit(&g->claim[(tc->ncoll + 1) & 1], 0, memory_order_relaxed);
  if (enter_data) {
    // Dekker with a failing peer (it stores `failed`, then reads `busy`):
    // either it waits for this data phase, or this rank sees the failure.
    atomic_store(&mine->busy, true);
    if (atomic_load(&j->failed)) {
      atomic_store(&mine->busy, false);
      pxt_wake(j);
      goto failed;
    }
  }
  return PX_OK;

failed:
  // A peer may still be reading this rank's buffers: let it finish first.
  (void)atomic_load(&j->failed); // seq_cst, ordered before the loads of `busy`
  wait_not_busy(j, g);
  if (!fired) {
    pthread_mutex_lock(&j->mu);
    pxt_op_fail_from_job(op);
    pthread_mutex_unlock(&j->mu);
  }
  return op->status;
}

/* Elements per claimed chunk of a large all-reduce: about 4N chunks for
 * a medium buffer, 64 KiB each for a large one (a claim is one atomic add;
 * more chunks balance better when a rank is slowed by other load), in
 * whole 64-byte lines so that two chunks share no line of a buffer that
 * is 64-byte aligned. */
#ifndef CHUNK_MAX_BYTES
#define CHUNK_MAX_BYTES (64u << 10)
#endif
/* All-reduces above this many bytes use fixed slices instead of claimed
 * chunks (see run_allreduce). */
#ifndef CHUNKED_MAX_BYTES
#define CHUNKED_MAX_BYTES (32u << 20)
#endif

/* Rank r's slice [lo, hi) of count elements, in whole 64-byte lines so
 * that no two ranks write one cache line. */
static void slice_of(size_t count, size_t es, int n, int r, size_t *lo, size_t *hi) {
  size_t unit = es >= 64 ? 1 : 64 / es;
  size_t units = (count + unit - 1) / unit;
  size_t a = units / (size_t)n * (size_t)r + units % (size_t)n * (size_t)r / (size_t)n;
  size_t b = units / (size_t)n * (size_t)(r + 1) + units % (size_t)n * (size_t)(r + 1) / (size_t)n;
  *lo = a * unit < count ? a * unit : count;
  *hi = b * unit < count ? b * unit : count;
}

static size_t chunk_elems(size_t count, size_t es, int n) {
  size_t bytes = count * es / (4 * (size_t)n);
  if (bytes > CHUNK_MAX_BYTES) bytes = CHUNK_MAX_BYTES;
  if (bytes < (4u << 10)) bytes = 4u << 10;
  bytes = bytes / 64 * 64;
  return bytes / es > 0 ? bytes / es : 1;
}

/* ---- Executing collectives ------------------------------------------------------- */

static px_status run_allreduce(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  int n = g->size;
  size_t es = px_dtype_size(op->dtype), bytes = op->count * es;
  tpost p = {.kind = K_ALLREDUCE, .recv = op->recv, .count = op->count, .dtype = op->dtype, .op = op->op};
  px_status st = rendezvous(op, d, &p, true);
  if (st) return st;
  const tpost *post = g->post[tc->ncoll & 1];
  for (int k = 0; k < n; k++) tc->srcs[k] = post[k].recv;
  if (bytes <= SMALL_BYTES) {
    // Small: every rank reduces the whole buffer itself, in rank order, so
    // the bits are those of the split path below with one rendezvous fewer
    // (the reduction is cheaper than a round trip between cores).
    pxt_reduce(tc->small, tc->srcs, n, op->count, op->dtype, op->op);
    if ((st = rendezvous(op, d, NULL, false))) return st;
    if (bytes) memcpy(op->recv, tc->small, bytes);
    return PX_OK;
  }
  if (bytes > CHUNKED_MAX_BYTES) {
    // Huge (past the caches): reduce-scatter, my slice of every rank's
    // buffer reduced into mine; then all-gather, every other slice copied
    // from the rank that reduced it (memcpy streams it past the cache).
    // Measured on the 2-core guest at 256 MiB this beat the claimed chunks
    // below by 2-3x, which in turn win up to 16 MiB (1.5-2x).
    size_t lo, hi;
    int me = tc->rank;
    slice_of(op->count, es, n, me, &lo, &hi);
    for (int k = 0; k < n; k++) tc->srcs[k] = (const char *)post[k].recv + lo * es;
    if (hi > lo) pxt_reduce((char *)op->recv + lo * es, tc->srcs, n, hi - lo, op->dtype, op->op);
    if ((st = rendezvous(op, d, NULL, true))) return st;
    for (int k = 0; k < n; k++) {
      if (k == me) continue;
      slice_of(op->count, es, n, k, &lo, &hi);
      if (hi > lo) memcpy((char *)op->recv + lo * es, (const char *)post[k].recv + lo * es, (hi - lo) * es);
    }
    return rendezvous(op, d, NULL, false);
  }
  // Large: ranks claim chunks from a shared counter; the claimer reduces
  // the chunk of all N buffers (in rank order) and writes the result into
  // all N, so each element is computed once (the same bits whoever claims
  // it), every buffer is read once and written once, and a rank slowed by
  // other load simply claims fewer chunks.  Only the claimer touches a
  // chunk, so no rank reads what another writes before the next rendezvous.
  atomic_size_t *claim = &g->claim[tc->ncoll & 1];
  size_t chunk = chunk_elems(op->count, es, n), nchunks = (op->count + chunk - 1) / chunk;
  for (;;) {
    size_t c = atomic_fetch_add_explicit(claim, 1, memory_order_relaxed);
    if (c >= nchunks) break;
    size_t lo = c * chunk, m = op->count - lo < chunk ? op->count - lo : chunk;
    for (int k = 0; k < n; k++) tc->srcs[k] = (char *)post[k].recv + lo * es;
    pxt_reduce_to_all((void *const *)tc->srcs, tc->blk, n, m, op->dtype, op->op);
  }
  return rendezvous(op, d, NULL, false);
}

static px_status run_broadcast(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tpost p = {.kind = K_BROADCAST, .recv = op->recv, .count = op->count, .dtype = op->dtype, .root = op->root};
  px_status st = rendezvous(op, d, &p, true);
  if (st) return st;
  size_t bytes = op->count * px_dtype_size(op->dtype);
  const tpost *post = tc->g->post[tc->ncoll & 1];
  if (tc->rank != op->root && bytes) memcpy(op->recv, post[op->root].recv, bytes);
  return rendezvous(op, d, NULL, false);
}

static px_status run_allgather(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tpost p = {.kind = K_ALLGATHER, .send = op->send, .recv = op->recv, .count = op->count, .dtype = op->dtype};
  px_status st = rendezvous(op, d, &p, true);
  if (st) return st;
  size_t bytes = op->count * px_dtype_size(op->dtype);
  const tpost *post = g->post[tc->ncoll & 1];
  for (int k = 0; k < g->size && bytes; k++) {
    char *to = (char *)op->recv + (size_t)k * bytes;
    // In place (send is my own block of recv): nothing to move.
    if (to != post[k].send) memcpy(to, post[k].send, bytes);
  }
  return rendezvous(op, d, NULL, false);
}

static px_status run_reduce_scatter(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tpost p = {.kind = K_REDUCE_SCATTER, .send = op->send, .recv = op->recv, .count = op->count,
             .dtype = op->dtype, .op = op->op};
  px_status st = rendezvous(op, d, &p, true);
  if (st) return st;
  size_t block = op->count * px_dtype_size(op->dtype) * (size_t)tc->rank;
  const tpost *post = g->post[tc->ncoll & 1];
  for (int k = 0; k < g->size; k++) tc->srcs[k] = (const char *)post[k].send + block;
  if (op->count) pxt_reduce(op->recv, tc->srcs, g->size, op->count, op->dtype, op->op);
  return rendezvous(op, d, NULL, false);
}

static px_comm *tcomm_new(tjob *j, tgroup *g, int rank, double timeout);

/* Two rendezvous: after the first, group rank 0 builds the sub-groups from
 * the posts (under the job mutex); after the second every rank takes its
 * own.  Every rank reads the result under the mutex, also when failing, so
 * that a group built before the failure is never leaked. */
static px_status run_split(top *op, const deadline *d) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  tjob *j = tc->job;
  tpost p = {.kind = K_SPLIT, .color = op->color, .key = op->key};
  uint64_t first = tc->seq + 1;
  px_status st = rendezvous(op, d, &p, false);
  if (!st && tc->rank == 0) {
    pthread_mutex_lock(&j->mu);
    if (!j->failed) build_split_locked(g, g->post[tc->ncoll & 1], first);
    pthread_mutex_unlock(&j->mu);
  }
  if (!st) st = rendezvous(op, d, NULL, false);
  pthread_mutex_lock(&j->mu);
  bool mine = g->split_seq == first;
  tgroup *sub = mine ? g->split_group[tc->rank] : NULL;
  int new_rank = mine ? g->split_rank[tc->rank] : -1;
  if (!st && !mine && j->failed) {
    // Rank 0 found the job failed before it could build.
    pxt_op_fail_from_job(op);
    st = op->status;
  }
  pthread_mutex_unlock(&j->mu);
  if (st) {
    // The job failed after the groups were built: drop my share of mine.
    if (sub) group_unref(sub);
    return st;
  }
  if (!sub) return PX_OK; // negative color: in no group
  op->split_out = tcomm_new(tc->job, sub, new_rank, op->timeout);
  if (!op->split_out) {
    group_unref(sub);
    pxt_op_set_error(op, PX_ERR_NOMEM, "split: out of memory for the new communicator");
    pthread_mutex_lock(&tc->job->mu);
    // The other members would wait for this rank forever.
    pxt_job_fail_locked(tc->job, PX_ERR_NOMEM, "split: a rank ran out of memory for its new communicator");
    pthread_mutex_unlock(&tc->job->mu);
    return op->status;
  }
  return PX_OK;
}

static void execute(top *op) {
  deadline d = pxt_deadline_in(op->timeout);
  op->status = PX_OK;
  op->tc->ncoll++; // every collective, so its posts go to the other array than the last one's
  switch (op->kind) {
  case K_ALLREDUCE: run_allreduce(op, &d); break;
  case K_BROADCAST: run_broadcast(op, &d); break;
  case K_ALLGATHER: run_allgather(op, &d); break;
  case K_REDUCE_SCATTER: run_reduce_scatter(op, &d); break;
  case K_BARRIER: {
    tpost p = {.kind = K_BARRIER};
    rendezvous(op, &d, &p, false);
  } break;
  case K_SPLIT: run_split(op, &d); break;
  default: break;
  }
}

/* ---- Queue and progress thread ----------------------------------------------------- */

/* Under j->mu: if no thread is running this communicator's oldest queued
 * operation, runs it on this thread (releasing the mutex meanwhile) and
 * returns true.  One runner at a time keeps the queue's order.  Both the
 * progress thread and a rank waiting for a queued operation call this, so
 * a wait never idles while the operations ahead of it (and its own) sit
 * in the queue for the progress thread to wake up. */
static bool run_head_locked(tcomm *tc) {
  tjob *j = tc->job;
  if (tc->running || !tc->head) return false;
  top *op = tc->head;
  tc->running = true;
  pthread_mutex_unlock(&j->mu);
  execute(op);
  pthread_mutex_lock(&j->mu);
  tc->head = op->next;
  if (!tc->head) tc->tail = NULL;
  tc->running = false;
  atomic_store(&op->done, true); // op may be freed by its waiter from here on
  pthread_cond_broadcast(&j->cv);
  // The progress thread may have gone to sleep while this thread ran.
  if (tc->head || tc->stop) pthread_cond_signal(&tc->qcv);
  return true;
}

static void *progress_main(void *arg) {
  tcomm *tc = arg;
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  for (;;) {
    if (run_head_locked(tc)) continue;
    if (tc->stop && !tc->head) break;
    pthread_cond_wait(&tc->qcv, &j->mu);
  }
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

/* Waits for a queued collective: runs the queue's operations up to it on
 * this thread when no one else is running them, else waits for the
 * progress thread (spin, then block). */
static void wait_queued(top *op) {
  tcomm *tc = op->tc;
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  while (!atomic_load(&op->done) && run_head_locked(tc)) {}
  pthread_mutex_unlock(&j->mu);
  wait_flag(j, &op->done);
}

/* Under j->mu. */
static px_status enqueue_locked(tcomm *tc, top *op) {
  if (!tc->started) {
    if (pthread_create(&tc->thread, NULL, progress_main, tc) != 0)
      return px_error(PX_ERR_INTERNAL, "%s: could not start the progress thread of rank %d",
                      kind_name(op->kind), tc->world_rank);
    tc->started = true;
  }
  op->next = NULL;
  if (tc->tail) tc->tail->next = op;
  else tc->head = op;
  tc->tail = op;
  pthread_cond_signal(&tc->qcv);
  return PX_OK;
}

void pxt_op_init(top *op, px_comm *c, tkind kind) {
  memset(op, 0, sizeof *op);
  op->base.ops = &px_comm_threads_ops;
  op->tc = c->impl;
  op->kind = kind;
  op->timeout = c->timeout;
  // Copied now: the caller may relabel before a queued operation runs.
  memcpy(op->label, c->label, sizeof op->label);
}

/* A blocking collective: inline when nothing is queued on this
 * communicator, else behind the queued ones. */
static px_status run_blocking(top *op) {
  tcomm *tc = op->tc;
  tjob *j = tc->job;
  pthread_mutex_lock(&j->mu);
  bool idle = tc->head == NULL;
  if (!idle) {
    px_status st = enqueue_locked(tc, op);
    pthread_mutex_unlock(&j->mu);
    if (st) return st;
    wait_queued(op);
  } else {
    pthread_mutex_unlock(&j->mu);
    execute(op);
  }
  if (op->status) px_error(op->status, "%s", op->msg);
  return op->status;
}

static px_status start_async(const top *proto, px_request **req) {
  top *op = malloc(sizeof *op);
  if (!op) return px_error(PX_ERR_NOMEM, "%s: out of memory for a request", kind_name(proto->kind));
  *op = *proto;
  tjob *j = op->tc->job;
  pthread_mutex_lock(&j->mu);
  px_status st = enqueue_locked(op->tc, op);
  pthread_mutex_unlock(&j->mu);
  if (st) {
    free(op);
    return st;
  }
  *req = &op->base;
  return PX_OK;
}

/* ---- The backend table ------------------------------------------------------------ */

static px_status t_allreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op) {
  top o;
  pxt_op_init(&o, c, K_ALLREDUCE);
  o.recv = buf; o.count = count; o.dtype = dtype; o.op = op;
  return run_blocking(&o);
}

static px_status t_broadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root) {
  top o;
  pxt_op_init(&o, c, K_BROADCAST);
  o.recv = buf; o.count = count; o.dtype = dtype; o.root = root;
  return run_blocking(&o);
}

static px_status t_allgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype) {
  top o;
  pxt_op_init(&o, c, K_ALLGATHER);
  o.send = send; o.recv = recv; o.count = count; o.dtype = dtype;
  return run_blocking(&o);
}

static px_status t_reduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                  px_reduce_op op) {
  top o;
  pxt_op_init(&o, c, K_REDUCE_SCATTER);
  o.send = send; o.recv = recv; o.count = count; o.dtype = dtype; o.op = op;
  return run_blocking(&o);
}

static px_status t_barrier(px_comm *c) {
  top o;
  pxt_op_init(&o, c, K_BARRIER);
  return run_blocking(&o);
}

static px_status t_iallreduce(px_comm *c, void *buf, size_t count, px_dtype dtype, px_reduce_op op,
                              px_request **req) {
  top o;
  pxt_op_init(&o, c, K_ALLREDUCE);
  o.recv = buf; o.count = count; o.dtype = dtype; o.op = op;
  return start_async(&o, req);
}

static px_status t_ibroadcast(px_comm *c, void *buf, size_t count, px_dtype dtype, int root,
                              px_request **req) {
  top o;
  pxt_op_init(&o, c, K_BROADCAST);
  o.recv = buf; o.count = count; o.dtype = dtype; o.root = root;
  return start_async(&o, req);
}

static px_status t_iallgather(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                              px_request **req) {
  top o;
  pxt_op_init(&o, c, K_ALLGATHER);
  o.send = send; o.recv = recv; o.count = count; o.dtype = dtype;
  return start_async(&o, req);
}

static px_status t_ireduce_scatter(px_comm *c, const void *send, void *recv, size_t count, px_dtype dtype,
                                   px_reduce_op op, px_request **req) {
  top o;
  pxt_op_init(&o, c, K_REDUCE_SCATTER);
  o.send = send; o.recv = recv; o.count = count; o.dtype = dtype; o.op = op;
  return start_async(&o, req);
}

static px_status t_request_test(px_request *base, bool *done) {
  top *op = (top *)base;
  tjob *j = op->tc->job;
  (void)j;
  *done = atomic_load_explicit(&op->done, memory_order_acquire);
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
    wait_queued(op);
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
  px_status st = run_blocking(&o);
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

static void t_free(px_comm *c) {
  tcomm *tc = c->impl;
  tjob *j = tc->job;
  tgroup *g = tc->g;
  pthread_mutex_lock(&j->mu);
  tc->stop = true;
  pthread_cond_signal(&tc->qcv);
  bool started = tc->started;
  pthread_mutex_unlock(&j->mu);
  // The progress thread finishes what was started (each under its
  // watchdog), so no peer waits for an operation this rank dropped.
  if (started) pthread_join(tc->thread, NULL);
  pthread_mutex_lock(&j->mu);
  // Receives never waited for: complete them with an error so their
  // requests can still be waited and freed.
  while (g->posted[tc->rank]) {
    top *r = g->posted[tc->rank];
    g->posted[tc->rank] = r->next;
    r->posted = false;
    pxt_op_set_error(r, PX_ERR_COMM, "recv: the communicator was freed before the message arrived");
    atomic_store(&r->done, true);
  }
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  pthread_cond_destroy(&tc->qcv);
  free(tc->srcs);
  free(tc->blk);
  free(tc->missing);
  free(tc->small);
  free(tc);
  free(c);
  group_unref(g);
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
  .free = t_free,
};

/* A rank's px_comm on group g; takes over one of g's member references. */
static px_comm *tcomm_new(tjob *j, tgroup *g, int rank, double timeout) {
  px_comm *c = px_comm_alloc(&px_comm_threads_ops, PX_COMM_THREADS, rank, g->size);
  tcomm *tc = calloc(1, sizeof *tc);
  const void **srcs = malloc((size_t)g->size * sizeof *srcs);
  const void **blk = malloc((size_t)g->size * sizeof *blk);
  bool *missing = malloc((size_t)g->size * sizeof *missing);
  void *small = malloc(SMALL_BYTES);
  if (!c || !tc || !srcs || !blk || !missing || !small) {
    free(c);
    free(tc);
    free(srcs);
    free(blk);
    free(missing);
    free(small);
    return NULL;
  }
  tc->small = small;
  tc->missing = missing;
  tc->c = c;
  tc->job = j;
  tc->g = g;
  tc->rank = rank;
  tc->world_rank = g->world_rank[rank];
  tc->srcs = srcs;
  tc->blk = blk;
  pthread_cond_init(&tc->qcv, NULL);
  c->impl = tc;
  c->timeout = timeout;
  return c;
}

/* ---- px_comm_run with threads ------------------------------------------------------ */

typedef struct trank {
  px_comm *c;
  px_rank_fn fn;
  void *arg;
  int omp_threads;  /* this rank's share of the cores */
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
      fprintf(stderr, "plexus: rank %d: returned %d; failing the other ranks' communication\n",
              tc->world_rank, rc);
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
  tjob *j = job_new();
  tgroup *g = j ? group_new_locked(j, n) : NULL;
  trank *ranks = calloc((size_t)n, sizeof *ranks);
  if (j) j->finished = calloc((size_t)n, sizeof *j->finished);
  if (!j || !g || !ranks || !j->finished) {
    if (j) free(j->finished);
    free(ranks);
    group_free(g);
    free(j);
    return px_error(PX_ERR_NOMEM, "px_comm_run: out of memory starting %d ranks", n);
  }
  g->is_world = true;
  for (int r = 0; r < n; r++) g->world_rank[r] = r;
  // More ranks than cores: a spinning rank may hold the core its peer
  // needs, so spins yield and give up sooner.
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  j->spin_yield = cores > 0 && n > cores;
  j->spin_ns = j->spin_yield ? SPIN_NS_OVERSUBSCRIBED : SPIN_NS;
  int made = 0;
  for (; made < n; made++) {
    ranks[made].c = tcomm_new(j, g, made, PX_COMM_DEFAULT_TIMEOUT);
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
  for (int r = made; r < n; r++) group_unref(g);
  *exit_code = j->have_exit ? j->first_exit_code : 0;
  free(ranks);
  job_unref(j);
  return st;
}
