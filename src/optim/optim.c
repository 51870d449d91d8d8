// SGD, Adam and AdamW over flat buffers, with torch.optim's update rules
// (PyTorch 1.13, single parameter group, foreach=False, maximize=False,
// amsgrad=False).  params, grads: (n,) or segments of separate buffers,
// each with its offset into the state: (n_state, n) in one block.
//
// Each loop below is one kind of update with its choices (momentum,
// Nesterov, coupled or decoupled decay) made before the loop, so the loop
// body has no branches and vectorizes; OpenMP splits it above PX_PAR_MIN.
// Elementwise operations follow PyTorch's order, so float32 results stay
// within a few ulp of torch's (its vector kernels fuse some of them as FMA,
// which ISO C, without -ffp-contract, does not).
#include "plexus/optim.h"
#include "tensor/internal.h"
#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_optim.h"
#include "tensor/cuda/px_cuda.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

px_optim_opts px_sgd_defaults(float lr) {
  // torch.optim.SGD(lr, momentum=0, dampening=0, weight_decay=0, nesterov=False)
  return (px_optim_opts){.kind = PX_OPTIM_SGD,
                         .lr = lr,
                         .momentum = 0.0f,
                         .dampening = 0.0f,
                         .nesterov = false,
                         .beta1 = 0.9f,
                         .beta2 = 0.999f,
                         .eps = 1e-8f,
                         .weight_decay = 0.0f};
}

px_optim_opts px_adam_defaults(float lr) {
  // torch.optim.Adam(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)
  return (
    px_optim_opts){.kind = PX_OPTIM_ADAM, .lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f};
}

px_optim_opts px_adamw_defaults(float lr) {
  // torch.optim.AdamW(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
  px_optim_opts o = px_adam_defaults(lr);
  o.kind = PX_OPTIM_ADAMW;
  o.weight_decay = 0.01f;
  return o;
}

static const char *kind_name(px_optim_kind k) {
  switch (k) {
  case PX_OPTIM_SGD: return "sgd";
  case PX_OPTIM_ADAM: return "adam";
  case PX_OPTIM_ADAMW: return "adamw";
  }
  return "optim";
}

// The checks torch.optim's constructors make, written `!(x >= 0)` so that a
// NaN option fails them too.
static px_status check_opts(const px_optim_opts *o) {
  if (o->kind != PX_OPTIM_SGD && o->kind != PX_OPTIM_ADAM && o->kind != PX_OPTIM_ADAMW)
    return px_error(PX_ERR_INVALID,
                    "optim: unknown optimizer kind %d (expected PX_OPTIM_SGD, "
                    "PX_OPTIM_ADAM or PX_OPTIM_ADAMW)",
                    (int)o->kind);
  const char *name = kind_name(o->kind);
  if (!(o->lr >= 0.0f)) return px_error(PX_ERR_INVALID, "%s: learning rate must be >= 0, got %g", name, (double)o->lr);
  if (!(o->weight_decay >= 0.0f))
    return px_error(PX_ERR_INVALID, "%s: weight_decay must be >= 0, got %g", name, (double)o->weight_decay);
  if (o->kind == PX_OPTIM_SGD) {
    if (!(o->momentum >= 0.0f))
      return px_error(PX_ERR_INVALID, "sgd: momentum must be >= 0, got %g", (double)o->momentum);
    if (!isfinite(o->dampening))
      return px_error(PX_ERR_INVALID, "sgd: dampening must be finite, got %g", (double)o->dampening);
    if (o->nesterov && (o->momentum <= 0.0f || o->dampening != 0.0f))
      return px_error(PX_ERR_INVALID,
                      "sgd: Nesterov momentum requires momentum > 0 and dampening 0, "
                      "got momentum %g and dampening %g",
                      (double)o->momentum, (double)o->dampening);
    return PX_OK;
  }
  if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f))
    return px_error(PX_ERR_INVALID, "%s: beta1 must be in [0, 1), got %g", name, (double)o->beta1);
  if (!(o->beta2 >= 0.0f && o->beta2 < 1.0f))
    return px_error(PX_ERR_INVALID, "%s: beta2 must be in [0, 1), got %g", name, (double)o->beta2);
  // PyTorch accepts eps = 0, but then a parameter whose gradient has always
  // been 0 gets 0/0 = NaN; plexus asks for eps > 0.
  if (!(o->eps > 0.0f)) return px_error(PX_ERR_INVALID, "%s: eps must be > 0, got %g", name, (double)o->eps);
  return PX_OK;
}

