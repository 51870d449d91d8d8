/* train_blobs.h — a classification dataset for the training-loop tests.
 *
 * K Gaussian blobs in D dimensions: class k has its centre c_k (drawn once
 * from `seed`, each coordinate uniform in [-2, 2]); sample i has label
 * i mod K and x = c_k + N(0, sigma²) per coordinate, drawn from a stream
 * keyed by (seed, i).  A held-out split is the same blobs with another
 * sample seed.  An MLP separates them well above chance within a few
 * hundred steps. */
#ifndef TRAIN_BLOBS_H
#define TRAIN_BLOBS_H

#include <stdlib.h>
#include <string.h>

#include "plexus/data.h"

#define BLOBS_MAX_D 64
#define BLOBS_MAX_K 16

typedef struct blobs {
  int D, K;
  float sigma;
  uint64_t sample_seed;
  float centre[BLOBS_MAX_K][BLOBS_MAX_D];
} blobs;

static px_status blobs_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  (void)rng;
  const blobs *s = d->impl;
  const int k = (int)(i % (size_t)s->K);
  px_rng r = px_rng_make(s->sample_seed, (uint64_t)i);
  float *x = (float *)b->x.data + slot * (size_t)s->D;
  for (int j = 0; j < s->D; j++) x[j] = s->centre[k][j] + s->sigma * px_rng_normal(&r);
  ((int32_t *)b->y.data)[slot] = k;
  return PX_OK;
}

static void blobs_destroy(px_dataset *d) {
  free(d->impl);
  free(d);
}

static const px_dataset_ops blobs_ops = {blobs_get, blobs_destroy};

static px_dataset *blobs_open(size_t n, int D, int K, float sigma, uint64_t centre_seed, uint64_t sample_seed) {
  px_dataset *d = calloc(1, sizeof *d);
  blobs *s = calloc(1, sizeof *s);
  s->D = D;
  s->K = K;
  s->sigma = sigma;
  s->sample_seed = sample_seed;
  px_rng r = px_rng_make(centre_seed, 7);
  for (int k = 0; k < K; k++)
    for (int j = 0; j < D; j++) s->centre[k][j] = 4.0f * px_rng_uniform(&r) - 2.0f;
  d->ops = &blobs_ops;
  d->kind = "blobs";
  d->length = n;
  d->x_dtype = PX_F32;
  d->y_dtype = PX_I32;
  d->x_ndim = 1;
  d->x_shape[0] = D;
  d->y_ndim = 0;
  d->num_classes = (size_t)K;
  d->impl = s;
  return d;
}

#endif
