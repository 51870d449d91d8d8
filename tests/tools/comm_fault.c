/* comm_fault — a job that goes wrong on purpose, for test_comm_mpi_faults.py.
 *   --mode skip   rank 1 skips an all-reduce the others call; their watchdog
 *                 (--timeout seconds, default 2) must end the job, naming
 *                 the collective and the label;
 *   --mode exit   rank 1 returns 3 in the middle of a step; px_comm_run must
 *                 end the job instead of leaving the others in the
 *                 all-reduce;
 *   --mode stop   rank 1 stops itself with SIGSTOP before the all-reduce;
 *                 rank 0's watchdog must name it (rank, host) from the side
 *                 channel, as having sent no word of waiting;
 *   --mode other  rank 1 waits in a barrier (label "checkpoint of step 3")
 *                 on another communicator instead: rank 0's watchdog must
 *                 say that rank 1 waits there;
 *   --mode group  (4 ranks) the world splits into even and odd ranks; world
 *                 rank 3 skips the odd group's all-reduce: world rank 1's
 *                 watchdog names group rank 1, world rank 3.
 * Run under a launcher: mpiexec -n 2 comm_fault --mode skip
 * comm_fault --has-mpi exits 0 if plexus was built with MPI, else 77. */
#define _POSIX_C_SOURCE 200809L
#include "plexus/comm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
  const char *mode;
  double timeout;
} opts;

static void sleep_long(void) {
  for (int i = 0; i < 600; i++) nanosleep(&(struct timespec){0, 100000000}, NULL);
}

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
  px_comm *sub = NULL;
  if (strcmp(o->mode, "other") == 0 || strcmp(o->mode, "group") == 0) {
    // other: a second communicator of the same ranks; group: even and odd.
    int color = strcmp(o->mode, "group") == 0 ? r % 2 : 0;
    if (px_comm_split(c, color, r, &sub)) {
      fprintf(stderr, "comm_fault: split: %s\n", px_last_error());
      return 1;
    }
    px_comm_set_timeout(sub, o->timeout);
    px_comm_set_label(sub, "step 3, bucket 1");
  }
  if (strcmp(o->mode, "group") == 0) {
    if (r == 3) {
      sleep_long();
      return 0;
    }
    if (r != 1) {  // only the odd group is short of a rank
      sleep_long();
      return 0;
    }
    px_status st = px_comm_allreduce(sub, g, 1024, PX_F32, PX_SUM);
    fprintf(stderr, "comm_fault: rank %d: group allreduce returned: %s\n", r, st ? px_last_error() : "ok");
    return 2;
  }
  if (r == 1) {
    if (strcmp(o->mode, "exit") == 0) return 3;
    if (strcmp(o->mode, "stop") == 0) {
      kill(getpid(), SIGSTOP);  // as `kill -STOP`: MPI_Abort's SIGKILL ends it
      return 0;
    }
    if (strcmp(o->mode, "other") == 0) {
      px_comm_set_label(sub, "checkpoint of step 3");
      // Rank 0's watchdog must be the one that ends the job: with equal
      // timeouts the two waits expired together and rank 1's barrier could
      // abort first (CI, 2026-12-02).  Its stall notice on the side channel
      // goes out after the wait's spin (a fraction of a second), whatever
      // the timeout.
      px_comm_set_timeout(sub, 3 * o->timeout);
      px_status st = px_comm_barrier(sub);
      fprintf(stderr, "comm_fault: rank 1: barrier returned: %s\n", st ? px_last_error() : "ok");
      return 2;
    }
    // skip: stay alive, as a rank stuck in its own work would, long past
    // the others' timeout; their watchdog must end the job before this.
    sleep_long();
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
  const char *modes[] = {"skip", "exit", "stop", "other", "group"};
  bool known = false;
  for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) known = known || strcmp(o.mode, modes[i]) == 0;
  if (!known) {
    fprintf(stderr, "usage: comm_fault --mode skip|exit|stop|other|group [--timeout seconds]\n");
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
