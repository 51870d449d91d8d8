/* Claim: a rank of the threads backend that waits for a stalled peer
 * sleeps after a short spin instead of burning its core: over a 1 s stall
 * the waiting ranks together use well under a quarter of a core-second of
 * CPU, in a barrier, in a blocking receive and in px_request_wait on an
 * iallreduce (whose waiting happens on the progress thread or on this one), with 2 ranks
 * and oversubscribed with 4.  Then the stalled peer arrives and the
 * operation completes normally.  If it failed, a rank stuck behind a slow
 * peer (a data-loader hiccup, a checkpoint write) would steal a core from
 * the ranks still computing, or a spin would never end.  (Load on the
 * machine can only lower the CPU a spin gets, never raise it: the bound
 * cannot be missed because the machine is busy.) */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include "px_test.h"

#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define STALL_S 1.0
#define MAX_CPU_S 0.25

typedef enum what { BARRIER, RECV, IALLREDUCE } what;
static const char *names[] = {"barrier", "recv", "iallreduce + wait"};

typedef struct shared {
  what w;
  double cpu_s, wall_s;
} shared;

static double cpu_seconds(int who) {
  struct rusage u;
  getrusage(who, &u);
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

static int rank_main(px_comm *c, void *arg) {
  shared *s = arg;
  int r = px_comm_rank(c), n = px_comm_size(c);
  float x[64];
  for (int i = 0; i < 64; i++) x[i] = (float)r;
  CHECK_OK(px_comm_barrier(c));
  if (r == n - 1) {
    // The stalled rank: asleep (no CPU) for STALL_S, then it takes part.
    nanosleep(&(struct timespec){(time_t)STALL_S, (long)((STALL_S - (time_t)STALL_S) * 1e9)}, NULL);
    if (s->w == BARRIER) CHECK_OK(px_comm_barrier(c));
    else if (s->w == RECV) CHECK_OK(px_comm_send(c, x, 64, PX_F32, 0, 5));
    else CHECK_OK(px_comm_allreduce(c, x, 64, PX_F32, PX_SUM));
    return 0;
  }
  double t0 = px_time_now();
  if (s->w == BARRIER) {
    // The barrier waits on this thread: its own CPU time is the measure.
    double c0 = cpu_seconds(RUSAGE_THREAD);
    CHECK_OK(px_comm_barrier(c));
    if (r == 0) s->cpu_s = cpu_seconds(RUSAGE_THREAD) - c0;
  } else if (s->w == RECV) {
    double c0 = cpu_seconds(RUSAGE_THREAD);
    if (r == 0) CHECK_OK(px_comm_recv(c, x, 64, PX_F32, n - 1, 5));
    if (r == 0) s->cpu_s = cpu_seconds(RUSAGE_THREAD) - c0;
    if (r == 0) CHECK(x[0] == (float)(n - 1), "received %g, want %d", x[0], n - 1);
  } else {
    // The wait is shared between this thread and the progress thread: the
    // whole process's CPU over the stall counts (the stalled rank sleeps).
    double c0 = cpu_seconds(RUSAGE_SELF);
    px_request *q;
    CHECK_OK(px_comm_iallreduce(c, x, 64, PX_F32, PX_SUM, &q));
    CHECK_OK(px_request_wait(q));
    double used = cpu_seconds(RUSAGE_SELF) - c0;
    if (r == 0) s->cpu_s = used;
    float want = (float)(n * (n - 1) / 2);
    CHECK(x[0] == want && x[63] == want, "iallreduce gave %g, want %g", x[0], want);
  }
  if (r == 0) s->wall_s = px_time_now() - t0;
  return 0;
}

int main(void) {
  const int sizes[] = {2, 4};
  for (int si = 0; si < 2; si++)
    for (int w = BARRIER; w <= IALLREDUCE; w++) {
      if (sizes[si] == 4 && w == RECV) continue;  // the same wait as with 2
      shared s = {.w = (what)w};
      int code = -1;
      CHECK_OK(px_comm_run(sizes[si], rank_main, &s, &code));
      CHECK(code == 0, "exit code %d", code);
      printf("%d ranks, %s: waited %.3f s using %.4f s of CPU\n", sizes[si], names[w], s.wall_s, s.cpu_s);
      CHECK(s.wall_s > 0.5 * STALL_S, "%s returned after %.3f s, before the stalled rank came", names[w], s.wall_s);
      CHECK(s.cpu_s < MAX_CPU_S,
            "%d ranks, %s: waiting for a stalled peer for %.2f s used %.3f s of CPU "
            "(limit %.2f): the wait spins instead of sleeping",
            sizes[si], names[w], s.wall_s, s.cpu_s, MAX_CPU_S);
    }
  return px_test_finish("test_comm_threads_waiting_rank_sleeps");
}
