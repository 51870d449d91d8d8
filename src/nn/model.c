// px_model: a module tree plus ONE flat buffer for parameters, one for
// gradients (same layout) and one for buffers (DESIGN decision 1).
//
//   param_data: [ 0.weight | 0.bias | 2.weight | 2.bias | ... ]   (n_param_elems,)
//   grad_data:  [ same layout ]
//   buffer_data:[ 1.running_mean | 1.running_var | ... ]           (n_buffer_elems,)
#include "plexus/nn.h"

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/px_cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static px_status collect(px_model *md, px_module *m, const char *prefix, int *cap, uint32_t *streams) {
  if (md->n_modules == *cap) {
    *cap = *cap ? 2 * *cap : 64;
    px_module **mods = realloc(md->modules, (size_t)*cap * sizeof *mods);
    if (!mods) return px_error(PX_ERR_NOMEM, "model: out of memory");
    md->modules = mods;
  }
  m->uid = (uint32_t)md->n_modules;
  m->stream = *streams;
  if (!m->rng_transparent) (*streams)++;
  md->modules[md->n_modules++] = m;
  // Full names: the path of non-empty child names, then the local name.
  for (int k = 0; k < m->n_params; k++) {
    px_param *p = &m->params[k];
    char full[PX_NAME_MAX];
    int len = snprintf(full, sizeof full, "%s%s%s", prefix, prefix[0] ? "." : "", p->name);
    if (len >= (int)sizeof full)
      return px_error(PX_ERR_INVALID, "model: parameter name \"%s%s\" longer than %d characters", prefix, p->name,
                      PX_NAME_MAX - 1);
    memcpy(p->name, full, sizeof full);
  }
  for (int i = 0; i < m->n_children; i++) {
    px_module *c = m->children[i];
    char sub[PX_NAME_MAX];
    if (c->name[0]) {
      int len = snprintf(sub, sizeof sub, "%s%s%s", prefix, prefix[0] ? "." : "", c->name);
      if (len >= (int)sizeof sub) return px_error(PX_ERR_INVALID, "model: module path too long at \"%s\"", c->name);
    } else {
      snprintf(sub, sizeof sub, "%s", prefix);
    }
    px_status st = collect(md, c, sub, cap, streams);
    if (st != PX_OK) return st;
  }
  return PX_OK;
}

static float *alloc_floats(size_t n) {
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  float *p = aligned_alloc(64, bytes ? bytes : 64);
  if (p) memset(p, 0, bytes ? bytes : 64);
  return p;
}

static void init_param(px_param *p, px_rng *rng) {
  if (!p->data) return;  // sharded away (ZeRO stage 3): nothing held here
  switch (p->init) {
  case PX_INIT_ZEROS: px_fill(p->data, p->numel, 0.0f); break;
  case PX_INIT_ONES: px_fill(p->data, p->numel, 1.0f); break;
  case PX_INIT_UNIFORM:
    for (size_t i = 0; i < p->numel; i++) p->data[i] = p->init_a * (2.0f * px_rng_uniform(rng) - 1.0f);
    break;
  case PX_INIT_NORMAL:
    for (size_t i = 0; i < p->numel; i++) p->data[i] = p->init_a * px_rng_normal(rng);
    break;
  }
}

// Point every parameter's data and grad, and every buffer's data, into the
// flat arrays given (a NULL array leaves those pointers alone).
static void point_params(px_model *md, float *param_data, float *grad_data, float *buffer_data) {
  for (int i = 0; i < md->n_params; i++) {
    if (param_data) md->params[i]->data = param_data + md->params[i]->offset;
    if (grad_data) md->params[i]->grad = grad_data + md->params[i]->offset;
  }
  if (buffer_data)
    for (int i = 0; i < md->n_buffers; i++) md->buffers[i]->data = buffer_data + md->buffers[i]->offset;
}

static void init_params(px_model *md, uint64_t seed);

