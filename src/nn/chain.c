// Chain (sequential container): y = f_n(... f_1(x)), backward in reverse.
//
// A BatchNorm right before a ReLU runs fused: the BatchNorm applies the ReLU
// in its normalising pass and masks dy in its backward, and the ReLU passes
// values through (nn/internal.h; the same bits as apart).  So does a
// Residual before a ReLU (ResNet's block output), whose ReLU keeps its
// backward.  A Linear fuses a Tanh after it into its forward GEMM and a
// Tanh before it into its backward one (the MLP's layers).
#include "plexus/nn.h"
#include "nn/internal.h"

#include <stdarg.h>
#include <stdio.h>

static px_status chain_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_tensor cur = *x;
  for (int i = 0; i < m->n_children; i++) {
    px_module *c = m->children[i];
    const bool relu_next = i + 1 < m->n_children && px_is_relu(m->children[i + 1]);
    const bool fuse = relu_next && px_is_batchnorm(c), fuse_add = relu_next && px_is_residual(c);
    const bool fuse_tanh = i + 1 < m->n_children && px_is_tanh(m->children[i + 1]) && px_is_linear(c);
    if (fuse) px_batchnorm_fuse_relu_next(c);
    if (fuse_add) px_residual_fuse_relu_next(c);
    if (fuse_tanh) px_linear_fuse_tanh_next(c);
    px_tensor next;
    px_status st = px_module_forward(c, ctx, &cur, &next);
    if (st != PX_OK) return st;
    if (fuse && px_batchnorm_relu_applied(c)) px_relu_input_is_relu(m->children[i + 1]);
    if (fuse_add && px_residual_relu_applied(c)) px_relu_input_is_relu_kept(m->children[i + 1]);
    if (fuse_tanh && px_linear_tanh_applied(c)) px_tanh_input_is_tanh(m->children[i + 1]);
    cur = next;
  }
  *y = cur;
  return PX_OK;
}

static px_status chain_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  px_tensor cur = *dy;
  for (int i = m->n_children - 1; i >= 0; i--) {
    // The first child only computes an input gradient if our caller wants one.
    px_tensor next;
    px_tensor *want = (i > 0 || dx) ? &next : NULL;
    px_module *c = m->children[i];
    const bool fuse_dtanh = i > 0 && px_is_linear(c) && px_is_tanh(m->children[i - 1]);
    if (fuse_dtanh) px_linear_fuse_dtanh_prev(c);
    px_status st = px_module_backward(c, ctx, &cur, want);
    if (st != PX_OK) return st;
    if (fuse_dtanh && px_linear_dtanh_applied(c)) px_tanh_dy_is_dx(m->children[i - 1]);
    if (want) cur = next;
  }
  if (dx) *dx = cur;
  return PX_OK;
}

static const px_module_ops chain_ops = {
  .type = "Chain",
  .forward = chain_forward,
  .backward = chain_backward,
};

px_module *px_chain(void) { return px_module_alloc(sizeof(px_module), &chain_ops); }

px_status px_chain_add_named(px_module *chain, const char *name, px_module *child) {
  return px_module_add_child(chain, name, child);
}

px_status px_chain_add(px_module *chain, px_module *child) {
  char name[16];
  snprintf(name, sizeof name, "%d", chain->n_children);
  return px_module_add_child(chain, name, child);
}

px_module *px_chain_of(int n, ...) {
  va_list ap;
  va_start(ap, n);
  px_module *kids[256];
  bool ok = n >= 0 && n <= 256;
  for (int i = 0; i < n && i < 256; i++) {
    kids[i] = va_arg(ap, px_module *);
    if (!kids[i]) ok = false;
  }
  va_end(ap);
  px_module *c = ok ? px_chain() : NULL;
  for (int i = 0; c && i < n; i++)
    if (px_chain_add(c, kids[i]) != PX_OK) {
      px_module_free(c);
      c = NULL;
      break;
    }
  if (!c) {
    // Free every child not yet adopted; the failing constructor's message stays.
    for (int i = 0; i < n && i < 256; i++)
      if (kids[i] && !kids[i]->parent) px_module_free(kids[i]);
    if (n < 0 || n > 256) px_error(PX_ERR_INVALID, "px_chain_of: %d children (0..256)", n);
  }
  return c;
}
