// Pointwise activations.  Each saves what its derivative needs:
//   relu:    y = max(x, 0)                 dx = dy · [x > 0]
//   tanh:    y = tanh(x)                   dx = dy · (1 - y²)
//   sigmoid: y = 1 / (1 + e^-x)            dx = dy · y (1 - y)
//   gelu:    y = x Φ(x)                    dx = dy · (Φ(x) + x φ(x))
//   gelu≈:   y = ½x(1 + tanh(u)), u = √(2/π)(x + 0.044715 x³)
//            dx = dy · (½(1 + t) + ½x(1 - t²) u'),  u' = √(2/π)(1 + 3·0.044715 x²)
//
// On the GPU (input with device PX_CUDA): src/tensor/cuda/k_activation.cu,
// the same formulas.
#include "plexus/nn.h"
#include "nn/device.h"
#include "nn/internal.h"
#include "tensor/internal.h"

#include <math.h>

typedef enum act_kind { ACT_RELU, ACT_TANH, ACT_SIGMOID, ACT_GELU, ACT_GELU_TANH } act_kind;

typedef struct act {
  px_module base;
  act_kind kind;
  px_tensor saved; /* x (relu, gelu) or y (tanh, sigmoid) */
  bool input_relu; /* relu: the next input is already max(·, 0) (a fused BatchNorm's output; chain.c) */
  bool passed;     /* relu: the last forward passed its input through */
  bool input_kept; /* relu: the next input is already max(·, 0) (a fused Residual's): pass it, keep it as saved;
                      tanh: the next input is already tanh(·) (a fused Linear's) */
  bool dy_is_dx;   /* tanh: the next backward's dy already went through it (a fused Linear's): pass it */
} act;

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_C 0.044715f
#define INV_SQRT_2 0.7071067811865476f

#ifdef PX_HAVE_CUDA
// act_kind and the kernels' kinds are one list.
_Static_assert((int)ACT_RELU == (int)PX_K_RELU && (int)ACT_TANH == (int)PX_K_TANH &&
                 (int)ACT_SIGMOID == (int)PX_K_SIGMOID && (int)ACT_GELU == (int)PX_K_GELU &&
                 (int)ACT_GELU_TANH == (int)PX_K_GELU_TANH,
               "activation kinds");

static px_status act_forward_cuda(act *a, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_status st = px_nn_cuda_ctx(ctx, &a->base);
  if (st == PX_OK) st = px_ctx_tensor_like(ctx, y, x);
  if (st == PX_OK) st = px_k_activation_forward((int)a->kind, px_f32(x), px_f32(y), (size_t)px_tensor_numel(x));
  if (st != PX_OK) return st;
  a->saved = (a->kind == ACT_TANH || a->kind == ACT_SIGMOID) ? *y : *x;
  return PX_OK;
}

static px_status act_backward_cuda(act *a, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  px_status st = px_nn_cuda_ctx(ctx, &a->base);
  if (st == PX_OK) st = px_ctx_tensor_like(ctx, dx, dy);
  if (st != PX_OK) return st;
  return px_k_activation_backward((int)a->kind, px_f32(&a->saved), px_f32(dy), px_f32(dx), (size_t)px_tensor_numel(dy));
}
#endif

PX_KERNEL static px_status act_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  act *a = (act *)m;
  a->passed = a->input_relu;  // max(max(v, 0), 0) = max(v, 0): y is x itself
  a->input_relu = false;
  if (a->passed) {
    *y = *x;
    return PX_OK;
  }
  if (a->input_kept) {  // the backward's mask [x > 0] of max(v, 0) is [v > 0]
    a->input_kept = false;
    *y = *x;
    a->saved = *x;
    return PX_OK;
  }
#ifdef PX_HAVE_CUDA
  if (x->device == PX_CUDA) return act_forward_cuda(a, ctx, x, y);
#endif
  px_status st = px_ctx_tensor_like(ctx, y, x);
  if (st != PX_OK) return st;
  const size_t n = (size_t)px_tensor_numel(x);
  const float *restrict X = px_f32(x);
  float *restrict Y = px_f32(y);
  switch (a->kind) {
  case ACT_RELU:
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) Y[i] = X[i] > 0.0f ? X[i] : 0.0f;
    a->saved = *x;
    break;
  case ACT_TANH:
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) Y[i] = px_tanhf(X[i]);
    a->saved = *y;
    break;
  case ACT_SIGMOID:
