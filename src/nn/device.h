// The device path of nn/ layers (CUDA builds): what a layer's *_cuda
// variant checks before it launches kernels.  Internal.
#ifndef PX_NN_DEVICE_H
#define PX_NN_DEVICE_H

#include "plexus/nn.h"

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_transformer_b.h"
#include "tensor/cuda/px_cuda.h"

// A layer whose input is on the GPU needs the step's arena there too (its
// output and saved tensors come from it).
static inline px_status px_nn_cuda_ctx(const px_ctx *ctx, const px_module *m) {
  if (ctx->device == PX_CUDA) return PX_OK;
  return px_error(PX_ERR_INVALID, "%s \"%s\": its input is on the GPU but the step runs on the host "
                  "(ctx->device); move the model to the GPU with px_model_to_device",
                  m->ops->type, m->n_params ? m->params[0].name : m->name);
}

// n bf16 copies of x from the arena (the GEMM operands of compute_dtype PX_BF16).
static inline px_status px_nn_cuda_bf16(px_ctx *ctx, const float *x, size_t n, const uint16_t **out) {
  uint16_t *p = (uint16_t *)px_arena_alloc(ctx->arena, (n ? n : 1) * sizeof(uint16_t));
  if (!p) return PX_ERR_NOMEM;
  *out = p;
  return px_cuda_to_bf16(p, x, n);
}

// C = alpha·op(A)·op(B) + beta·C through cuBLAS, f32 or (ctx->compute_dtype
// PX_BF16) with A and B cast to bf16 first.
static inline px_status px_nn_cuda_gemm(px_ctx *ctx, bool ta, bool tb, int M, int N, int K, const float *A,
                                        int lda, size_t a_numel, const float *B, int ldb, size_t b_numel,
                                        float beta, float *C, int ldc) {
  if (M == 0 || N == 0) return PX_OK;
  if (K == 0)  // C = beta·C: nothing to add (beta 1) or zeros (beta 0, C dense: ldc == N)
    return beta == 0.0f ? px_cuda_zero(C, (size_t)M * (size_t)N * sizeof(float)) : PX_OK;
  if (ctx->compute_dtype != PX_BF16) return px_cuda_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  const uint16_t *a16, *b16;
  px_status st = px_nn_cuda_bf16(ctx, A, a_numel, &a16);
  if (st == PX_OK) st = px_nn_cuda_bf16(ctx, B, b_numel, &b16);
  if (st != PX_OK) return st;
  return px_cuda_gemm_bf16(ta, tb, M, N, K, 1.0f, a16, lda, b16, ldb, beta, C, ldc);
}
#endif

#endif
