// Distributed sampler (PyTorch's DistributedSampler semantics).
#include "plexus/data.h"

#include <stdlib.h>
#include <string.h>

px_status px_sampler_init(px_sampler *s, size_t dataset_size, int rank, int world, bool shuffle, uint64_t seed,
                          bool drop_last) {
  memset(s, 0, sizeof *s);
  if (world < 1 || rank < 0 || rank >= world)
    return px_error(PX_ERR_INVALID, "sampler: rank %d outside a world of %d", rank, world);
  if (dataset_size == 0) return px_error(PX_ERR_INVALID, "sampler: empty dataset");
  if (drop_last && dataset_size < (size_t)world)
    return px_error(PX_ERR_INVALID, "sampler: %zu samples cannot give each of %d ranks one with drop_last",
                    dataset_size, world);
  s->dataset_size = dataset_size;
  s->rank = rank;
  s->world = world;
  s->shuffle = shuffle;
  s->drop_last = drop_last;
  s->seed = seed;
  // drop_last: cut the tail to a multiple of world; else pad up to one.
  s->num_samples = drop_last ? dataset_size / (size_t)world : (dataset_size + (size_t)world - 1) / (size_t)world;
  s->indices = malloc(s->num_samples * sizeof *s->indices);
  s->scratch = malloc(dataset_size * sizeof *s->scratch);
  if (!s->indices || !s->scratch) {
    px_sampler_free(s);
    return px_error(PX_ERR_NOMEM, "sampler: out of memory for %zu indices", dataset_size);
  }
  px_sampler_set_epoch(s, 0);
  return PX_OK;
}

void px_sampler_set_epoch(px_sampler *s, uint64_t epoch) {
  s->epoch = epoch;
  size_t n = s->dataset_size;
  for (size_t i = 0; i < n; i++) s->scratch[i] = i;
  if (s->shuffle) {
    // Fisher-Yates from (seed, epoch): identical on every rank.
    px_rng r = px_rng_make(s->seed, 0x5a4d504c00000000ull ^ epoch);
    for (size_t i = n - 1; i > 0; i--) {
      size_t j = (size_t)px_rng_below(&r, i + 1);
      size_t t = s->scratch[i];
      s->scratch[i] = s->scratch[j];
      s->scratch[j] = t;
    }
  }
  // Position p of the padded order is scratch[p mod n]; rank r takes
  // positions r, r + world, ...
  for (size_t k = 0; k < s->num_samples; k++) s->indices[k] = s->scratch[(k * (size_t)s->world + (size_t)s->rank) % n];
}

void px_sampler_free(px_sampler *s) {
  free(s->indices);
  free(s->scratch);
  s->indices = s->scratch = NULL;
}