#pragma omp parallel for if (PX_PAR(n))
    for (size_t i = 0; i < n; i++) Y[i] = 1.0f / (1.0f + expf(-X[i]));
    a->saved = *y;
    break;
  case ACT_GELU:
#pragma omp parallel for if (PX_PAR(n))
    for (size_t i = 0; i < n; i++) Y[i] = 0.5f * X[i] * (1.0f + erff(X[i] * INV_SQRT_2));
    a->saved = *x;
    break;
  case ACT_GELU_TANH:
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) {
      float v = X[i];
      Y[i] = 0.5f * v * (1.0f + px_tanhf(SQRT_2_OVER_PI * (v + GELU_C * v * v * v)));
    }
    a->saved = *x;
    break;
  }
  return PX_OK;
}

PX_KERNEL static px_status act_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  act *a = (act *)m;
  const bool dy_is_dx = a->dy_is_dx;
  a->dy_is_dx = false;
  if (!dx) return PX_OK;
  if (a->passed || dy_is_dx) {  // the fused BatchNorm before it masks dy with [y > 0] itself, the Linear after it
                                // multiplied dy by 1 - y²
    *dx = *dy;
    return PX_OK;
  }
#ifdef PX_HAVE_CUDA
  if (dy->device == PX_CUDA) return act_backward_cuda(a, ctx, dy, dx);
#endif
  px_status st = px_ctx_tensor_like(ctx, dx, dy);
  if (st != PX_OK) return st;
  const size_t n = (size_t)px_tensor_numel(dy);
  const float *restrict S = px_f32(&a->saved), *restrict DY = px_f32(dy);
  float *restrict DX = px_f32(dx);
  switch (a->kind) {
  case ACT_RELU:
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) DX[i] = S[i] > 0.0f ? DY[i] : 0.0f;
    break;
  case ACT_TANH:
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) DX[i] = DY[i] * (1.0f - S[i] * S[i]);
    break;
  case ACT_SIGMOID:
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) DX[i] = DY[i] * S[i] * (1.0f - S[i]);
    break;
  case ACT_GELU:
#pragma omp parallel for if (PX_PAR(n))
    for (size_t i = 0; i < n; i++) {
      float v = S[i];
      float cdf = 0.5f * (1.0f + erff(v * INV_SQRT_2));
      float pdf = 0.3989422804014327f * expf(-0.5f * v * v);
      DX[i] = DY[i] * (cdf + v * pdf);
    }
    break;
  case ACT_GELU_TANH:
#pragma omp parallel for simd if (parallel : PX_PAR(n))
    for (size_t i = 0; i < n; i++) {
      float v = S[i];
      float t = px_tanhf(SQRT_2_OVER_PI * (v + GELU_C * v * v * v));
      float du = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * v * v);
      DX[i] = DY[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
    break;
  }
  return PX_OK;
}

static const px_module_ops relu_ops = {.type = "ReLU", .forward = act_forward, .backward = act_backward};
static const px_module_ops tanh_ops = {.type = "Tanh", .forward = act_forward, .backward = act_backward};
static const px_module_ops sigmoid_ops = {.type = "Sigmoid", .forward = act_forward, .backward = act_backward};
static const px_module_ops gelu_ops = {.type = "GELU", .forward = act_forward, .backward = act_backward};

static px_module *act_new(const px_module_ops *ops, act_kind kind) {
  act *a = (act *)px_module_alloc(sizeof *a, ops);
  if (a) a->kind = kind;
  return a ? &a->base : NULL;
}

px_module *px_relu(void) { return act_new(&relu_ops, ACT_RELU); }

bool px_is_relu(const px_module *m) { return m && m->ops == &relu_ops; }

void px_relu_input_is_relu(px_module *m) { ((act *)m)->input_relu = true; }
void px_relu_input_is_relu_kept(px_module *m) { ((act *)m)->input_kept = true; }
px_module *px_tanh(void) { return act_new(&tanh_ops, ACT_TANH); }
bool px_is_tanh(const px_module *m) { return m && m->ops == &tanh_ops; }
void px_tanh_input_is_tanh(px_module *m) { ((act *)m)->input_kept = true; }
void px_tanh_dy_is_dx(px_module *m) { ((act *)m)->dy_is_dx = true; }
px_module *px_sigmoid(void) { return act_new(&sigmoid_ops, ACT_SIGMOID); }
px_module *px_gelu(bool tanh_approx) { return act_new(&gelu_ops, tanh_approx ? ACT_GELU_TANH : ACT_GELU); }