// Checks one segment's buffers; the loops read grads through restrict
// pointers while writing params, so they must not overlap.
static px_status check_segment(const char *name, int k, const float *params, const float *grads, size_t count) {
  if (count > 0 && (!params || !grads))
    return px_error(PX_ERR_INVALID, "%s: segment %d: params or grads is NULL for %zu elements", name, k, count);
  uintptr_t pa = (uintptr_t)params, ga = (uintptr_t)grads, bytes_n = count * sizeof(float);
  if (count > 0 && pa < ga + bytes_n && ga < pa + bytes_n)
    return px_error(PX_ERR_INVALID, "%s: segment %d: params and grads overlap; they must be separate buffers", name, k);
  return PX_OK;
}

px_status px_optim_create_segments(px_optim **out, const px_optim_segment *segs, int n_seg, size_t n,
                                   const px_optim_opts *opts) {
  if (!out) return px_error(PX_ERR_INVALID, "optim: out is NULL");
  *out = NULL;
  if (!opts) return px_error(PX_ERR_INVALID, "optim: opts is NULL (use px_sgd_defaults(lr) or px_adam_defaults(lr))");
  px_status st = check_opts(opts);
  if (st != PX_OK) return st;
  const char *name = kind_name(opts->kind);
  if (n > SIZE_MAX / sizeof(float) / 2 - 64) return px_error(PX_ERR_INVALID, "%s: n = %zu is too large", name, n);
  if (n_seg < 0 || (n_seg > 0 && !segs))
    return px_error(PX_ERR_INVALID, "%s: %d segments but no array of segments", name, n_seg);
  size_t end = 0;
  for (int k = 0; k < n_seg; k++) {
    const px_optim_segment *g = &segs[k];
    if ((st = check_segment(name, k, g->params, g->grads, g->count)) != PX_OK) return st;
    if (g->offset < end || g->offset > n || g->count > n - g->offset)
      return px_error(PX_ERR_INVALID,
                      "%s: segment %d covers state [%zu, %zu), which overlaps the previous segment "
                      "(ending at %zu) or ends past n = %zu; segments go in increasing offset order within n",
                      name, k, g->offset, g->offset + g->count, end, n);
    end = g->offset + g->count;
  }

  int n_state = opts->kind == PX_OPTIM_SGD ? (opts->momentum != 0.0f ? 1 : 0) : 2;

  px_optim *o = calloc(1, sizeof *o);
  if (!o) return px_error(PX_ERR_NOMEM, "%s: cannot allocate the optimizer", name);
  o->seg = malloc((size_t)(n_seg > 0 ? n_seg : 1) * sizeof *o->seg);
  if (!o->seg) {
    free(o);
    return px_error(PX_ERR_NOMEM, "%s: cannot allocate the optimizer", name);
  }
  if (n_seg > 0) memcpy(o->seg, segs, (size_t)n_seg * sizeof *segs);
  o->n_seg = n_seg;
  o->opts = *opts;
  o->n = n;
  o->n_state = n_state;
  o->step = 0;
  if (n_state > 0) {
    // One block (n_state, n), 64-byte aligned; a 64-byte block even when
    // n = 0 (an empty ZeRO shard), so every slot is a valid pointer.
    size_t bytes = (size_t)n_state * n * sizeof(float);
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    o->state = aligned_alloc(64, rounded);
    if (!o->state) {
      free(o->seg);
      free(o);
      return px_error(PX_ERR_NOMEM, "%s: cannot allocate %zu bytes of optimizer state", name, bytes);
    }
    memset(o->state, 0, rounded);
  }
  *out = o;
  return PX_OK;
}

