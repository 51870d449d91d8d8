// px_comm_run: the launcher.  It picks the backend from how the process was
// started (an MPI launcher, threads, or a world of one) and starts it; the
// environment checks it makes first are launch_env.c's.  Apart from comm.c,
// so the communicator object and its checks (comm.c), which every backend
// uses, do not in turn call the backends' start-ups.
#define _POSIX_C_SOURCE 200809L
#include "comm/internal.h"
#include "base/internal.h"

#include <stdlib.h>

/* ---- px_comm_run ------------------------------------------------------------ */

/* The world size the launcher announced, or 0 if it did not say. */
static int launched_size(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v && atoi(v) > 0) return atoi(v);
  }
  return 0;
}

px_status px_comm_run(int n_threads, px_rank_fn fn, void *arg, int *exit_code) {
  int ignored;
  if (!exit_code) exit_code = &ignored;
  *exit_code = 0;
  if (!fn) return px_error(PX_ERR_INVALID, "px_comm_run: fn is NULL");
  TRY(px_comm_check_launch_env());  // torchrun's variables without MPI (launch_env.c)
  if (px_comm_mpi_launched()) {
    if (px_comm_mpi_available()) return px_comm_mpi_run_checked(fn, arg, exit_code);
    int n = launched_size();
    // Each process would otherwise train alone on a world of one, silently
    // repeating the same work n times.
    if (n > 1)
      return px_error(PX_ERR_UNSUPPORTED,
                      "px_comm_run: started by an MPI launcher with %d processes, but plexus was built "
                      "without MPI; rebuild with MPI (apt-get install libopenmpi-dev) or run without the launcher",
                      n);
  }
  // srun with several tasks but no MPI plugin (Slurm's default --mpi=none):
  // each task would be a world of one and repeat the others' work.
  const char *step_tasks = getenv("SLURM_STEP_NUM_TASKS");
  if (!px_comm_mpi_launched() && getenv("SLURM_PROCID") && step_tasks && atoi(step_tasks) > 1)
    return px_error(PX_ERR_COMM,
                    "px_comm_run: srun started %d tasks without an MPI plugin, so each would train alone: use "
                    "srun --mpi=pmix (srun --mpi=list shows the plugins), or one task with --threads",
                    atoi(step_tasks));
  if (n_threads > 1) return px_comm_threads_run(n_threads, fn, arg, exit_code);
  px_comm *c;
  TRY(px_comm_init_self(&c));
  c->owned_by_run = true;
  *exit_code = fn(c, arg);
  c->owned_by_run = false;
  px_comm_free(c);
  return PX_OK;
}
