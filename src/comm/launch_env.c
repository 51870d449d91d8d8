// Launches plexus cannot join, found from the environment before any rank
// starts (comm/internal.h), so a job never trains as N copies of a world of
// one without a word:
//
//   torchrun / torch.distributed.launch / a cloud recipe   RANK, WORLD_SIZE,
//       LOCAL_RANK, MASTER_ADDR set, but no MPI launcher: every process
//       would be "1 rank (self backend)" and repeat the others' work.
//   an MPI launch whose world is not the one the environment announces:
//       WORLD_SIZE (torchrun's), or the launcher's own count (Open MPI's
//       OMPI_COMM_WORLD_SIZE, Hydra's PMI_SIZE, Slurm's step size) against
//       MPI_Comm_size -- a binary built against another MPI than the
//       launcher's comes up as singletons, world 1 each.
//
// Each message says how to launch instead.  Set PX_IGNORE_LAUNCH_ENV=1 when
// the variables are there for something else (the check is then skipped).
#define _POSIX_C_SOURCE 200809L
#include "comm/internal.h"
#include "base/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool ignored(void) {
  const char *v = getenv("PX_IGNORE_LAUNCH_ENV");
  return v && *v && strcmp(v, "0") != 0;
}

// The integer value of `name`, or -1 when unset or not a number.
static long env_int(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) return -1;
  char *end;
  long x = strtol(v, &end, 10);
  return *end ? -1 : x;
}

static const char how_to_launch[] =
  "launch plexus with an MPI launcher instead: `mpirun -n N plexus ...` (one machine, or several with "
  "--hostfile), `srun --mpi=pmix plexus ...` under Slurm, or one process with `plexus train --threads N` "
  "(docs/PARALLEL.md, \"Several machines without Slurm\")";

px_status px_comm_check_launch_env(void) {
  if (ignored() || px_comm_mpi_launched()) return PX_OK;
  // torchrun always sets all four; a world of one (torchrun --nproc-per-node 1
  // on one node) is a world plexus runs as it is.
  const long world = env_int("WORLD_SIZE"), rank = env_int("RANK"), local = env_int("LOCAL_RANK");
  if (world > 1 || rank > 0 || local > 0) {
    char what[256] = "";
    size_t used = 0;
    const char *names[] = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
      const char *v = getenv(names[i]);
      if (v && used < sizeof what)
        used += (size_t)snprintf(what + used, sizeof what - used, "%s%s=%.40s", used ? " " : "", names[i], v);
    }
    return px_error(PX_ERR_UNSUPPORTED,
                    "px_comm_run: started by a launcher plexus cannot join (%s: torchrun's or "
                    "torch.distributed's variables) without an MPI launch, so every process would train alone "
                    "as a world of one; %s; or unset those variables, or set PX_IGNORE_LAUNCH_ENV=1 if they are "
                    "meant for something else",
                    what, how_to_launch);
  }
  return PX_OK;
}

px_status px_comm_check_world_size(int mpi_size) {
  if (ignored()) return PX_OK;
  // What the environment says the world is, most specific first.
  const char *name = NULL;
  long want = -1;
  if ((want = env_int("WORLD_SIZE")) > 0) name = "WORLD_SIZE";
  else if ((want = env_int("OMPI_COMM_WORLD_SIZE")) > 0) name = "OMPI_COMM_WORLD_SIZE (mpirun -n)";
  else if ((want = env_int("PMI_SIZE")) > 0) name = "PMI_SIZE (the launcher's process count)";
  else if (getenv("SLURM_PROCID") && (want = env_int("SLURM_STEP_NUM_TASKS")) > 0)
    name = "SLURM_STEP_NUM_TASKS (srun -n)";
  if (!name || want == mpi_size) return PX_OK;
  return px_error(PX_ERR_COMM,
                  "px_comm_run: the environment says the world has %ld processes (%s) but MPI's world has %d: %s; "
                  "check that plexus was built with the MPI of the launcher (`plexus --version`; a launcher of "
                  "another MPI starts singletons), that srun uses an MPI plugin plexus's MPI speaks "
                  "(srun --mpi=pmix), and that WORLD_SIZE from another launcher is not left in the environment "
                  "(unset it, or PX_IGNORE_LAUNCH_ENV=1)",
                  want, name, mpi_size,
                  mpi_size == 1 ? "each process would train alone" : "the ranks would not be the job you launched");
}

/* The MPI run with the world size checked first, in one collective so the
 * ranks agree even when their environments differ. */
typedef struct checked_run {
  px_rank_fn fn;
  void *arg;
  px_status refused;
  char why[1024];
} checked_run;

static int checked_rank(px_comm *c, void *arg) {
  checked_run *r = arg;
  int32_t bad = px_comm_check_world_size(px_comm_size(c)) != PX_OK;
  if (bad) snprintf(r->why, sizeof r->why, "%s", px_last_error());
  int32_t any = bad;
  if (px_comm_size(c) > 1 && px_comm_allreduce(c, &any, 1, PX_I32, PX_MAX) != PX_OK) any = 1;
  if (!any) {
    // The node's cores are shared among its processes: the thread
    // setting's default (tensor/threads.c) divides them by this count.
    px_node_set_processes(px_comm_local_size(c));
    return r->fn(c, r->arg);
  }
  // Every rank returns 0 (no abort): px_comm_run returns the error instead.
  r->refused = PX_ERR_COMM;
  if (!bad)
    snprintf(r->why, sizeof r->why,
             "px_comm_run: another rank's environment does not match MPI's world "
             "of %d processes (WORLD_SIZE, or the launcher's count)",
             px_comm_size(c));
  return 0;
}

px_status px_comm_mpi_run_checked(px_rank_fn fn, void *arg, int *exit_code) {
  checked_run r = {.fn = fn, .arg = arg, .refused = PX_OK};
  px_status st = px_comm_mpi_run(checked_rank, &r, exit_code);
  if (st != PX_OK) return st;
  if (r.refused != PX_OK) return px_error(r.refused, "%s", r.why);
  return PX_OK;
}