void px_model_init(px_model *md, uint64_t seed) {
  if (md->device != PX_CUDA) {
    init_params(md, seed);
    return;
  }
  // CUDA: the initialisers write host memory.  Run them on the host mirrors
  // (the same values as on the CPU), then push.
  if (!md->param_data || !md->buffer_data) {
    px_error(PX_ERR_INVALID, "model: init of a CUDA model while a sharding strategy has freed its parameters");
    return;
  }
  point_params(md, md->host_param_data, NULL, md->host_buffer_data);
  init_params(md, seed);
  point_params(md, md->param_data, NULL, md->buffer_data);
  (void)px_model_push(md); /* void API: a failure is left in px_last_error */
}

static void init_params(px_model *md, uint64_t seed) {
  md->seed = seed;
  md->ctx.seed = seed;
  // Each module draws from its own stream (its pre-order index, wrappers
  // not counted), so adding a layer at the end, or checkpointing blocks,
  // does not change the initial weights of the others.
  for (int i = 0; i < md->n_modules; i++) {
    px_module *m = md->modules[i];
    if (m->ops->init) {
      px_rng rng = px_rng_make(seed, (uint64_t)m->stream << 8);
      m->ops->init(m, &rng);
      continue;
    }
    for (int k = 0; k < m->n_params; k++) {
      px_rng rng = px_rng_make(seed, ((uint64_t)m->stream << 8) | (uint64_t)k);
      init_param(&m->params[k], &rng);
    }
  }
}

px_status px_model_create(px_model **out, px_module *root, uint64_t seed) {
  *out = NULL;
  if (!root) return px_error(PX_ERR_INVALID, "model: no root module (did its constructor fail? %s)", px_last_error());
  px_model *md = calloc(1, sizeof *md);
  if (!md) {
    px_module_free(root);
    return px_error(PX_ERR_NOMEM, "model: out of memory");
  }
  md->root = root;
  int cap = 0;
  uint32_t streams = 0;
  px_status st = collect(md, root, "", &cap, &streams);
  if (st != PX_OK) {
    px_model_free(md);
    return st;
  }

  int n_all = 0;
  for (int i = 0; i < md->n_modules; i++) n_all += md->modules[i]->n_params;
  md->params = calloc((size_t)n_all + 1, sizeof *md->params);
  md->buffers = calloc((size_t)n_all + 1, sizeof *md->buffers);
  if (!md->params || !md->buffers) {
    px_model_free(md);
    return px_error(PX_ERR_NOMEM, "model: out of memory");
  }
  for (int i = 0; i < md->n_modules; i++) {
    px_module *m = md->modules[i];
    for (int k = 0; k < m->n_params; k++) {
      px_param *p = &m->params[k];
      if (p->is_buffer) {
        p->offset = md->n_buffer_elems;
        md->n_buffer_elems += p->numel;
        md->buffers[md->n_buffers++] = p;
      } else {
        p->offset = md->n_param_elems;
        md->n_param_elems += p->numel;
        md->params[md->n_params++] = p;
      }
    }
  }
  // Two parameters with one name would make a state_dict ambiguous.
  for (int i = 0; i < md->n_modules; i++)
    for (int k = 0; k < md->modules[i]->n_params; k++) {
      const char *name = md->modules[i]->params[k].name;
      px_param *first = px_model_find(md, name);
      if (first != &md->modules[i]->params[k]) {
        px_error(PX_ERR_INVALID, "model: two parameters are named \"%s\"; give the children distinct names", name);
        px_model_free(md);  // frees `name` too: the message is written first
        return PX_ERR_INVALID;
      }
    }

  md->param_data = alloc_floats(md->n_param_elems);
  md->grad_data = alloc_floats(md->n_param_elems);
  md->buffer_data = alloc_floats(md->n_buffer_elems);
  md->arena = px_arena_create(1u << 20);
  if (!md->param_data || !md->grad_data || !md->buffer_data || !md->arena) {
    px_model_free(md);
    return px_error(PX_ERR_NOMEM, "model: cannot allocate %zu parameters", md->n_param_elems);
  }
  for (int i = 0; i < md->n_params; i++) {
    md->params[i]->data = md->param_data + md->params[i]->offset;
    md->params[i]->grad = md->grad_data + md->params[i]->offset;
  }
  for (int i = 0; i < md->n_buffers; i++) {
    md->buffers[i]->data = md->buffer_data + md->buffers[i]->offset;
    md->buffers[i]->grad = NULL;
  }
  md->ctx.arena = md->arena;
  md->ctx.hooks = md->hooks;
  md->ctx.n_hooks = 0;
  px_model_train(md, true);
  px_model_init(md, seed);
  *out = md;
  return PX_OK;
}

