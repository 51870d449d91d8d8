// What every parallel strategy checks before it shares anything: that all
// ranks built the same model.  A hash of each parameter's name, shape and
// kind is all-gathered; the first slot that differs is reported by name.
#include "parallel/internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int px_parallel_param_index(const px_model *md, const px_param *p) {
  // Parameters are stored in layout order, so offsets are increasing.
  if (!p || p->is_buffer) return -1;
  int lo = 0, hi = md->n_params - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (md->params[mid]->offset == p->offset) return md->params[mid] == p ? mid : -1;
    if (md->params[mid]->offset < p->offset) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

static uint64_t hash_param(const px_param *p) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char *s = p->name; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  for (int i = 0; i < p->ndim; i++) h = (h ^ (uint64_t)p->shape[i]) * 1099511628211ull;
  return (h ^ (uint64_t)p->is_buffer) * 1099511628211ull;
}

px_status px_parallel_check_layout(px_model *md, px_comm *c, const char *who) {
  const int size = px_comm_size(c), rank = px_comm_rank(c);
  int64_t n_all = md->n_params + md->n_buffers, n_max = n_all;
  px_status st = px_comm_allreduce(c, &n_max, 1, PX_I64, PX_MAX);
  if (st != PX_OK) return st;
  // Slot 0 holds the count, then one hash per parameter (0-padded).
  size_t width = (size_t)n_max + 1;
  int64_t *mine = calloc(width, sizeof *mine), *all = calloc(width * (size_t)size, sizeof *all);
  px_param **list = calloc(width, sizeof *list);
  if (!mine || !all || !list) {
    free(mine);
    free(all);
    free(list);
    return px_error(PX_ERR_NOMEM, "%s: out of memory", who);
  }
  mine[0] = n_all;
  int k = 0;
  for (int i = 0; i < md->n_params; i++) list[k++] = md->params[i];
  for (int i = 0; i < md->n_buffers; i++) list[k++] = md->buffers[i];
  for (int i = 0; i < k; i++) mine[i + 1] = (int64_t)hash_param(list[i]);
  st = px_comm_allgather(c, mine, all, width, PX_I64);
  if (st == PX_OK) {
    for (size_t i = 0; i < width && st == PX_OK; i++) {
      char others[256] = "";
      size_t len = 0;
      for (int r = 0; r < size; r++)
        if (all[(size_t)r * width + i] != mine[i] && len < sizeof others - 16)
          len += (size_t)snprintf(others + len, sizeof others - len, "%s%d", len ? ", " : "", r);
      if (!len) continue;
      if (i == 0) {
        st = px_error(PX_ERR_INVALID,
                      "%s: rank %d has %lld parameters and buffers, rank(s) %s differ; "
                      "every rank must build the same model",
                      who, rank, (long long)n_all, others);
      } else if ((int64_t)i > n_all) {
        st = px_error(PX_ERR_INVALID,
                      "%s: rank %d has only %lld parameters; rank(s) %s have more; "
                      "every rank must build the same model",
                      who, rank, (long long)n_all, others);
      } else {
        char s[PX_SHAPE_STR_MAX];
        const px_param *p = list[i - 1];
        st = px_error(PX_ERR_INVALID,
                      "%s: parameter %zu is \"%s\" %s on rank %d but differs on rank(s) %s; "
                      "every rank must build the same model",
                      who, i - 1, p->name, px_shape_str(p->ndim, p->shape, s, sizeof s), rank, others);
      }
    }
  }
  free(mine);
  free(all);
  free(list);
  return st;
}
