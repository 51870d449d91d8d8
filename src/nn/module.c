// The module protocol: allocation, parameter declaration, children, and
// forward/backward of one module with the model's hooks around it.
#include "plexus/nn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

px_module *px_module_alloc(size_t size, const px_module_ops *ops) {
  if (size < sizeof(px_module)) size = sizeof(px_module);
  px_module *m = calloc(1, size);
  if (!m) {
    px_error(PX_ERR_NOMEM, "module: out of memory");
    return NULL;
  }
  m->ops = ops;
  m->training = true;
  return m;
}

px_param *px_module_add_param(px_module *m, const char *name, int ndim, const int64_t *shape, px_init_kind init,
                              float init_a, bool is_buffer) {
  if (m->n_params >= PX_MODULE_MAX_PARAMS) {
    px_error(PX_ERR_INVALID, "%s: more than %d parameters", m->ops->type, PX_MODULE_MAX_PARAMS);
    return NULL;
  }
  px_param *p = &m->params[m->n_params++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = ndim;
  p->numel = 1;
  for (int i = 0; i < ndim; i++) {
    p->shape[i] = shape[i];
    p->numel *= (size_t)shape[i];
  }
  p->init = init;
  p->init_a = init_a;
  p->is_buffer = is_buffer;
  p->owner = m;
  return p;
}

px_status px_module_add_child(px_module *m, const char *name, px_module *child) {
  if (!child) return PX_ERR_INVALID; /* the child's constructor set the message */
  if (child->parent)
    return px_error(PX_ERR_INVALID, "%s: child %s already belongs to another container", m->ops->type,
                    child->ops->type);
  if (m->n_children == m->cap_children) {
    int cap = m->cap_children ? 2 * m->cap_children : 8;
    px_module **c = realloc(m->children, (size_t)cap * sizeof *c);
    if (!c) return px_error(PX_ERR_NOMEM, "%s: out of memory", m->ops->type);
    m->children = c;
    m->cap_children = cap;
  }
  snprintf(child->name, sizeof child->name, "%s", name ? name : "");
  child->parent = m;
  m->children[m->n_children++] = child;
  return PX_OK;
}

px_status px_module_add_foreign_param(px_module *m, px_param *p) {
  if (!p || p->is_buffer)
    return px_error(PX_ERR_INVALID, "%s: a foreign parameter must be a trainable parameter of another module",
                    m->ops->type);
  if (m->n_foreign >= PX_MODULE_MAX_FOREIGN)
    return px_error(PX_ERR_INVALID, "%s: more than %d foreign parameters", m->ops->type, PX_MODULE_MAX_FOREIGN);
  m->foreign[m->n_foreign++] = p;
  return PX_OK;
}

void px_module_free(px_module *m) {
  if (!m) return;
  for (int i = 0; i < m->n_children; i++) px_module_free(m->children[i]);
  free(m->children);
  if (m->ops && m->ops->destroy) m->ops->destroy(m);
  free(m);
}

void px_ctx_call_hooks(px_ctx *ctx, px_hook_point point, px_module *m) {
  for (int i = 0; i < ctx->n_hooks; i++) {
    const px_hooks *h = &ctx->hooks[i];
    void (*fn)(void *, px_module *) = NULL;
    switch (point) {
    case PX_HOOK_PRE_FORWARD: fn = h->pre_forward; break;
    case PX_HOOK_POST_FORWARD: fn = h->post_forward; break;
    case PX_HOOK_PRE_BACKWARD: fn = h->pre_backward; break;
    case PX_HOOK_GRADS_READY: fn = h->grads_ready; break;
    }
    if (fn) fn(h->user, m);
  }
}

px_status px_module_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_ctx_call_hooks(ctx, PX_HOOK_PRE_FORWARD, m);
  px_status st = m->ops->forward(m, ctx, x, y);
  if (st != PX_OK) return st;
  px_ctx_call_hooks(ctx, PX_HOOK_POST_FORWARD, m);
  return PX_OK;
}

px_status px_module_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  px_ctx_call_hooks(ctx, PX_HOOK_PRE_BACKWARD, m);
  if (!m->ops->backward) return px_error(PX_ERR_UNSUPPORTED, "%s: no backward", m->ops->type);
  px_status st = m->ops->backward(m, ctx, dy, dx);
  if (st != PX_OK) return st;
  px_ctx_call_hooks(ctx, PX_HOOK_GRADS_READY, m);
  return PX_OK;
}

px_status px_ctx_tensor(px_ctx *ctx, px_tensor *out, int ndim, const int64_t *shape) {
  *out = px_tensor_view(NULL, PX_F32, ndim, shape);
  out->device = ctx->device;
  out->data = px_arena_alloc(ctx->arena, px_tensor_nbytes(out));
  return out->data ? PX_OK : PX_ERR_NOMEM;
}

px_status px_ctx_tensor_like(px_ctx *ctx, px_tensor *out, const px_tensor *like) {
  return px_ctx_tensor(ctx, out, like->ndim, like->shape);
}
