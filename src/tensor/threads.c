// One thread-count setting for OpenMP and OpenBLAS.
//
// Its value, first found applies:
//   1. px_set_num_threads(n), called by the program (plexus train
//      --num-threads calls it);
//   2. PX_NUM_THREADS, per rank (every rank of the threads backend too);
//   3. when the job's ranks are processes sharing this node (an MPI launch,
//      recorded by px_comm_run: px_node_processes) and OMP_NUM_THREADS is
//      not set: this process's share of the cores -- the CPUs it may run on
//      when the launcher bound it to fewer than the node's (Slurm's
//      --cpus-per-task, mpirun --bind-to), else the node's cores divided by
//      the processes on it; so `mpirun -n 2` of any program using plexus
//      does not start two teams of all the cores each;
//   4. OpenMP's default (OMP_NUM_THREADS, or the cores).  A rank of the
//      threads backend starts with its share of that (px_comm_run).
// In the library and not in the command, so every caller gets it.  The
// default (3, 4) is taken at the first kernel call and again when the
// processes on the node become known later.
#define _GNU_SOURCE /* sched_getaffinity */
#include "plexus/tensor.h"
#include "base/internal.h"
#include "tensor/blas.h"
#include "tensor/internal.h"

#include <omp.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

/* 0 = not yet initialised.  Atomic: ranks of the threads backend make their
 * first kernel call at once (ThreadSanitizer reported the plain int). */
static _Atomic int px_threads = 0;
static _Atomic bool px_threads_explicit = false; /* 1 or 2 above: no default applies */
static _Atomic int px_threads_for = 0;           /* px_node_processes() the default was taken for */
static _Atomic bool px_threads_from_env = false; /* 2 above: a count per rank */
/* OpenMP's setting is per thread: PX_NUM_THREADS, a count per rank, is
 * applied on every thread that runs kernels (each rank of the threads
 * backend), not only on the first (the others would keep their share). */
static _Thread_local bool env_applied_here = false;

static void apply(int n) {
  if (n < 1) n = 1;
  px_threads = n;
  omp_set_num_threads(n);
  if (px_blas.set_num_threads) px_blas.set_num_threads(n);
}

void px_set_num_threads(int n) {
  px_threads_explicit = true;
  px_threads_from_env = false; /* the program's count, for this thread (and the threads backend's split) */
  apply(n);
}

int px_get_num_threads(void) {
  px_threads_init();
  return px_threads;
}

/* This process's share of the node's cores among `procs` processes. */
static int node_share(int procs) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online < 1) online = 1;
  cpu_set_t set;
  long mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
  long n = mine > 0 && mine < online ? mine : online / procs;
  return n > 0 ? (int)n : 1;
}

void px_threads_init(void) {
  const int procs = px_node_processes();
  if (px_threads && px_threads_explicit) {
    if (px_threads_from_env && !env_applied_here) {
      env_applied_here = true;
      omp_set_num_threads(px_threads);
    }
    return;
  }
  if (px_threads && px_threads_for == procs) return;
  const char *env = getenv("PX_NUM_THREADS");
  if (env && atoi(env) >= 1) {
    px_threads_explicit = true;
    px_threads_from_env = true;
    env_applied_here = true;
    apply(atoi(env));
    return;
  }
  px_threads_for = procs;
  const char *omp = getenv("OMP_NUM_THREADS");
  apply(procs > 1 && !(omp && *omp) ? node_share(procs) : omp_get_max_threads());
}