px_status px_optim_create(px_optim **out, float *params, float *grads, size_t n, const px_optim_opts *opts) {
  if (!out) return px_error(PX_ERR_INVALID, "optim: out is NULL");
  *out = NULL;
  if (!opts) return px_error(PX_ERR_INVALID, "optim: opts is NULL (use px_sgd_defaults(lr) or px_adam_defaults(lr))");
  px_status st = check_opts(opts);
  if (st != PX_OK) return st;
  const char *name = kind_name(opts->kind);
  if (n > 0 && (!params || !grads)) return px_error(PX_ERR_INVALID, "%s: params or grads is NULL for n = %zu", name, n);
  uintptr_t pa = (uintptr_t)params, ga = (uintptr_t)grads, bytes_n = n * sizeof(float);
  if (n > 0 && pa < ga + bytes_n && ga < pa + bytes_n)
    return px_error(PX_ERR_INVALID, "%s: params and grads overlap; they must be separate buffers", name);
  px_optim_segment one = {.params = params, .grads = grads, .count = n, .offset = 0};
  if ((st = px_optim_create_segments(out, &one, 1, n, opts)) != PX_OK) return st;
  (*out)->params = params;
  (*out)->grads = grads;
  return PX_OK;
}

void px_optim_free(px_optim *o) {
  if (!o) return;
#ifdef PX_HAVE_CUDA
  px_cuda_free(o->dev_state);
#endif
  free(o->state);
  free(o->seg);
  free(o);
}

void px_optim_set_lr(px_optim *o, float lr) {
  if (o) o->opts.lr = lr;
}

float *px_optim_state_slot(px_optim *o, int k, const char **name) {
  if (name) *name = NULL;
  if (!o || k < 0 || k >= o->n_state) return NULL;
  if (name) {
    if (o->opts.kind == PX_OPTIM_SGD) *name = "momentum_buffer";
    else *name = k == 0 ? "exp_avg" : "exp_avg_sq";
  }
  return o->state + (size_t)k * o->n;
}

// ---- SGD ------------------------------------------------------------------
//   d   = grad + wd·p                      (L2 term; wd = 0 leaves grad as is)
//   buf = d                                on the first step
//   buf = momentum·buf + (1 - dampening)·d later
//   d   = d + momentum·buf   (Nesterov)   or   d = buf   (heavy ball)
//   p  -= lr·d
// zero: g[i] = 0 once read (px_optim_step_zero_grads).
PX_KERNEL static void sgd_segment(const px_optim *o, float *restrict p, float *restrict g, float *restrict buf,
                                  size_t n, bool zero) {
  const float lr = o->opts.lr, wd = o->opts.weight_decay, mom = o->opts.momentum;

  if (o->n_state == 0) {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) {
      float d = g[i] + wd * p[i];
      if (zero) g[i] = 0.0f;
      p[i] = p[i] - lr * d;
    }
    return;
  }

  // The first step copies d into the buffer: buf = 0·buf + 1·d is exactly d
  // (buf starts zeroed), so both cases share the loop through (keep, take).
  const float keep = o->step == 0 ? 0.0f : mom;
  const float take = o->step == 0 ? 1.0f : (float)(1.0 - (double)o->opts.dampening);
  if (o->opts.nesterov) {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) {
      float d = g[i] + wd * p[i];
      if (zero) g[i] = 0.0f;
      float b = keep * buf[i] + take * d;
      buf[i] = b;
      p[i] = p[i] - lr * (d + mom * b);
    }
  } else {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) {
      float d = g[i] + wd * p[i];
      if (zero) g[i] = 0.0f;
      float b = keep * buf[i] + take * d;
      buf[i] = b;
      p[i] = p[i] - lr * b;
    }
  }
}

static void sgd_step(px_optim *o, bool zero) {
  for (int k = 0; k < o->n_seg; k++) {
    const px_optim_segment *s = &o->seg[k];
    sgd_segment(o, s->params, s->grads, o->n_state ? o->state + s->offset : NULL, s->count, zero);
  }
}