void px_model_free(px_model *md) {
  if (!md) return;
  px_module_free(md->root);
  free(md->modules);
  free(md->params);
  free(md->buffers);
#ifdef PX_HAVE_CUDA
  if (md->device == PX_CUDA) {
    px_cuda_free(md->param_data);
    px_cuda_free(md->grad_data);
    px_cuda_free(md->buffer_data);
    md->param_data = md->grad_data = md->buffer_data = NULL;
  }
#endif
  free(md->param_data);
  free(md->grad_data);
  free(md->buffer_data);
  free(md->host_param_data);
  free(md->host_buffer_data);
  px_arena_free(md->arena); /* a device arena frees its chunks on the device */
  free(md);
}

px_status px_model_forward(px_model *md, const px_tensor *x, px_tensor *y) {
  px_arena_reset(md->arena);
  if (md->ctx.training) md->ctx.step++;
  return px_module_forward(md->root, &md->ctx, x, y);
}

px_status px_model_backward(px_model *md, const px_tensor *dy, px_tensor *dx) {
  return px_module_backward(md->root, &md->ctx, dy, dx);
}

void px_model_zero_grad(px_model *md) {
  if (!md->grad_data) return;
#ifdef PX_HAVE_CUDA
  if (md->device == PX_CUDA) {
    (void)px_cuda_zero(md->grad_data, md->n_param_elems * sizeof(float)); /* void API: see px_last_error */
    return;
  }
#endif
  px_fill(md->grad_data, md->n_param_elems, 0.0f);
}

void px_model_train(px_model *md, bool training) {
  md->ctx.training = training;
  for (int i = 0; i < md->n_modules; i++) md->modules[i]->training = training;
}

float *px_model_scratch(px_model *md, size_t n) { return px_arena_alloc(md->arena, n * sizeof(float)); }

// Listeners live in slots; ctx.n_hooks is one past the highest live slot, so
// px_ctx_call_hooks walks only what can be live.  A free slot holds NULL
// functions, which px_ctx_call_hooks skips.  Handles are never reused, so a
// stale handle cannot remove the listener that took its slot later.
static void trim_hooks(px_model *md) {
  int n = PX_MAX_HOOKS;
  while (n > 0 && md->hook_handle[n - 1] == 0) n--;
  md->ctx.n_hooks = n;
}

px_status px_model_attach_hooks(px_model *md, const px_hooks *hooks, int *handle) {
  if (handle) *handle = 0;
  int slot = 0;
  while (slot < PX_MAX_HOOKS && md->hook_handle[slot] != 0) slot++;
  if (slot == PX_MAX_HOOKS)
    return px_error(PX_ERR_INVALID,
                    "model: %d listeners already attached (PX_MAX_HOOKS); remove one with "
                    "px_model_remove_hooks (px_ddp_free and px_zero_free do)",
                    PX_MAX_HOOKS);
  if (md->next_hook_handle <= 0) md->next_hook_handle = 1;
  md->hooks[slot] = *hooks;
  md->hook_handle[slot] = md->next_hook_handle++;
  if (handle) *handle = md->hook_handle[slot];
  trim_hooks(md);
  return PX_OK;
}

void px_model_remove_hooks(px_model *md, int handle) {
  if (!md || handle <= 0) return;
  for (int i = 0; i < PX_MAX_HOOKS; i++)
    if (md->hook_handle[i] == handle) {
      md->hooks[i] = (px_hooks){0};
      md->hook_handle[i] = 0;
    }
  trim_hooks(md);
}

px_param *px_model_find(const px_model *md, const char *name) {
  for (int i = 0; i < md->n_modules; i++)
    for (int k = 0; k < md->modules[i]->n_params; k++)
      if (strcmp(md->modules[i]->params[k].name, name) == 0) return &md->modules[i]->params[k];
  return NULL;
}

