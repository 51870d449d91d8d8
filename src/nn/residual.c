// Residual: y = inner(x) + shortcut(x), shortcut the identity unless given
// (ResNet's projection: 1×1 conv of stride s, batchnorm).
//
//   forward:   h = inner(x),  s = shortcut(x) (or x),  y = h + s     h, s, y: same shape
//   backward:  dx = inner'(x)ᵀ dy + shortcut'(x)ᵀ dy   (or + dy)
//
// Children: [0] the inner branch (transparent in names), [1] the shortcut
// (named by the caller: "downsample" in torchvision's BasicBlock).
// Backward runs the shortcut first: its parameters come after the inner
// branch's in the flat layout, so gradients become ready from the end of
// the buffer towards its start, the order DDP's buckets fill in.
//
// A Residual right before a ReLU in a Chain (ResNet's block) runs the ReLU
// in its add, y = max(h + s, 0) in one pass (nn/internal.h), the ReLU
// module's formula on the same sum: the same bits as apart, one pass over
// the block's output fewer (the ReLU's).
//
// On the GPU (h on the device) the two adds are px_cuda_add.
#include "plexus/nn.h"
#include "nn/device.h"
#include "nn/internal.h"
#include "tensor/internal.h"

typedef struct residual {
  px_module base;
  bool relu_next;    /* the caller's Chain runs a ReLU on y next: fuse it (this forward only) */
  bool relu_applied; /* the last forward wrote max(h + s, 0) */
} residual;

// out = max(a + b, 0): px_add's sum, then the ReLU module's formula.
PX_KERNEL static void add_relu(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
  for (size_t i = 0; i < n; i++) {
    const float v = a[i] + b[i];
    out[i] = v > 0.0f ? v : 0.0f;
  }
}

// out = a + b, on the device when the tensors are.
static px_status residual_add(px_ctx *ctx, px_module *m, px_tensor *out, const px_tensor *a, const px_tensor *b) {
  const size_t n = (size_t)px_tensor_numel(b);
#ifdef PX_HAVE_CUDA
  if (b->device == PX_CUDA || a->device == PX_CUDA) {
    if (a->device != b->device)
      return px_error(PX_ERR_INVALID, "Residual: one branch's output is on the GPU, the other's on the host");
    px_status st = px_nn_cuda_ctx(ctx, m);
    return st != PX_OK ? st : px_cuda_add(px_f32(out), px_f32(a), px_f32(b), n);
  }
#endif
  (void)ctx;
  (void)m;
  px_add(px_f32(out), px_f32(a), px_f32(b), n);
  return PX_OK;
}

static px_status residual_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  residual *r = (residual *)m;
  const bool relu_next = r->relu_next;
  r->relu_next = r->relu_applied = false;
  px_tensor h, s = *x;
  px_status st = px_module_forward(m->children[0], ctx, x, &h);
  if (st != PX_OK) return st;
  if (m->n_children > 1 && (st = px_module_forward(m->children[1], ctx, x, &s)) != PX_OK) return st;
  if (!px_tensor_same_shape(&h, &s)) {
    char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX], c[PX_SHAPE_STR_MAX];
    if (m->n_children == 1)
      return px_error(PX_ERR_SHAPE, "Residual: inner %s maps %s to %s; a residual needs equal shapes",
                      m->children[0]->ops->type, px_shape_str(x->ndim, x->shape, a, sizeof a),
                      px_shape_str(h.ndim, h.shape, b, sizeof b));
    return px_error(PX_ERR_SHAPE,
                    "Residual: from input %s the inner %s gives %s but the shortcut %s \"%s\" gives %s; "
                    "the two branches must agree",
                    px_shape_str(x->ndim, x->shape, a, sizeof a), m->children[0]->ops->type,
                    px_shape_str(h.ndim, h.shape, b, sizeof b), m->children[1]->ops->type, m->children[1]->name,
                    px_shape_str(s.ndim, s.shape, c, sizeof c));
  }
  if ((st = px_ctx_tensor_like(ctx, y, &h)) != PX_OK) return st;
  const bool relu = relu_next && h.device == PX_CPU && s.device == PX_CPU;
  r->relu_applied = relu;
  if (!relu) return residual_add(ctx, m, y, &s, &h);
  add_relu(px_f32(y), px_f32(&s), px_f32(&h), (size_t)px_tensor_numel(&h));
  return PX_OK;
}

static px_status residual_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  px_tensor dh, ds = *dy;
  px_status st;
  if (m->n_children > 1 && (st = px_module_backward(m->children[1], ctx, dy, dx ? &ds : NULL)) != PX_OK) return st;
  st = px_module_backward(m->children[0], ctx, dy, dx ? &dh : NULL);
  if (st != PX_OK || !dx) return st;
  if ((st = px_ctx_tensor_like(ctx, dx, &dh)) != PX_OK) return st;
  return residual_add(ctx, m, dx, &ds, &dh);
}

static const px_module_ops residual_ops = {
  .type = "Residual",
  .forward = residual_forward,
  .backward = residual_backward,
};

px_module *px_residual_shortcut(px_module *inner, px_module *shortcut, const char *shortcut_name) {
  // A name without a module is a shortcut whose constructor failed (its
  // message is kept), not a request for the identity.
  const bool lost_shortcut = !shortcut && shortcut_name && shortcut_name[0];
  px_module *m = inner && !lost_shortcut ? px_module_alloc(sizeof(residual), &residual_ops) : NULL;
  if (m && px_module_add_child(m, "", inner) != PX_OK) {
    px_module_free(m);
    m = NULL;
  }
  if (m && shortcut && px_module_add_child(m, shortcut_name ? shortcut_name : "", shortcut) != PX_OK) {
    px_module_free(m);  // frees the adopted inner branch too
    inner = m = NULL;
  }
  if (!m) {
    // Free what was not adopted; a failed constructor's message stays.
    if (inner && !inner->parent) px_module_free(inner);
    if (shortcut && !shortcut->parent) px_module_free(shortcut);
  }
  return m;
}

px_module *px_residual(px_module *inner) { return px_residual_shortcut(inner, NULL, NULL); }

bool px_is_residual(const px_module *m) { return m && m->ops == &residual_ops; }
void px_residual_fuse_relu_next(px_module *m) { ((residual *)m)->relu_next = true; }
bool px_residual_relu_applied(const px_module *m) { return ((const residual *)m)->relu_applied; }
