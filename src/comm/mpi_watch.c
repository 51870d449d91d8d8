// The MPI backend's watchdog thread (mpi_watch.h says what it does).
//
// Why a thread: MPI's blocking collectives run Open MPI's tuned algorithms
// (chosen per size by its decision tables), its non-blocking ones libnbc's
// (fewer algorithms, one per operation for every size, and a schedule that
// moves only when MPI_Test is called).  Measured on 2 ranks the blocking
// ones were faster at some sizes (docs/PERFORMANCE.md, "Figures behind
// code comments").  But a blocking MPI call cannot time out, and it
// spins while it waits: the deadline and the back-off of a stalled wait
// have to come from outside it.
//
// The armed call is published seqlock-style: the caller writes the fields
// (relaxed atomics), then an odd sequence number (seq_cst); disarming makes
// it even.  The watcher reads the number, the fields, and the number again,
// and acts only if it did not change.  The throttle's handler naps only if
// the call it was sent for is still armed, so a late signal costs the
// caller nothing once it has moved on.
#define _POSIX_C_SOURCE 200809L
#include "comm/mpi_watch.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The verdict's room: the rank list and up to 4 ranks' states with labels. */
#define VERDICT_MAX 1400

#ifdef PX_HAVE_MPI

#include "comm/internal.h"
#include "plexus/base.h"

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

/* The watcher wakes once per armed call's `spin` (0.25 s and more) at
 * most: at the moment that call would have stalled, or its deadline.
 * Between calls it naps IDLE_TICK_SECONDS, so a call armed meanwhile is
 * seen at most that late (its stall at spin + IDLE_TICK_SECONDS).  It used
 * to tick every 10 ms, and each tick could take the core from a rank in
 * the middle of a collective on a busy node; now a rank streaming
 * collectives sees it a few times a second. */
#define IDLE_TICK_SECONDS 0.1
/* No call armed for this long: the watcher sleeps until the next one. */
#define IDLE_SECONDS 1.0
/* A stalled call naps THROTTLE_NAP_NS at each signal, and runs (MPI makes
 * progress) for about THROTTLE_RUN_NS between naps: ~10% of a core. */
#define THROTTLE_NAP_NS 2000000L
#define THROTTLE_RUN_NS 200000L
/* While a call is stalled the watcher reads the side channel this often. */
#define DRAIN_SECONDS 0.05

