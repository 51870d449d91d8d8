/* loader_synthetic.h — a synthetic dataset for the loader tests.
 *
 * Sample i: x = (i, u1, u2) f32 where u1, u2 are draws from the sample's
 * own rng (standing in for a random crop and flip), y = i.  Optional: a
 * delay per sample that varies with i (so workers finish out of order),
 * and a set of "bad" indices whose fetch fails like a corrupt record. */
#ifndef LOADER_SYNTHETIC_H
#define LOADER_SYNTHETIC_H

#include <stdlib.h>
#include <time.h>

#include "plexus/data.h"

typedef struct synth {
  long delay_us;    /* base delay per sample */
  size_t bad_every; /* every k-th index (k > 0) is bad; 0: none */
} synth;

static void synth_sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static px_status synth_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  synth *s = d->impl;
  if (s->delay_us > 0) synth_sleep_us(s->delay_us * (long)(1 + (i * 7) % 3));
  if (s->bad_every && i % s->bad_every == s->bad_every - 1)
    return px_error(PX_ERR_FORMAT, "synthetic.bin: record %zu is corrupt (expected a sample)", i);
  float *x = (float *)b->x.data + slot * 3;
  x[0] = (float)i;
  x[1] = px_rng_uniform(rng);
  x[2] = px_rng_uniform(rng);
  ((int32_t *)b->y.data)[slot] = (int32_t)i;
  return PX_OK;
}

static void synth_destroy(px_dataset *d) {
  free(d->impl);
  free(d);
}

static const px_dataset_ops synth_ops = {synth_get, synth_destroy};

static px_dataset *synth_open(size_t n, long delay_us, size_t bad_every) {
  px_dataset *d = calloc(1, sizeof *d);
  synth *s = calloc(1, sizeof *s);
  s->delay_us = delay_us;
  s->bad_every = bad_every;
  d->ops = &synth_ops;
  d->kind = "synthetic";
  d->length = n;
  d->x_dtype = PX_F32;
  d->y_dtype = PX_I32;
  d->x_ndim = 1;
  d->x_shape[0] = 3;
  d->y_ndim = 0;
  d->num_classes = n;
  d->impl = s;
  return d;
}

#endif
