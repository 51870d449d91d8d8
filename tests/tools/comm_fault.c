/* comm_fault — a job that goes wrong on purpose, for test_comm_mpi_faults.py.
 *   --mode skip   rank 1 skips an all-reduce the others call; their watchdog
 *                 (--timeout seconds, default 2) must end the job, naming
 *                 the collective and the label;
 *   --mode exit   rank 1 returns 3 in the middle of a step; px_comm_run must
 *                 end the job instead of leaving the others in the
 *                 all-reduce.
 * Run under a launcher: mpiexec -n 2 comm_fault --mode skip
 * comm_fault --has-mpi exits 0 if plexus was built with MPI, else 77. */
#define _POSIX_C_SOURCE 200809L
#include "plexus/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct opts {
  const char *mode;
  double timeout;
} opts;

static int rank_main(px_comm *c, void *arg) {
  const opts *o = arg;
  int r = px_comm_rank(c);
  px_comm_set_timeout(c, o->timeout);
  px_comm_set_label(c, "step 3, bucket 1");
  float g[1024] = {0};
  if (px_comm_allreduce(c, g, 1024, PX_F32, PX_SUM)) {
    fprintf(stderr, "comm_fault: first allreduce: %s\n", px_last_error());
    return 1;
  }
  if (r == 1) {
    if (strcmp(o->mode, "exit") == 0) return 3;
    // skip: stay alive, as a rank stuck in its own work would, long past
    // the others' timeout; their watchdog must end the job before this.
    for (int i = 0; i < 600; i++) nanosleep(&(struct timespec){0, 100000000}, NULL);
    return 0;
  }
  if (px_comm_allreduce(c, g, 1024, PX_F32, PX_SUM)) {
    fprintf(stderr, "comm_fault: rank %d: second allreduce: %s\n", r, px_last_error());
    return 2;
  }
  fprintf(stderr, "comm_fault: rank %d: second allreduce completed, which it should not\n", r);
  return 0;
}

int main(int argc, char **argv) {
  // --has-mpi: whether this build can run the faults at all (exit 0 / 77).
  if (argc == 2 && strcmp(argv[1], "--has-mpi") == 0) return px_comm_mpi_available() ? 0 : 77;
  opts o = {.mode = "skip", .timeout = 2};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--mode") == 0) o.mode = argv[i + 1];
    else if (strcmp(argv[i], "--timeout") == 0) o.timeout = atof(argv[i + 1]);
  }
  if (strcmp(o.mode, "skip") != 0 && strcmp(o.mode, "exit") != 0) {
    fprintf(stderr, "usage: comm_fault --mode skip|exit [--timeout seconds]\n");
    return 2;
  }
  int code = 0;
  px_status st = px_comm_run(1, rank_main, &o, &code);
  if (st) {
    fprintf(stderr, "comm_fault: %s\n", px_last_error());
    return 1;
  }
  return code;
}
