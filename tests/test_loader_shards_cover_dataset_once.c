/* Claim: with N = 1, 2, 3, 4 ranks each reading through its own loader,
 * every rank gets the same number of batches, no sample is read by two
 * ranks in an epoch, and the union over ranks is the whole dataset exactly
 * once with drop_last (minus fewer than N samples cut) or the whole dataset
 * plus fewer than N repeats with padding; batches keep the sampler's order.
 * If it failed, ranks would train on overlapping or missing data, or one
 * rank would run out of batches first and the others hang in DDP. */
#include "loader_synthetic.h"
#include "px_test.h"

#include <string.h>

static void check(size_t n, int world, bool drop_last, bool drop_last_batch, size_t bs) {
  px_dataset *d = synth_open(n, 0, 0);
  int *seen = calloc(n, sizeof *seen);
  size_t batches0 = 0, total = 0;
  for (int r = 0; r < world; r++) {
    px_loader *l;
    px_loader_opts o = PX_LOADER_DEFAULTS;
    o.batch_size = bs;
    o.workers = r % 3;  // mixed worker counts across ranks must not matter
    o.rank = r;
    o.world = world;
    o.seed = 77;
    o.drop_last = drop_last;
    o.drop_last_batch = drop_last_batch;
    CHECK_OK(px_loader_create(&l, d, &o));
    CHECK_OK(px_loader_start_epoch(l, 5, 0));
    size_t nb = 0;
    const px_batch *b;
    for (;;) {
      CHECK_OK(px_loader_next(l, &b));
      if (!b) break;
      for (size_t j = 0; j < b->n; j++) {
        int32_t i = ((const int32_t *)b->y.data)[j];
        CHECK(i >= 0 && (size_t)i < n, "label %d", i);
        CHECK((size_t)i == b->indices[j], "row %zu: index %zu label %d", j, b->indices[j], i);
        seen[i]++;
        total++;
      }
      nb++;
    }
    CHECK(nb == px_loader_num_batches(l), "rank %d: %zu batches, loader says %zu", r, nb, px_loader_num_batches(l));
    if (r == 0) batches0 = nb;
    CHECK(nb == batches0, "world %d: rank %d has %zu batches, rank 0 %zu", world, r, nb, batches0);
    px_loader_free(l);
  }
  size_t never = 0, twice = 0;
  for (size_t i = 0; i < n; i++) {
    if (seen[i] == 0) never++;
    if (seen[i] > 1) twice += (size_t)seen[i] - 1;
    CHECK(seen[i] <= 2, "sample %zu read %d times", i, seen[i]);
  }
  if (drop_last_batch) {
    // Whole batches only: the cut is at most world·(bs-1) + world-1 samples.
    CHECK(twice == 0 || !drop_last, "repeats with drop_last");
  } else if (drop_last) {
    CHECK(twice == 0, "n=%zu world=%d: %zu repeats with drop_last", n, world, twice);
    CHECK(never == n % (size_t)world, "n=%zu world=%d: %zu samples missing, expected %zu", n, world, never,
          n % (size_t)world);
  } else {
    CHECK(never == 0, "n=%zu world=%d: %zu samples never read with padding", n, world, never);
    size_t pad = (size_t)world * ((n + (size_t)world - 1) / (size_t)world) - n;
    CHECK(twice == pad, "n=%zu world=%d: %zu repeats, expected %zu", n, world, twice, pad);
    CHECK(total == n + pad, "total %zu", total);
  }
  free(seen);
  px_dataset_free(d);
}

int main(void) {
  for (int world = 1; world <= 4; world++) {
    for (size_t n = 97; n <= 100; n++) {
      check(n, world, true, false, 7);
      check(n, world, false, false, 7);
      check(n, world, true, true, 7);
    }
  }
  return px_test_finish("test_loader_shards_cover_dataset_once");
}
