/* Claim: under the launcher (mpirun -n 1, 2, 4) each process's loader,
 * given its rank and the world size, reads only its own samples: gathered
 * over ranks, one epoch's batches hold every sample of the dataset exactly
 * once with drop_last (minus n mod world) and every rank has the same
 * number of batches.  (In a build without MPI, ctest runs it as one
 * process whose px_comm_run starts 3 thread ranks.)  If it failed, ranks of a real
 * job would overlap or miss data, or hang on uneven batch counts. */
#include "loader_synthetic.h"
#include "px_test.h"

#include <string.h>

enum { N = 1003, BS = 10 };

static int run(px_comm *c, void *arg) {
  (void)arg;
  int rank = px_comm_rank(c), world = px_comm_size(c);
  px_dataset *d = synth_open(N, 0, 0);
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = BS;
  o.workers = 2;
  o.rank = rank;
  o.world = world;
  o.seed = 9;
  o.drop_last = true;
  CHECK_OK(px_loader_create(&l, d, &o));
  CHECK_OK(px_loader_start_epoch(l, 2, 0));
  // This rank's indices, -1 padded to a common length for the allgather.
  int32_t *mine = malloc(N * sizeof *mine), *all = malloc((size_t)world * N * sizeof *all);
  for (int i = 0; i < N; i++) mine[i] = -1;
  size_t k = 0, nb = 0;
  const px_batch *b;
  for (;;) {
    CHECK_OK(px_loader_next(l, &b));
    if (!b) break;
    for (size_t j = 0; j < b->n; j++) mine[k++] = ((const int32_t *)b->y.data)[j];
    nb++;
  }
  CHECK_OK(px_comm_allgather(c, mine, all, N, PX_I32));
  double batches = (double)nb, lo = batches;
  CHECK_OK(px_comm_allreduce(c, &lo, 1, PX_F64, PX_MIN));
  CHECK(lo == batches, "rank %d has %zu batches, some rank has %.0f", rank, nb, lo);
  int *seen = calloc(N, sizeof *seen);
  size_t total = 0;
  for (size_t i = 0; i < (size_t)world * N; i++)
    if (all[i] >= 0) {
      seen[all[i]]++;
      total++;
    }
  size_t missing = 0;
  for (int i = 0; i < N; i++) {
    CHECK(seen[i] <= 1, "sample %d read by %d ranks", i, seen[i]);
    if (!seen[i]) missing++;
  }
  CHECK(missing == (size_t)(N % world), "world %d: %zu samples missing, expected %d", world, missing, N % world);
  CHECK(total == (size_t)(N - N % world), "total %zu", total);
  free(seen);
  free(mine);
  free(all);
  px_loader_free(l);
  px_dataset_free(d);
  return 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(3, run, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_loader_shards_cover_dataset_once_mpi");
}
