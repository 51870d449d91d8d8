/* Claim: a program that uses plexus through px_comm_run (no CLI) gets, under
 * an MPI launcher with k processes on the node, a thread setting of its
 * share of the cores -- the CPUs it is bound to when the launcher bound it
 * to fewer than the node's, else the node's cores / k -- applied to OpenMP
 * on the rank's thread; an explicit setting still wins (PX_NUM_THREADS, or
 * px_set_num_threads before px_comm_run), and PX_NUM_THREADS holds for
 * every rank of the threads backend ("threads_env", two ranks, no launcher:
 * before, only the rank that made the first kernel call got it, the other
 * kept its share of OpenMP's default).  Before, only `plexus train` split
 * the cores, so `mpirun -n 2 ./train_mnist` ran two teams of all the cores.
 *
 * Modes (argv[1]): "default" (run with mpirun --bind-to none -n 2, so each
 * process sees the whole node), "env" (PX_NUM_THREADS=3 in the
 * environment), "set" (px_set_num_threads(3) first).  Without a launcher
 * (the self backend, one process) the default is OpenMP's, unchanged. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "px_test.h"

#include <omp.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

static const char *mode = "default";
static int omp_default; /* omp_get_max_threads() before plexus ran a kernel */

static int expected_share(int procs) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  long mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
  long n = mine < online ? mine : online / procs;
  return n > 0 ? (int)n : 1;
}

static int rank_fn(px_comm *c, void *arg) {
  (void)arg;
  const int local = px_comm_local_size(c);
  int want;
  if (strcmp(mode, "default") != 0) want = 3;  // env, set, threads_env: 3 for every rank
  else if (px_comm_backend_of(c) == PX_COMM_MPI && local > 1) want = expected_share(local);
  else want = omp_default;
  // A kernel call takes the default, as a training step's first GEMM would.
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, y[4];
  px_sgemm(false, false, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, y, 2);
  CHECK(y[0] == 1 && y[3] == 4, "GEMM: %g %g", (double)y[0], (double)y[3]);
  const int got = px_get_num_threads();
  CHECK(got == want, "mode %s, %s backend, %d processes on the node: px_get_num_threads() %d, expected %d", mode,
        px_comm_backend_name(px_comm_backend_of(c)), local, got, want);
  CHECK(omp_get_max_threads() == want, "mode %s: OpenMP's setting on the rank's thread is %d, expected %d", mode,
        omp_get_max_threads(), want);
  printf("rank %d/%d (%s, %d on the node, %ld cores): %d threads, mode %s\n", px_comm_rank(c), px_comm_size(c),
         px_comm_backend_name(px_comm_backend_of(c)), local, sysconf(_SC_NPROCESSORS_ONLN), got, mode);
  return px_test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc > 1) mode = argv[1];
  if (strcmp(mode, "default") == 0) {
    // The default is the claim: no explicit setting from the environment
    // (ctest's or the shell's).
    unsetenv("PX_NUM_THREADS");
    unsetenv("OMP_NUM_THREADS");
  } else if (strcmp(mode, "env") == 0) {
    setenv("PX_NUM_THREADS", "3", 1);
  } else if (strcmp(mode, "threads_env") == 0) {
    setenv("PX_NUM_THREADS", "3", 1);
  } else if (strcmp(mode, "set") == 0) {
    unsetenv("PX_NUM_THREADS");
    unsetenv("OMP_NUM_THREADS");
    px_set_num_threads(3);
  } else {
    fprintf(stderr, "usage: %s [default|env|set|threads_env]\n", argv[0]);
    return 2;
  }
  omp_default = omp_get_max_threads();
  int code = 1;
  // threads_env: two ranks of the threads backend (run without a
  // launcher), each of which must get PX_NUM_THREADS, not only the first.
  CHECK_OK(px_comm_run(strcmp(mode, "threads_env") == 0 ? 2 : 1, rank_fn, NULL, &code));
  if (code != 0 || px_test_failures) return 1;
  printf("ok: mode %s\n", mode);
  return 0;
}