static struct {
  atomic_flag busy;                /* held by the armed caller */
  atomic_uint_least64_t seq;       /* odd: a call is armed */
  atomic_uint_least64_t throttled; /* seq of the call the last signal was for */
  _Atomic double start, spin, timeout;
  _Atomic(const char *) what;
  atomic_int world_rank, peer;
  _Atomic(pthread_t) waiter;
  /* The armed collective for the side channel; has_call false for
   * point-to-point.  Plain fields under the seqlock: the watcher copies
   * them and keeps the copy only if seq did not change meanwhile. */
  px_mpi_call call;
  bool has_call;
  /* The armed call's label, copied by the caller at arm time: the label
   * the caller passes may live in its stack frame, which is gone by the
   * time the watcher reads a call that has meanwhile completed (the
   * seqlock then discards the copy, but the read itself must stay inside
   * memory that outlives every call). */
  char label_buf[PX_COMM_LABEL_MAX];
  atomic_int sleeping; /* the watcher waits on `wake` */
  pthread_mutex_t mu;
  pthread_cond_t wake;
  int signo;
} W = {.busy = ATOMIC_FLAG_INIT, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static pthread_once_t started_once = PTHREAD_ONCE_INIT;
static bool started;

void px_mpi_watch_message(int world_rank, const char *what, const char *label, double timeout, const char *verdict) {
  if (!label || !label[0]) label = "no label set";
  fprintf(stderr, "plexus: rank %d (host %s): watchdog: %s (%s) did not complete within %g s; %s\n", world_rank,
          px_mpi_side_host(world_rank), what, label, timeout, verdict);
  fflush(stderr);
}

void px_mpi_watch_term_message(int world_rank, const char *what, const char *label, double waited,
                               const char *verdict) {
  if (!label || !label[0]) label = "no label set";
  fprintf(stderr,
          "plexus: rank %d (host %s): SIGTERM (the launcher ends the job so when a rank dies) while waiting %.1f s "
          "in %s (%s); %s\n",
          world_rank, px_mpi_side_host(world_rank), waited, what, label, verdict);
  fflush(stderr);
}

/* The SIGTERM chain (px_mpi_watch_term_hook). */
static struct sigaction term_old;
static atomic_uint_least64_t term_count; /* signals seen */
static _Atomic double term_at;           /* px_time_now() of the last */
static atomic_uint_least64_t term_told;  /* term_count when last reported */

static void term_handler(int signo, siginfo_t *info, void *ctx) {
  int saved = errno;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe; px_time_now's clock
  atomic_store(&term_at, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
  atomic_fetch_add(&term_count, 1);
  errno = saved;
  if (term_old.sa_flags & SA_SIGINFO) term_old.sa_sigaction(signo, info, ctx);
  else term_old.sa_handler(signo);
}

void px_mpi_watch_term_hook(void) {
  static atomic_flag once = ATOMIC_FLAG_INIT;
  if (atomic_flag_test_and_set(&once)) return;
  struct sigaction old;
  if (sigaction(SIGTERM, NULL, &old) != 0) return;
  // Only in front of a handler: with the default action the process must
  // still end at once, and an ignored signal stays ignored.
  if (!(old.sa_flags & SA_SIGINFO) && (old.sa_handler == SIG_DFL || old.sa_handler == SIG_IGN)) return;
  term_old = old;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = term_handler;
  sa.sa_mask = old.sa_mask;
  sa.sa_flags = (old.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
  sigaction(SIGTERM, &sa, NULL);
}

bool px_mpi_watch_term_since(double start) {
  uint_least64_t n = atomic_load(&term_count);
  if (n == 0 || atomic_load(&term_at) < start) return false;
  uint_least64_t told = atomic_load(&term_told);
  return told != n && atomic_compare_exchange_strong(&term_told, &told, n);
}

void px_mpi_watch_peer_verdict(int peer_world_rank, int peer, char *out, size_t cap) {
  snprintf(out, cap, "waiting on ranks [%d] (world rank %d on host %s)", peer, peer_world_rank,
           px_mpi_side_host(peer_world_rank));
}

static void nap(double seconds) {
  if (seconds <= 0) return;
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Runs on the waiting thread, inside MPI's wait loop: nap if the call the
 * signal was sent for is still the armed one.  Only lock-free atomics and
 * nanosleep: async-signal-safe. */
static void throttle_handler(int signo) {
  (void)signo;
  int saved = errno;
  uint_least64_t s = atomic_load(&W.seq);
  if ((s & 1) && s == atomic_load_explicit(&W.throttled, memory_order_relaxed)) {
    struct timespec ts = {0, THROTTLE_NAP_NS};
    nanosleep(&ts, NULL);
  }
  errno = saved;
}

static void *watch_main(void *arg) {
  (void)arg;
  uint_least64_t last = atomic_load(&W.seq);
  double last_change = px_time_now(), last_drain = 0;
  // The call whose stall the members were told of (0: none), and its copy.
  uint_least64_t told = 0;
  px_mpi_call told_call;
  char told_label[PX_COMM_LABEL_MAX];
  for (;;) {
    uint_least64_t s = atomic_load(&W.seq);
    double now = px_time_now();
    if (told && s != told) {
      px_mpi_side_cleared(&told_call);  // it completed: say so
      told = 0;
    }
    if (s != last) {
      last = s;
      last_change = now;
    }
    if (!(s & 1)) {
      if (now - last_change < IDLE_SECONDS) {
        nap(IDLE_TICK_SECONDS);
        continue;
      }
      // Idle: sleep until an arm.  `sleeping` is set under the lock and
      // seq re-read after it; an arm stores seq, then reads `sleeping`
      // (both seq_cst), so one of the two sees the other.
      pthread_mutex_lock(&W.mu);
      atomic_store(&W.sleeping, 1);
      while (atomic_load(&W.seq) == s) pthread_cond_wait(&W.wake, &W.mu);
      atomic_store(&W.sleeping, 0);
      pthread_mutex_unlock(&W.mu);
      continue;
    }
    const double start = atomic_load_explicit(&W.start, memory_order_relaxed);
    const double spin = atomic_load_explicit(&W.spin, memory_order_relaxed);
    const double timeout = atomic_load_explicit(&W.timeout, memory_order_relaxed);
    const char *what = atomic_load_explicit(&W.what, memory_order_relaxed);
    const int rank = atomic_load_explicit(&W.world_rank, memory_order_relaxed);
    const int peer = atomic_load_explicit(&W.peer, memory_order_relaxed);
    const pthread_t waiter = atomic_load_explicit(&W.waiter, memory_order_relaxed);
    const bool has_call = W.has_call;
    px_mpi_call call = W.call;
    char label[PX_COMM_LABEL_MAX];
    memcpy(label, W.label_buf, sizeof label);
    label[sizeof label - 1] = 0;
    call.label = label;
    if (atomic_load(&W.seq) != s) continue;  // it changed while we read
    const double waited = now - start;
    if (timeout > 0 && waited > timeout) {
      // The caller is blocked in MPI for the whole time we print, so
      // `what` (a string literal) and its own mreq stay put, and so do the
      // members of its communicator.
      char verdict[VERDICT_MAX];
      if (has_call) px_mpi_side_verdict(&call, verdict, sizeof verdict);
      else px_mpi_watch_peer_verdict(peer, peer, verdict, sizeof verdict);
      px_mpi_watch_message(rank, what, label, timeout, verdict);
      // The documented exception to "library code never ends the process":
      // the peers are blocked in MPI and only the launcher can free them.
      MPI_Abort(MPI_COMM_WORLD, 1);
      return NULL;
    }
    if (waited > spin) {
      if (has_call && told != s) {
        // Stalled: tell the members once (mpi_side.h).
        told_call = call;
        snprintf(told_label, sizeof told_label, "%s", label);
        told_call.label = told_label;
        px_mpi_side_stalled(&told_call);
        told = s;
        last_drain = now;
      } else if (has_call && now - last_drain > DRAIN_SECONDS) {
        px_mpi_side_drain();
        last_drain = now;
      }
      if (px_mpi_watch_term_since(start)) {
        char verdict[VERDICT_MAX];
        if (has_call) px_mpi_side_verdict(&call, verdict, sizeof verdict);
        else px_mpi_watch_peer_verdict(peer, peer, verdict, sizeof verdict);
        px_mpi_watch_term_message(rank, what, label, waited, verdict);
      }
      atomic_store_explicit(&W.throttled, s, memory_order_relaxed);
      pthread_kill(waiter, W.signo);
      nap(1e-9 * (double)(THROTTLE_NAP_NS + THROTTLE_RUN_NS));
      continue;
    }
    // Until this call would stall (or expire); a later call armed by then
    // is judged by its own start at that wake-up.
    double next = spin - waited;
    if (timeout > 0 && timeout - waited < next) next = timeout - waited;
    nap(next + 1e-4);
  }
  return NULL;
}

static void start_once(void) {
  // A real-time signal the program leaves alone: if something already
  // handles it, we do not take it over, and the backend keeps its polling
  // waits instead.
  W.signo = SIGRTMIN + 5;
  struct sigaction old;
  if (sigaction(W.signo, NULL, &old) != 0 || old.sa_handler != SIG_DFL) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = throttle_handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(W.signo, &sa, NULL) != 0) return;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  // The watcher must not take signals meant for the program's threads.
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  pthread_t t;
  int rc = pthread_create(&t, &attr, watch_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    sigaction(W.signo, &old, NULL);
    return;
  }
  started = true;
}

bool px_mpi_watch_start(void) {
  pthread_once(&started_once, start_once);
  return started;
}

bool px_mpi_watch_arm(const char *what, const char *label, int world_rank, int peer, double timeout, double spin,
                      const px_mpi_call *call) {
  // One armed call at a time; a second thread blocking at once (MPI_THREAD_
  // MULTIPLE allows it) is told to use the polling wait instead.
  if (atomic_flag_test_and_set_explicit(&W.busy, memory_order_acquire)) return false;
  atomic_store_explicit(&W.start, px_time_now(), memory_order_relaxed);
  atomic_store_explicit(&W.spin, spin, memory_order_relaxed);
  atomic_store_explicit(&W.timeout, timeout, memory_order_relaxed);
  atomic_store_explicit(&W.what, what, memory_order_relaxed);
  snprintf(W.label_buf, sizeof W.label_buf, "%s", label ? label : "");
  atomic_store_explicit(&W.world_rank, world_rank, memory_order_relaxed);
  atomic_store_explicit(&W.peer, peer, memory_order_relaxed);
  atomic_store_explicit(&W.waiter, pthread_self(), memory_order_relaxed);
  W.has_call = call != NULL;
  if (call) W.call = *call;
  atomic_fetch_add(&W.seq, 1);  // odd: armed
  if (atomic_load(&W.sleeping)) {
    pthread_mutex_lock(&W.mu);
    pthread_cond_signal(&W.wake);
    pthread_mutex_unlock(&W.mu);
  }
  return true;
}

void px_mpi_watch_disarm(void) {
  atomic_fetch_add_explicit(&W.seq, 1, memory_order_release);  // even: idle
  atomic_flag_clear_explicit(&W.busy, memory_order_release);
}

#else

void px_mpi_watch_term_hook(void) {}
bool px_mpi_watch_term_since(double start) {
  (void)start;
  return false;
}
void px_mpi_watch_term_message(int world_rank, const char *what, const char *label, double waited,
                               const char *verdict) {
  (void)world_rank, (void)what, (void)label, (void)waited, (void)verdict;
}

void px_mpi_watch_message(int world_rank, const char *what, const char *label, double timeout, const char *verdict) {
  (void)world_rank, (void)what, (void)label, (void)timeout, (void)verdict;
}

void px_mpi_watch_peer_verdict(int peer_world_rank, int peer, char *out, size_t cap) {
  (void)peer_world_rank, (void)peer;
  if (cap) out[0] = 0;
}

#endif