// ---- Adam and AdamW -------------------------------------------------------
// With t = step + 1 (1-based), in PyTorch's order:
//   p    *= 1 - lr·wd                       (AdamW only: decoupled decay)
//   d     = grad + wd·p                     (Adam only: L2 term)
//   m     = β1·m + (1 - β1)·d               exp_avg
//   v     = β2·v + (1 - β2)·d·d             exp_avg_sq
//   bc1   = 1 - β1^t,  bc2 = 1 - β2^t       (in double)
//   denom = sqrt(v) / sqrt(bc2) + eps
//   p    += (-lr / bc1)·m / denom
// Adam runs the same loop with decay 1 (p·1 = p exactly); AdamW with L2
// coefficient 0 (grad + 0·p = grad exactly for finite p).
//
// sqrt(v) / sqrt(bc2) divides by the same b = sqrt(bc2) everywhere, so it
// is taken without a division, with the same bits (Markstein's correction):
//   y = RN(1/b) once,  q = RN(s·y),  e = s - q·b (exact: fma),  RN(q + e·y) = RN(s/b)
// for every s in [2⁻¹⁰⁰, 2¹⁰⁰], which holds every finite sqrt(v), and 0
// (checked for every such float s and 56 divisors b: Adam's with β2 of
// 0.95–0.9999 from t = 1 to 100000, significands of all ones, random ones:
// tests/exhaustive/adam_reciprocal_division.c; CI runs a sample of it,
// tests/test_optim_adam_reciprocal_division_is_exact.c).  An infinite s
// keeps q = s·y = ∞, as the division gives.  sqrt and the divisions share
// one unit that takes a 16-float vector every 10–12 cycles; the update's
// m / denom stays a division (denom varies).  Where the CPU has no fma, or
// b's significand is all ones (where the proofs of this method need the
// most of y; it passed the exhaustive check too), the loop divides
// (recip_b = 0).
typedef struct adam_consts {
  float decay, l2, b1, b2, eps, c1, c2, neg_step_size, bc2_sqrt;
  float recip_b; /* RN(1/bc2_sqrt), or 0: divide */
} adam_consts;

// RN(1/b) where s/b may be taken as above, else 0.
static float adam_recip(float b) {
#if defined(__x86_64__) || defined(__i386__)
  if (!__builtin_cpu_supports("fma")) return 0.0f;
#elif !defined(__aarch64__)
  return 0.0f;
#endif
  uint32_t u;
  memcpy(&u, &b, sizeof u);
  if (!(b >= 0x1p-60f && b <= 0x1p60f) || (u & 0x7fffffu) == 0x7fffffu) return 0.0f;
  return 1.0f / b;
}

// Element i of the update; recip is a constant at each call, so each loop
// below is straight-line code.
static inline __attribute__((always_inline)) void adam_elem(const adam_consts *c, float *restrict p, float *restrict g,
                                                            float *restrict m, float *restrict v, size_t i, bool zero,
                                                            bool recip) {
  float pi = p[i] * c->decay;
  float d = g[i] + c->l2 * pi;
  if (zero) g[i] = 0.0f;
  float mi = m[i] * c->b1 + c->c1 * d;
  float vi = v[i] * c->b2 + c->c2 * d * d;
  m[i] = mi;
  v[i] = vi;
  const float s = sqrtf(vi);
  float sb; /* RN(s / bc2_sqrt) */
  if (recip) {
    const float y = c->recip_b, q = s * y, r = fmaf(fmaf(-q, c->bc2_sqrt, s), y, q);
    sb = s == INFINITY ? q : r;
  } else {
    sb = s / c->bc2_sqrt;
  }
  float denom = sb + c->eps;
  p[i] = pi + c->neg_step_size * mi / denom;
}

// zero: g[i] = 0 once read (px_optim_step_zero_grads).
PX_KERNEL static void adam_segment(const adam_consts *c, float *restrict p, float *restrict g, float *restrict m,
                                   float *restrict v, size_t n, bool zero) {
  // Two loops, not one that chooses inside: gcc 12 leaves that one scalar
  // (vdivss, vsqrtss in every clone).
  if (c->recip_b != 0.0f) {
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) adam_elem(c, p, g, m, v, i, zero, true);
    return;
  }
