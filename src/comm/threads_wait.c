// The threads backend's waits: deadlines, and polling an atomic for the
// job's spin budget before blocking on the job's condition variable
// (threads.c's opening comment, "Waiting: spin, then block").
#define _POSIX_C_SOURCE 200809L
#include "comm/threads.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
  pxt_release_held_locked(j);
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

/* One more poll within the budget (after a pause or a yield), or false:
 * block now.  `yield_now`: the thread waited for may need this core. */
bool pxt_spin_more_as(const tjob *j, spinner *s, bool yield_now) {
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

bool pxt_spin_more(const tjob *j, spinner *s) { return pxt_spin_more_as(j, s, false); }

bool pxt_spin_flag(tjob *j, atomic_bool *flag) {
  spinner sp = {0};
  do {
    if (atomic_load_explicit(flag, memory_order_acquire)) return true;
    if (atomic_load_explicit(&j->failed, memory_order_relaxed)) return false;
  } while (pxt_spin_more(j, &sp));
  return false;
}

bool pxt_spin_change(tjob *j, atomic_uint *p, unsigned was) {
  spinner sp = {0};
  do {
    if (atomic_load_explicit(p, memory_order_relaxed) != was) return true;
    if (atomic_load_explicit(&j->failed, memory_order_relaxed)) return false;
  } while (pxt_spin_more(j, &sp));
  return false;
}

/* Waits (spin, then block) until `flag` is set by a publisher that calls
 * pxt_wake after setting it, or by one holding j->mu that broadcasts.
 * Used for the progress thread's operations: this rank's own progress
 * thread does the work, maybe on this very core, so the spin yields. */
void pxt_wait_flag(tjob *j, atomic_bool *flag) {
  spinner sp = {0};
  do {
    if (atomic_load_explicit(flag, memory_order_acquire)) return;
  } while (pxt_spin_more_as(j, &sp, true));
  pthread_mutex_lock(&j->mu);
  atomic_fetch_add(&j->sleepers, 1);
  pxt_release_held_locked(j);
  while (!atomic_load(flag)) pthread_cond_wait(&j->cv, &j->mu);
  atomic_fetch_sub(&j->sleepers, 1);
  pthread_mutex_unlock(&j->mu);
}
