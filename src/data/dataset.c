// The dataset interface: checked fetch, subsets, batch buffers.
#include "plexus/data.h"

#include <stdlib.h>
#include <string.h>

px_status px_dataset_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  if (!d || !b) return px_error(PX_ERR_INVALID, "dataset: NULL dataset or batch");
  if (i >= d->length)
    return px_error(PX_ERR_INVALID, "dataset (%s): sample %zu outside a dataset of %zu", d->kind, i, d->length);
  if (slot >= b->capacity)
    return px_error(PX_ERR_INVALID, "dataset (%s): batch row %zu outside a batch of %zu rows", d->kind, slot,
                    b->capacity);
  return d->ops->get(d, i, b, slot, rng);
}

void px_dataset_free(px_dataset *d) {
  if (d && d->ops && d->ops->destroy) d->ops->destroy(d);
}

// ---- Subsets: rows [start, start + count) of a base dataset ---------------
typedef struct subset {
  px_dataset *base;
  size_t start;
} subset;

static px_status subset_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  subset *s = d->impl;
  return px_dataset_get(s->base, s->start + i, b, slot, rng);
}

static void subset_destroy(px_dataset *d) {
  free(d->impl);
  free(d);
}

static const px_dataset_ops subset_ops = {subset_get, subset_destroy};

px_status px_dataset_subset(px_dataset **out, px_dataset *base, size_t start, size_t count) {
  *out = NULL;
  if (!base) return px_error(PX_ERR_INVALID, "dataset subset: NULL base dataset");
  if (start > base->length || count > base->length - start || count == 0)
    return px_error(PX_ERR_INVALID, "dataset subset: samples [%zu, %zu) do not fit in a %s dataset of %zu", start,
                    start + count, base->kind, base->length);
  px_dataset *d = malloc(sizeof *d);
  subset *s = malloc(sizeof *s);
  if (!d || !s) {
    free(d);
    free(s);
    return px_error(PX_ERR_NOMEM, "dataset subset: out of memory");
  }
  *d = *base;
  d->ops = &subset_ops;
  d->kind = "subset";
  d->length = count;
  d->impl = s;
  s->base = base;
  s->start = start;
  *out = d;
  return PX_OK;
}

// ---- Batch buffers ---------------------------------------------------------
static px_status batch_tensor(px_tensor *t, px_dtype dtype, size_t capacity, int ndim, const int64_t *shape) {
  int64_t full[PX_MAX_DIMS];
  full[0] = (int64_t)capacity;
  for (int k = 0; k < ndim; k++) full[k + 1] = shape[k];
  return px_tensor_new(t, dtype, ndim + 1, full);
}

px_status px_batch_alloc(px_batch *b, const px_dataset *d, size_t capacity) {
  memset(b, 0, sizeof *b);
  if (!d || capacity == 0) return px_error(PX_ERR_INVALID, "batch: need a dataset and a capacity > 0");
  if (d->x_ndim < 0 || d->x_ndim > 3 || d->y_ndim < 0 || d->y_ndim > 3)
    return px_error(PX_ERR_INVALID, "batch: a %s sample has %d/%d dims; at most 3 fit a batch", d->kind, d->x_ndim,
                    d->y_ndim);
  px_status st = batch_tensor(&b->x, d->x_dtype, capacity, d->x_ndim, d->x_shape);
  if (st == PX_OK) st = batch_tensor(&b->y, d->y_dtype, capacity, d->y_ndim, d->y_shape);
  b->indices = calloc(capacity, sizeof *b->indices);
  if (st == PX_OK && !b->indices) st = px_error(PX_ERR_NOMEM, "batch: out of memory");
  if (st != PX_OK) {
    px_batch_free(b);
    return st;
  }
  b->capacity = capacity;
  b->n = capacity;
  return PX_OK;
}

void px_batch_free(px_batch *b) {
  if (!b) return;
  px_tensor_free(&b->x);
  px_tensor_free(&b->y);
  free(b->indices);
  memset(b, 0, sizeof *b);
}
