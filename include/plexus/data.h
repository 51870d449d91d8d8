/* plexus/data.h — datasets, samplers, loaders.  Now: the distributed sampler.
 *
 * px_sampler is PyTorch's DistributedSampler: each epoch a permutation of
 * [0, n) drawn from (seed, epoch) — the same on every rank — is padded
 * (by repeating its head) or cut (drop_last) to a multiple of the world
 * size, and rank r takes positions r, r + world, r + 2·world, ...  So every
 * rank gets the same number of samples, and the union over ranks is the
 * dataset exactly once (drop_last: minus at most world - 1 samples; padding:
 * plus at most world - 1 repeats). */
#ifndef PLEXUS_DATA_H
#define PLEXUS_DATA_H

#include "plexus/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct px_sampler {
  size_t   dataset_size;
  int      rank, world;
  bool     shuffle;
  bool     drop_last;
  uint64_t seed;
  uint64_t epoch;
  size_t   num_samples;  /* per rank, every epoch */
  size_t  *indices;      /* (num_samples,) this rank's indices for the epoch */
  size_t  *scratch;      /* (dataset_size,) the epoch's permutation */
} px_sampler;

px_status px_sampler_init(px_sampler *s, size_t dataset_size, int rank, int world, bool shuffle,
                          uint64_t seed, bool drop_last);
/* Draw the epoch's order (call at the start of every epoch). */
void px_sampler_set_epoch(px_sampler *s, uint64_t epoch);
void px_sampler_free(px_sampler *s);

#ifdef __cplusplus
}
#endif
#endif
