/* Claim: px_comm_run (the library's entry point, not only the CLI) refuses
 * to start when torchrun's variables announce a world of several processes
 * (WORLD_SIZE > 1, or RANK / LOCAL_RANK > 0) but no MPI launcher started
 * this process: it returns PX_ERR_UNSUPPORTED without calling the rank
 * function, with a message naming the variables and the launches that work
 * (mpirun -n N, srun --mpi=pmix, --threads N).  A world of one
 * (WORLD_SIZE=1) runs, and PX_IGNORE_LAUNCH_ENV=1 skips the check.
 *
 * If it fails, a job started by torchrun trains as N silent copies of a
 * one-rank world. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

static int called;

static int rank_fn(px_comm *comm, void *arg) {
  (void)comm, (void)arg;
  called++;
  return 0;
}

static void expect_refused(const char *label, int threads) {
  called = 0;
  int code = 0;
  px_status st = px_comm_run(threads, rank_fn, NULL, &code);
  CHECK(st == PX_ERR_UNSUPPORTED, "%s: px_comm_run returned %s", label, px_status_name(st));
  CHECK(called == 0, "%s: the rank function ran %d times", label, called);
  const char *msg = px_last_error();
  CHECK(strstr(msg, "mpirun -n N") && strstr(msg, "srun --mpi=pmix") && strstr(msg, "--threads N"),
        "%s: the message does not say how to launch: %s", label, msg);
}

static void expect_runs(const char *label, int threads) {
  called = 0;
  int code = 0;
  px_status st = px_comm_run(threads, rank_fn, NULL, &code);
  CHECK(st == PX_OK && code == 0, "%s: px_comm_run returned %s: %s", label, px_status_name(st), px_last_error());
  CHECK(called == threads, "%s: %d ranks ran, expected %d", label, called, threads);
}

int main(void) {
  if (px_comm_mpi_launched()) {  // the claim is about a launch without MPI
    printf("test_comm_run_refuses_torchrun_environment: skipped under an MPI launcher\n");
    return 0;
  }
  expect_runs("no launcher variables", 2);
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "0", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "10.1.2.3", 1);
  expect_refused("torchrun, WORLD_SIZE=4 RANK=0", 1);
  CHECK(strstr(px_last_error(), "WORLD_SIZE=4") && strstr(px_last_error(), "MASTER_ADDR=10.1.2.3"),
        "the message does not name the variables: %s", px_last_error());
  expect_refused("torchrun with --threads 2", 2);
  setenv("WORLD_SIZE", "1", 1);
  expect_runs("torchrun's world of one", 1);
  unsetenv("WORLD_SIZE");
  setenv("RANK", "3", 1);
  expect_refused("RANK=3 alone", 1);
  setenv("PX_IGNORE_LAUNCH_ENV", "1", 1);
  expect_runs("PX_IGNORE_LAUNCH_ENV=1", 1);
  return px_test_finish("test_comm_run_refuses_torchrun_environment");
}
