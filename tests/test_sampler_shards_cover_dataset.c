/* Claim: the distributed sampler gives every rank the same number of
 * samples; over one epoch the ranks' union is the dataset exactly once with
 * drop_last (minus < world samples) and every sample at least once with
 * padding (plus < world repeats); the order depends on (seed, epoch) only,
 * changes with the epoch, and is identical whichever rank computes it.
 * If it failed, ranks would train on overlapping or missing data, or hang
 * on uneven batch counts. */
#include "px_test.h"

#include <string.h>

static void check(size_t n, int world, bool drop_last, bool shuffle) {
  int *seen = calloc(n, sizeof *seen);
  size_t per_rank = 0;
  for (int r = 0; r < world; r++) {
    px_sampler s;
    CHECK_OK(px_sampler_init(&s, n, r, world, shuffle, 42, drop_last));
    px_sampler_set_epoch(&s, 3);
    if (r == 0) per_rank = s.num_samples;
    CHECK(s.num_samples == per_rank, "rank %d has %zu samples, rank 0 %zu", r, s.num_samples, per_rank);
    for (size_t k = 0; k < s.num_samples; k++) {
      CHECK(s.indices[k] < n, "index out of range");
      seen[s.indices[k]]++;
    }
    px_sampler_free(&s);
  }
  size_t once = 0, twice = 0, never = 0;
  for (size_t i = 0; i < n; i++) {
    if (seen[i] == 0) never++;
    else if (seen[i] == 1) once++;
    else twice++;
  }
  if (drop_last) {
    CHECK(twice == 0 && never == n % (size_t)world, "n=%zu world=%d drop_last: %zu never, %zu twice", n, world, never,
          twice);
  } else {
    size_t pad = (per_rank * (size_t)world) - n;
    CHECK(never == 0 && twice == pad, "n=%zu world=%d pad: %zu never, %zu twice (pad %zu)", n, world, never, twice,
          pad);
  }
  free(seen);
}

int main(void) {
  for (int world = 1; world <= 4; world++)
    for (int drop = 0; drop < 2; drop++)
      for (int sh = 0; sh < 2; sh++) {
        check(103, world, drop, sh);
        check(100, world, drop, sh);
      }
  // Epochs differ; the same (seed, epoch) gives the same order.
  px_sampler a, b;
  CHECK_OK(px_sampler_init(&a, 1000, 1, 2, true, 7, false));
  CHECK_OK(px_sampler_init(&b, 1000, 1, 2, true, 7, false));
  px_sampler_set_epoch(&a, 5);
  px_sampler_set_epoch(&b, 5);
  CHECK(memcmp(a.indices, b.indices, a.num_samples * sizeof *a.indices) == 0, "same epoch same order");
  px_sampler_set_epoch(&b, 6);
  CHECK(memcmp(a.indices, b.indices, a.num_samples * sizeof *a.indices) != 0, "new epoch new order");
  px_sampler_free(&a);
  px_sampler_free(&b);
  // Without shuffling, rank r takes r, r + world, ... (PyTorch's layout).
  CHECK_OK(px_sampler_init(&a, 10, 1, 3, false, 0, false));
  size_t want[4] = {1, 4, 7, 0};
  CHECK(a.num_samples == 4 && memcmp(a.indices, want, sizeof want) == 0, "layout %zu %zu %zu %zu", a.indices[0],
        a.indices[1], a.indices[2], a.indices[3]);
  px_sampler_free(&a);
  CHECK(px_sampler_init(&a, 10, 3, 3, false, 0, false) == PX_ERR_INVALID, "rank out of range rejected");
  return px_test_finish("test_sampler_shards_cover_dataset");
}