#pragma omp parallel for simd if (parallel : PX_PAR(n))
  for (size_t i = 0; i < n; i++) adam_elem(c, p, g, m, v, i, zero, false);
}

static void adam_step(px_optim *o, bool zero) {
  const px_optim_opts *op = &o->opts;
  const bool decoupled = op->kind == PX_OPTIM_ADAMW;

  const double t = (double)(o->step + 1);
  const double bc1 = 1.0 - pow((double)op->beta1, t);
  const double bc2 = 1.0 - pow((double)op->beta2, t);
  const adam_consts c = {
    .decay = decoupled ? (float)(1.0 - (double)op->lr * op->weight_decay) : 1.0f,
    .l2 = decoupled ? 0.0f : op->weight_decay,
    .b1 = op->beta1,
    .b2 = op->beta2,
    .eps = op->eps,
    .c1 = (float)(1.0 - (double)op->beta1),
    .c2 = (float)(1.0 - (double)op->beta2),
    .neg_step_size = (float)(-(double)op->lr / bc1),
    .bc2_sqrt = (float)sqrt(bc2),
    .recip_b = adam_recip((float)sqrt(bc2)),
  };
  for (int k = 0; k < o->n_seg; k++) {
    const px_optim_segment *s = &o->seg[k];
    adam_segment(&c, s->params, s->grads, o->state + s->offset, o->state + o->n + s->offset, s->count, zero);
  }
}

// ---- On the GPU ------------------------------------------------------------
// The same updates as the loops above, one kernel launch per segment
// (k_optim.cu), with the scalars computed here exactly as above.

#ifdef PX_HAVE_CUDA
static px_status device_step(px_optim *o) {
  px_status st = PX_OK;
  const px_optim_opts *op = &o->opts;
  if (op->kind == PX_OPTIM_SGD) {
    const float keep = o->step == 0 ? 0.0f : op->momentum;
    const float take = o->step == 0 ? 1.0f : (float)(1.0 - (double)op->dampening);
    for (int k = 0; k < o->n_seg && st == PX_OK; k++) {
      const px_optim_segment *s = &o->seg[k];
      if (o->n_state == 0) st = px_cuda_sgd_plain(s->params, s->grads, s->count, op->lr, op->weight_decay);
      else
        st = px_cuda_sgd_momentum(s->params, s->grads, o->dev_state + s->offset, s->count, op->lr, op->weight_decay,
                                  op->momentum, keep, take, op->nesterov);
    }
    return st;
  }
  const bool decoupled = op->kind == PX_OPTIM_ADAMW;
  const double t = (double)(o->step + 1);
  const double bc1 = 1.0 - pow((double)op->beta1, t);
  const double bc2 = 1.0 - pow((double)op->beta2, t);
  const adam_consts c = {
    .decay = decoupled ? (float)(1.0 - (double)op->lr * op->weight_decay) : 1.0f,
    .l2 = decoupled ? 0.0f : op->weight_decay,
    .b1 = op->beta1,
    .b2 = op->beta2,
    .eps = op->eps,
    .c1 = (float)(1.0 - (double)op->beta1),
    .c2 = (float)(1.0 - (double)op->beta2),
    .neg_step_size = (float)(-(double)op->lr / bc1),
    .bc2_sqrt = (float)sqrt(bc2),
  };
  for (int k = 0; k < o->n_seg && st == PX_OK; k++) {
    const px_optim_segment *s = &o->seg[k];
    st = px_cuda_adam(s->params, s->grads, o->dev_state + s->offset, o->dev_state + o->n + s->offset, s->count, c.decay,
                      c.l2, c.b1, c.b2, c.eps, c.c1, c.c2, c.neg_step_size, c.bc2_sqrt);
  }
  return st;
}

static px_status check_device_buffer(const char *name, int k, const char *which, const float *p, size_t count) {
  if (count == 0) return PX_OK;
  bool dev = false;
  px_status st = px_cuda_is_device_memory(p, &dev);
  if (st == PX_OK && !dev)
    st = px_error(PX_ERR_INVALID,
                  "%s: px_optim_to_device: segment %d's %s (%zu floats) is host memory; create the "
                  "optimizer over the device buffers (the model's after px_model_to_device)",
                  name, k, which, count);
  return st;
}

