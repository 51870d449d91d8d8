// Residual: y = x + inner(x);  dx = dy + inner'(x)ᵀ dy.
#include "plexus/nn.h"

static px_status residual_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_tensor h;
  px_status st = px_module_forward(m->children[0], ctx, x, &h);
  if (st != PX_OK) return st;
  if (!px_tensor_same_shape(&h, x)) {
    char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "Residual: inner %s maps %s to %s; a residual needs equal shapes",
                    m->children[0]->ops->type, px_shape_str(x->ndim, x->shape, a, sizeof a),
                    px_shape_str(h.ndim, h.shape, b, sizeof b));
  }
  if ((st = px_ctx_tensor_like(ctx, y, x)) != PX_OK) return st;
  px_add(px_f32(y), px_f32(x), px_f32(&h), (size_t)px_tensor_numel(x));
  return PX_OK;
}

static px_status residual_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  px_tensor dh;
  px_status st = px_module_backward(m->children[0], ctx, dy, dx ? &dh : NULL);
  if (st != PX_OK || !dx) return st;
  if ((st = px_ctx_tensor_like(ctx, dx, dy)) != PX_OK) return st;
  px_add(px_f32(dx), px_f32(dy), px_f32(&dh), (size_t)px_tensor_numel(dy));
  return PX_OK;
}

static const px_module_ops residual_ops = {
  .type = "Residual", .forward = residual_forward, .backward = residual_backward,
};

px_module *px_residual(px_module *inner) {
  if (!inner) return NULL;
  px_module *m = px_module_alloc(sizeof(px_module), &residual_ops);
  if (!m) { px_module_free(inner); return NULL; }
  if (px_module_add_child(m, "", inner) != PX_OK) { px_module_free(inner); px_module_free(m); return NULL; }
  return m;
}
