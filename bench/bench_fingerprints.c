/* bench_fingerprints.c — what the collective-fingerprint debug mode
 * (PX_DEBUG_COLLECTIVES, px_comm_set_debug_collectives) costs a collective.
 *
 *   bench_fingerprints --threads 2 [--rounds R] [--iters K]   threads backend
 *   mpiexec -n 2 bench_fingerprints [--rounds R] [--iters K]  MPI backend
 *
 * For allreduce (F32 SUM) of 4 B, 4 KiB, 1 MiB and 16 MiB, iallreduce +
 * wait of 4 KiB, and barrier: R rounds (default 7) of K iterations (default
 * 200; a tenth for 1 MiB, a hundredth for 16 MiB), the mode off and on
 * alternating round by round (off first in even rounds), so a load that
 * comes and goes on a shared machine hits both alike.  One line a point:
 *
 *   fp backend=threads ranks=2 op=allreduce bytes=4 off_us=3.1 on_us=9.8 overhead_us=6.7 ratio=3.16
 *
 * us: the slowest rank's time of one operation averaged over a round, the
 * median round; overhead_us = on_us − off_us.  With the mode off the cost
 * is one branch per collective (not measurable here: it is the off column).
 * A benchmark, not a test: it never fails on speed. */
#define _POSIX_C_SOURCE 200809L
#include "plexus/plexus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opts {
  int rounds, iters;
} opts;

enum { OP_ALLREDUCE, OP_IALLREDUCE, OP_BARRIER };

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One round: iters operations; the slowest rank's µs per operation. */
static double round_us(px_comm *c, int op, float *buf, size_t count, int iters, bool on) {
  px_comm_set_debug_collectives(c, false);
  px_comm_barrier(c);
  px_comm_set_debug_collectives(c, on);
  double t0 = px_time_now();
  for (int i = 0; i < iters; i++) {
    px_status st = PX_OK;
    if (op == OP_ALLREDUCE) {
      st = px_comm_allreduce(c, buf, count, PX_F32, PX_SUM);
    } else if (op == OP_IALLREDUCE) {
      px_request *req;
      st = px_comm_iallreduce(c, buf, count, PX_F32, PX_SUM, &req);
      if (st == PX_OK) st = px_request_wait(req);
    } else {
      st = px_comm_barrier(c);
    }
    if (st != PX_OK) {
      fprintf(stderr, "bench_fingerprints: %s\n", px_last_error());
      exit(1);
    }
  }
  double us = (px_time_now() - t0) * 1e6 / iters;
  px_comm_set_debug_collectives(c, false);
  px_comm_allreduce(c, &us, 1, PX_F64, PX_MAX);
  return us;
}

static int run(px_comm *c, void *arg) {
  const opts *o = arg;
  const int rank = px_comm_rank(c);
  struct {
    int op;
    size_t bytes;
    const char *name;
  } pts[] = {
    {OP_ALLREDUCE, 4, "allreduce"},        {OP_ALLREDUCE, 4096, "allreduce"},   {OP_ALLREDUCE, 1 << 20, "allreduce"},
    {OP_ALLREDUCE, 16 << 20, "allreduce"}, {OP_IALLREDUCE, 4096, "iallreduce"}, {OP_BARRIER, 0, "barrier"},
  };
  float *buf = calloc((16 << 20) / sizeof(float), sizeof(float));
  double *off = calloc((size_t)o->rounds, sizeof *off), *on = calloc((size_t)o->rounds, sizeof *on);
  if (!buf || !off || !on) return 2;
  for (size_t p = 0; p < sizeof pts / sizeof *pts; p++) {
    const size_t count = pts[p].bytes / sizeof(float);
    int iters = o->iters;
    if (pts[p].bytes >= (16u << 20)) iters = iters / 100 > 0 ? iters / 100 : 1;
    else if (pts[p].bytes >= (1u << 20)) iters = iters / 10 > 0 ? iters / 10 : 1;
    round_us(c, pts[p].op, buf, count, iters, false);  // warm-up
    for (int r = 0; r < o->rounds; r++) {
      if (r % 2 == 0) {
        off[r] = round_us(c, pts[p].op, buf, count, iters, false);
        on[r] = round_us(c, pts[p].op, buf, count, iters, true);
      } else {
        on[r] = round_us(c, pts[p].op, buf, count, iters, true);
        off[r] = round_us(c, pts[p].op, buf, count, iters, false);
      }
    }
    qsort(off, (size_t)o->rounds, sizeof *off, cmp_double);
    qsort(on, (size_t)o->rounds, sizeof *on, cmp_double);
    const double a = off[o->rounds / 2], b = on[o->rounds / 2];
    if (rank == 0)
      printf("fp backend=%s ranks=%d op=%s bytes=%zu iters=%d off_us=%.2f on_us=%.2f overhead_us=%.2f ratio=%.2f\n",
             px_comm_backend_name(px_comm_backend_of(c)), px_comm_size(c), pts[p].name, pts[p].bytes, iters, a, b,
             b - a, a > 0 ? b / a : 0);
    fflush(stdout);
  }
  free(buf);
  free(off);
  free(on);
  return 0;
}

int main(int argc, char **argv) {
  opts o = {.rounds = 7, .iters = 200};
  int threads = 1;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (strcmp(argv[a], "--threads") == 0) threads = atoi(argv[a + 1]);
    else if (strcmp(argv[a], "--rounds") == 0) o.rounds = atoi(argv[a + 1]);
    else if (strcmp(argv[a], "--iters") == 0) o.iters = atoi(argv[a + 1]);
    else {
      fprintf(stderr, "bench_fingerprints: unknown option %s\n", argv[a]);
      return 2;
    }
  }
  if (o.rounds < 1 || o.iters < 1 || threads < 1) {
    fprintf(stderr, "bench_fingerprints: --rounds, --iters and --threads must be >= 1\n");
    return 2;
  }
  int code = 0;
  if (px_comm_run(threads, run, &o, &code) != PX_OK) {
    fprintf(stderr, "bench_fingerprints: %s\n", px_last_error());
    return 1;
  }
  return code;
}