static size_t state_bytes(const px_optim *o) { return (size_t)o->n_state * o->n * sizeof(float); }
#endif

px_status px_optim_to_device(px_optim *o) {
  if (!o) return px_error(PX_ERR_INVALID, "px_optim_to_device: the optimizer is NULL");
  if (o->device == PX_CUDA) return PX_OK;
#ifdef PX_HAVE_CUDA
  const char *name = kind_name(o->opts.kind);
  if (px_cuda_current_device() < 0)
    return px_error(PX_ERR_INVALID,
                    "%s: px_optim_to_device: no CUDA device is current on this thread "
                    "(call px_cuda_init first)",
                    name);
  px_status st = PX_OK;
  for (int k = 0; k < o->n_seg && st == PX_OK; k++) {
    const px_optim_segment *s = &o->seg[k];
    if ((st = check_device_buffer(name, k, "params", s->params, s->count)) == PX_OK)
      st = check_device_buffer(name, k, "grads", s->grads, s->count);
  }
  if (st != PX_OK) return st;
  if (o->n_state > 0) {
    const size_t bytes = state_bytes(o);
    o->dev_state = px_cuda_malloc(bytes ? bytes : 256);
    if (!o->dev_state) return PX_ERR_NOMEM; /* px_cuda_malloc's message says how many bytes */
    if (bytes && (st = px_cuda_to_device(o->dev_state, o->state, bytes)) != PX_OK) {
      px_cuda_free(o->dev_state);
      o->dev_state = NULL;
      return st;
    }
  }
  o->device = PX_CUDA;
  return PX_OK;
#else
  return px_error(PX_ERR_UNSUPPORTED, "%s: px_optim_to_device: plexus was built without CUDA", kind_name(o->opts.kind));
#endif
}

px_status px_optim_pull(px_optim *o) {
  if (!o) return px_error(PX_ERR_INVALID, "px_optim_pull: the optimizer is NULL");
  if (o->device != PX_CUDA || o->n_state == 0 || o->n == 0) return PX_OK;
#ifdef PX_HAVE_CUDA
  return px_cuda_to_host(o->state, o->dev_state, state_bytes(o));
#else
  return PX_OK;
#endif
}

px_status px_optim_push(px_optim *o) {
  if (!o) return px_error(PX_ERR_INVALID, "px_optim_push: the optimizer is NULL");
  if (o->device != PX_CUDA || o->n_state == 0 || o->n == 0) return PX_OK;
#ifdef PX_HAVE_CUDA
  return px_cuda_to_device(o->dev_state, o->state, state_bytes(o));
#else
  return PX_OK;
#endif
}

static px_status optim_step(px_optim *o, bool zero) {
  if (!o) return px_error(PX_ERR_INVALID, "optim: step on a NULL optimizer");
#ifdef PX_HAVE_CUDA
  if (o->device == PX_CUDA) {
    px_status st = device_step(o);
    for (int k = 0; zero && st == PX_OK && k < o->n_seg; k++)
      st = px_cuda_zero(o->seg[k].grads, o->seg[k].count * sizeof(float));
    if (st != PX_OK) return st;
    o->step++;
    return PX_OK;
  }
#endif
  px_threads_init();
  if (o->opts.kind == PX_OPTIM_SGD) sgd_step(o, zero);
  else adam_step(o, zero);
  o->step++;
  return PX_OK;
}

px_status px_optim_step(px_optim *o) { return optim_step(o, false); }

// The update's loop stores 0 over each gradient once it has read it: where
// the gradients would be zeroed before the next backward anyway, that
// saves zero_grad's pass over them (7.6 % of the MLP's step at batch 16;
// Adam's loop waits on its divisions, so the store costs nothing there:
// docs/PERFORMANCE.md).
px_status px_optim_step_zero_grads(px_optim *o) { return optim_step(o, true); }
