// Flatten: (N, d1, ..., dk) -> (N, d1·...·dk), a view (no copy) both ways:
// y->data = x->data, dx->data = dy->data with x's shape.
#include "plexus/nn.h"

typedef struct flatten {
  px_module base;
  px_tensor x; /* only the shape is used */
} flatten;

static px_status flatten_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  flatten *f = (flatten *)m;
  if (x->ndim < 2) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "Flatten(start_dim=1): input %s must have a batch dimension and at least one more",
                    px_shape_str(x->ndim, x->shape, s, sizeof s));
  }
  int64_t rest = 1;
  for (int i = 1; i < x->ndim; i++) rest *= x->shape[i];
  int64_t shape[2] = {x->shape[0], rest};
  *y = px_tensor_view(x->data, x->dtype, 2, shape);
  y->device = x->device;
  f->x = *x;
  return PX_OK;
}

static px_status flatten_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  flatten *f = (flatten *)m;
  if (!dx) return PX_OK;
  *dx = px_tensor_view(dy->data, dy->dtype, f->x.ndim, f->x.shape);
  dx->device = dy->device;
  return PX_OK;
}

static const px_module_ops flatten_ops = {
  .type = "Flatten",
  .forward = flatten_forward,
  .backward = flatten_backward,
};

px_module *px_flatten(void) { return px_module_alloc(sizeof(flatten), &flatten_ops); }