px_status px_model_state_dict(const px_model *md, px_state_dict *sd) {
  int n = md->n_params + md->n_buffers;
  sd->items = calloc((size_t)n + 1, sizeof *sd->items);
  sd->count = 0;
  if (!sd->items) return px_error(PX_ERR_NOMEM, "model: out of memory");
  // Module by module, as PyTorch's state_dict orders them.
  for (int i = 0; i < md->n_modules; i++)
    for (int k = 0; k < md->modules[i]->n_params; k++) {
      px_param *p = &md->modules[i]->params[k];
      px_named_tensor *it = &sd->items[sd->count++];
      memcpy(it->name, p->name, sizeof it->name);
      // A CUDA model: views of the host mirrors (px_model_pull first).
      float *data = p->data;
      if (md->device == PX_CUDA) data = (p->is_buffer ? md->host_buffer_data : md->host_param_data) + p->offset;
      it->tensor = px_tensor_view(data, PX_F32, p->ndim, p->shape);
    }
  return PX_OK;
}

void px_model_print(const px_model *md, void *file) {
  FILE *f = file ? file : stdout;
  fprintf(f, "%-40s %-20s %10s %10s\n", "name", "shape", "offset", "numel");
  for (int i = 0; i < md->n_modules; i++)
    for (int k = 0; k < md->modules[i]->n_params; k++) {
      const px_param *p = &md->modules[i]->params[k];
      char s[PX_SHAPE_STR_MAX];
      fprintf(f, "%-40s %-20s %10zu %10zu%s\n", p->name, px_shape_str(p->ndim, p->shape, s, sizeof s), p->offset,
              p->numel, p->is_buffer ? "  (buffer)" : "");
    }
  fprintf(f, "parameters: %zu   buffers: %zu\n", md->n_param_elems, md->n_buffer_elems);
}

/* ---- Devices ------------------------------------------------------------------ */

#ifdef PX_HAVE_CUDA
// Host -> CUDA.  On failure the model is left as it was (on the host).
static px_status model_to_cuda(px_model *md, int gpu) {
  px_status st = px_cuda_init(gpu);
  if (st != PX_OK) return px_error_wrap(st, "model: to CUDA device %d", gpu);
  const size_t pbytes = md->n_param_elems * sizeof(float), bbytes = md->n_buffer_elems * sizeof(float);
  float *dp = px_cuda_malloc(pbytes), *dg = px_cuda_malloc(pbytes), *db = px_cuda_malloc(bbytes);
  px_arena *arena = px_cuda_arena_create(px_arena_capacity(md->arena));
  if (!dp || !dg || !db || !arena) {
    st = px_error_wrap(PX_ERR_NOMEM, "model: to CUDA device %d (%zu parameters)", gpu, md->n_param_elems);
    goto fail;
  }
  if ((st = px_cuda_to_device(dp, md->param_data, pbytes)) != PX_OK ||
      (st = px_cuda_to_device(dg, md->grad_data, pbytes)) != PX_OK ||
      (st = px_cuda_to_device(db, md->buffer_data, bbytes)) != PX_OK) {
    px_error_wrap(st, "model: to CUDA device %d", gpu);
    goto fail;
  }
  // The host parameter and buffer arrays become the mirrors; the host
  // gradients have none (they live on the device only).
  md->host_param_data = md->param_data;
  md->host_buffer_data = md->buffer_data;
  free(md->grad_data);
  md->param_data = dp;
  md->grad_data = dg;
  md->buffer_data = db;
  point_params(md, dp, dg, db);
  px_arena_free(md->arena);
  md->arena = arena;
  md->ctx.arena = arena;
  md->ctx.device = PX_CUDA;
  md->device = PX_CUDA;
  return PX_OK;
fail:
  px_cuda_free(dp);
  px_cuda_free(dg);
  px_cuda_free(db);
  px_arena_free(arena);
  return st;
}

