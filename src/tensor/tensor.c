// px_tensor: dtype, shape, device, data; views by default.
#include "plexus/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

px_tensor px_tensor_view(void *data, px_dtype dtype, int ndim, const int64_t *shape) {
  px_tensor t = {.dtype = dtype, .device = PX_CPU, .ndim = ndim, .data = data, .owned = false};
  for (int i = 0; i < ndim && i < PX_MAX_DIMS; i++) t.shape[i] = shape[i];
  return t;
}

px_tensor px_tensor_f32(float *data, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  int64_t s[4] = {d0, d1, d2, d3};
  return px_tensor_view(data, PX_F32, ndim, s);
}

px_status px_tensor_new(px_tensor *out, px_dtype dtype, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > PX_MAX_DIMS)
    return px_error(PX_ERR_INVALID, "tensor: %d dimensions asked, at most %d supported", ndim, PX_MAX_DIMS);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) return px_error(PX_ERR_INVALID, "tensor: negative dimension %lld", (long long)shape[i]);
  *out = px_tensor_view(NULL, dtype, ndim, shape);
  size_t bytes = px_tensor_nbytes(out);
  size_t rounded = (bytes + 63) / 64 * 64;
  out->data = aligned_alloc(64, rounded ? rounded : 64);
  if (!out->data) return px_error(PX_ERR_NOMEM, "tensor: cannot allocate %zu bytes", bytes);
  memset(out->data, 0, rounded ? rounded : 64);
  out->owned = true;
  return PX_OK;
}

void px_tensor_free(px_tensor *t) {
  if (t && t->owned) free(t->data);
  if (t) {
    t->data = NULL;
    t->owned = false;
  }
}

int64_t px_tensor_numel(const px_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

size_t px_tensor_nbytes(const px_tensor *t) { return (size_t)px_tensor_numel(t) * px_dtype_size(t->dtype); }

bool px_tensor_same_shape(const px_tensor *a, const px_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

char *px_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, len - k, "(");
  for (int i = 0; i < ndim && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (ndim == 1 && k < len) k += (size_t)snprintf(buf + k, len - k, ",");
  if (k < len) snprintf(buf + k, len - k, ")");
  return buf;
}

void px_state_dict_free(px_state_dict *sd) {
  if (!sd) return;
  free(sd->items);
  sd->items = NULL;
  sd->count = 0;
}

int px_state_dict_find(const px_state_dict *sd, const char *name) {
  for (int i = 0; i < sd->count; i++)
    if (strcmp(sd->items[i].name, name) == 0) return i;
  return -1;
}
