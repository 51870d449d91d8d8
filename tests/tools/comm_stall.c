/* comm_stall — a peer that is late, for
 * tests/test_comm_mpi_wait_backs_off_when_peer_stalls.py.
 *
 *   mpiexec -n 2 comm_stall [--stall S] [--timeout T]
 *
 * Rank 1 sleeps S seconds (default 3) before it joins an all-reduce, twice:
 * once the blocking px_comm_allreduce, once px_comm_iallreduce +
 * px_request_wait.  Rank 0 (and any others) go straight in and wait.  Each
 * rank checks the sums, and rank 0 prints, for each wait, its wall seconds
 * and the CPU seconds its thread spent in it (CLOCK_THREAD_CPUTIME_ID: only
 * the waiting thread, not Open MPI's own helper threads) and the CPU
 * seconds of the whole process (getrusage RUSAGE_SELF: with plexus's
 * watchdog thread, which throttles a stalled blocking call, and Open MPI's
 * threads):
 *
 *   comm_stall: blocking waited=3.012 cpu=0.281 proc=0.300
 *   comm_stall: request waited=3.004 cpu=0.270 proc=0.280
 *
 * With --timeout T below S the watchdog must end the job instead.
 * comm_stall --has-mpi exits 0 if plexus was built with MPI, else 77. */
#define _POSIX_C_SOURCE 200809L
#include "plexus/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

typedef struct opts {
  double stall, timeout;
} opts;

static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double process_cpu(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static void nap(double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
}

static int rank_main(px_comm *c, void *arg) {
  const opts *o = arg;
  const int r = px_comm_rank(c), n = px_comm_size(c);
  px_comm_set_timeout(c, o->timeout);
  px_comm_set_label(c, "stall test");
  // Line both ranks up first, so the stall is rank 1's sleep and nothing else.
  if (px_comm_barrier(c)) {
    fprintf(stderr, "comm_stall: barrier: %s\n", px_last_error());
    return 1;
  }
  for (int round = 0; round < 2; round++) {
    const char *how = round == 0 ? "blocking" : "request";
    float v[256];
    for (int i = 0; i < 256; i++) v[i] = (float)(r + i);
    if (r == 1) nap(o->stall);
    double t0 = px_time_now(), c0 = thread_cpu(), p0 = process_cpu();
    px_status st;
    if (round == 0) {
      st = px_comm_allreduce(c, v, 256, PX_F32, PX_SUM);
    } else {
      px_request *q;
      st = px_comm_iallreduce(c, v, 256, PX_F32, PX_SUM, &q);
      if (st == PX_OK) st = px_request_wait(q);
    }
    double waited = px_time_now() - t0, cpu = thread_cpu() - c0, proc = process_cpu() - p0;
    if (st) {
      fprintf(stderr, "comm_stall: rank %d: %s: %s\n", r, how, px_last_error());
      return 1;
    }
    // Σ_r (r + i) = n(n−1)/2 + n·i
    for (int i = 0; i < 256; i++)
      if (v[i] != (float)(n * (n - 1) / 2 + n * i)) {
        fprintf(stderr, "comm_stall: rank %d: %s: v[%d] = %g, expected %d\n", r, how, i, v[i], n * (n - 1) / 2 + n * i);
        return 1;
      }
    if (r == 0) {
      printf("comm_stall: %s waited=%.3f cpu=%.3f proc=%.3f\n", how, waited, cpu, proc);
      fflush(stdout);
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--has-mpi") == 0) return px_comm_mpi_available() ? 0 : 77;
  opts o = {.stall = 3, .timeout = 60};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--stall") == 0) o.stall = atof(argv[i + 1]);
    else if (strcmp(argv[i], "--timeout") == 0) o.timeout = atof(argv[i + 1]);
  }
  int code = 0;
  px_status st = px_comm_run(1, rank_main, &o, &code);
  if (st) {
    fprintf(stderr, "comm_stall: %s\n", px_last_error());
    return 1;
  }
  return code;
}