// CUDA -> host: the current values come back into the mirrors, which become
// the flat arrays again.
static px_status model_to_host(px_model *md) {
  const size_t pbytes = md->n_param_elems * sizeof(float);
  float *hg = alloc_floats(md->n_param_elems);
  px_arena *arena = px_arena_create(px_arena_capacity(md->arena));
  px_status st = hg && arena ? PX_OK : px_error(PX_ERR_NOMEM, "model: to the host: out of memory");
  if (st == PX_OK) st = px_model_pull(md);
  if (st == PX_OK) st = px_cuda_to_host(hg, md->grad_data, pbytes);
  if (st != PX_OK) {
    free(hg);
    px_arena_free(arena);
    return st;
  }
  px_cuda_free(md->param_data);
  px_cuda_free(md->grad_data);
  px_cuda_free(md->buffer_data);
  md->param_data = md->host_param_data;
  md->buffer_data = md->host_buffer_data;
  md->grad_data = hg;
  md->host_param_data = md->host_buffer_data = NULL;
  point_params(md, md->param_data, md->grad_data, md->buffer_data);
  px_arena_free(md->arena);
  md->arena = arena;
  md->ctx.arena = arena;
  md->ctx.device = PX_CPU;
  md->ctx.compute_dtype = PX_F32;
  md->device = PX_CPU;
  return PX_OK;
}
#endif

px_status px_model_to_device(px_model *md, px_device device, int gpu) {
  if (device != PX_CPU && device != PX_CUDA) return px_error(PX_ERR_INVALID, "model: unknown device %d", (int)device);
  if (device == md->device) {
#ifdef PX_HAVE_CUDA
    // Already there: the same GPU is a no-op, another one is refused.
    if (device == PX_CUDA && gpu != px_cuda_current_device())
      return px_error(PX_ERR_INVALID, "model: already on CUDA device %d, not %d", px_cuda_current_device(), gpu);
#endif
    return PX_OK;
  }
#ifndef PX_HAVE_CUDA
  (void)gpu;
  return px_error(PX_ERR_UNSUPPORTED,
                  "model: plexus was built without CUDA: rebuild where CMake finds the CUDA toolkit (nvcc, "
                  "cuBLAS, NCCL), or use --device cpu");
#else
  if (!md->param_data || !md->grad_data || !md->buffer_data)
    return px_error(PX_ERR_INVALID,
                    "model: a sharding strategy (ZeRO) has freed the flat buffers; move the model "
                    "to its device before creating the strategy (or after px_zero_free)");
  if (device == PX_CPU) return model_to_host(md);
  if (gpu < 0) return px_error(PX_ERR_INVALID, "model: GPU index %d is negative", gpu);
  if (px_cuda_device_count() == 0)
    return px_error(PX_ERR_UNSUPPORTED, "model: no CUDA device found (no GPU, or no NVIDIA driver); use --device cpu");
  return model_to_cuda(md, gpu);
#endif
}

px_status px_model_pull(px_model *md) {
  if (md->device != PX_CUDA) return PX_OK;
#ifdef PX_HAVE_CUDA
  px_status st = px_cuda_to_host(md->host_param_data, md->param_data, md->n_param_elems * sizeof(float));
  if (st == PX_OK) st = px_cuda_to_host(md->host_buffer_data, md->buffer_data, md->n_buffer_elems * sizeof(float));
  return st == PX_OK ? PX_OK : px_error_wrap(st, "model: pull");
#else
  return px_error(PX_ERR_INTERNAL, "model: on CUDA in a build without CUDA");
#endif
}

px_status px_model_push(px_model *md) {
  if (md->device != PX_CUDA) return PX_OK;
#ifdef PX_HAVE_CUDA
  px_status st = px_cuda_to_device(md->param_data, md->host_param_data, md->n_param_elems * sizeof(float));
  if (st == PX_OK) st = px_cuda_to_device(md->buffer_data, md->host_buffer_data, md->n_buffer_elems * sizeof(float));
  return st == PX_OK ? PX_OK : px_error_wrap(st, "model: push");
#else
  return px_error(PX_ERR_INTERNAL, "model: on CUDA in a build without CUDA");
#endif
}

px_status px_model_set_compute_dtype(px_model *md, px_dtype dt) {
  if (dt == PX_F32) {
    md->ctx.compute_dtype = PX_F32;
    return PX_OK;
  }
  if (dt != PX_BF16)
    return px_error(PX_ERR_UNSUPPORTED, "model: compute dtype %s: only F32, or BF16 on CUDA", px_dtype_name(dt));
  if (md->device != PX_CUDA)
    return px_error(PX_ERR_UNSUPPORTED,
                    "model: bf16 computation needs the model on CUDA (--device cuda); the CPU path computes in f32");
  md->ctx.compute_dtype = PX_BF16;
  return PX_OK;
}
