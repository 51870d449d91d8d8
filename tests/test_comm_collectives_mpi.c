/* Claim: under mpiexec -n 1, 2 and 4, px_comm_run picks the MPI backend
 * and every collective agrees with the serial computation (to float
 * rounding: MPI chooses its own summation order) and gives every rank the
 * same bits: all-reduce over all dtypes and ops, broadcast from every root,
 * all-gather (also in place), reduce-scatter, point-to-point rings,
 * asynchronous operations, splits, a 3M-float all-reduce; local rank and
 * size come from the node.  (Built without MPI it runs as one process on
 * the self backend.)  If it failed, multi-process training would
 * diverge between ranks or disagree with the threads backend. */
#define _POSIX_C_SOURCE 200809L
#include "test_comm_checks.h"

/* Open MPI leaves its own allocations behind at MPI_Finalize (in components
 * it has unloaded, so no suppression can name them); under the sanitizer
 * build LeakSanitizer would blame this test.  Our code's leaks are checked
 * by the threads tests, which run the same checks without MPI. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "detect_leaks=0"; }

static int rank_main(px_comm *c, void *arg) {
  // Built without MPI, this test runs as one plain process: the self backend.
  bool mpi = px_comm_mpi_available();
  px_comm_backend want = mpi ? PX_COMM_MPI : PX_COMM_SELF;
  CHECK(px_comm_backend_of(c) == want, "backend %s, want %s", px_comm_backend_name(px_comm_backend_of(c)),
        px_comm_backend_name(want));
  CHECK(px_comm_mpi_launched() == mpi, "launched %d, MPI available %d", px_comm_mpi_launched(), mpi);
  int n = px_comm_size(c), r = px_comm_rank(c);
  CHECK(n >= 1 && r >= 0 && r < n, "rank %d of %d", r, n);
  // Local ranks number 0..local_size-1 across the ranks of one node.
  int32_t lr = px_comm_local_rank(c), *all = malloc((size_t)n * sizeof *all);
  CHECK(lr >= 0 && lr < px_comm_local_size(c) && px_comm_local_size(c) <= n, "local %d of %d", lr,
        px_comm_local_size(c));
  CHECK_OK(px_comm_allgather(c, &lr, all, 1, PX_I32));
  int zeros = 0;
  for (int k = 0; k < n; k++) zeros += all[k] == 0;
  CHECK(zeros >= 1, "no rank has local rank 0");
  free(all);
  comm_checks(c, !mpi);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = -1;
  CHECK_OK(px_comm_run(1, rank_main, NULL, &code));
  CHECK(code == 0, "exit code %d", code);
  return px_test_finish("test_comm_collectives_mpi");
}
