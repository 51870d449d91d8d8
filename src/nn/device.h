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
  return px_error(PX_ERR_INVALID,
                  "%s \"%s\": its input is on the GPU but the step runs on the host "
                  "(ctx->device); move the model to the GPU with px_model_to_device",
                  m->ops->type, m->n_params ? m->params[0].name : m->name);
}

// A GEMM operand: f32 as stored, or (ctx->compute_dtype PX_BF16) its bf16
// copy from the arena, made once and usable by several GEMMs.
typedef struct px_nn_operand {
  const float *f32;
  const uint16_t *bf16;
} px_nn_operand;

static inline px_status px_nn_cuda_operand(px_ctx *ctx, const float *x, size_t n, px_nn_operand *out) {
  out->f32 = x;
  out->bf16 = NULL;
  if (ctx->compute_dtype != PX_BF16) return PX_OK;
  uint16_t *p = (uint16_t *)px_arena_alloc(ctx->arena, (n ? n : 1) * sizeof(uint16_t));
  if (!p) return PX_ERR_NOMEM;
  out->bf16 = p;
  return px_cuda_to_bf16(p, x, n);
}

// The same for a (rows, cols) matrix whose bf16 copy gets rows padded to a
// multiple of 8 elements (*ld; cols when f32 or already a multiple): cuBLAS
// runs bf16 operands whose rows are not 16-byte aligned on its slow
// "align1" kernels (GPT-2's 50257-word head; docs/PERFORMANCE.md, "Figures
// behind code comments").
static inline px_status px_nn_cuda_operand_padded(px_ctx *ctx, const float *x, size_t rows, size_t cols,
                                                  px_nn_operand *out, int *ld) {
  *ld = (int)cols;
  if (ctx->compute_dtype != PX_BF16 || cols % 8 == 0) return px_nn_cuda_operand(ctx, x, rows * cols, out);
  const size_t lp = (cols + 7) / 8 * 8;
  out->f32 = x;
  out->bf16 = NULL;
  const size_t n = rows * lp;
  uint16_t *p = (uint16_t *)px_arena_alloc(ctx->arena, (n ? n : 1) * sizeof(uint16_t));
  if (!p) return PX_ERR_NOMEM;
  out->bf16 = p;
  *ld = (int)lp;
  return px_cuda_to_bf16_2d(p, lp, x, cols, rows, cols);
}

// C = op(A)·op(B) + beta·C through cuBLAS: f32, or bf16 operands with f32
// accumulation when both operands have their bf16 copy.
static inline px_status px_nn_cuda_gemm(bool ta, bool tb, int M, int N, int K, const px_nn_operand *A, int lda,
                                        const px_nn_operand *B, int ldb, float beta, float *C, int ldc) {
  if (M == 0 || N == 0) return PX_OK;
  if (K == 0)  // C = beta·C: nothing to add (beta 1) or zeros (beta 0, C dense: ldc == N)
    return beta == 0.0f ? px_cuda_zero(C, (size_t)M * (size_t)N * sizeof(float)) : PX_OK;
  if (A->bf16 && B->bf16) return px_cuda_gemm_bf16(ta, tb, M, N, K, 1.0f, A->bf16, lda, B->bf16, ldb, beta, C, ldc);
  return px_cuda_sgemm(ta, tb, M, N, K, 1.0f, A->f32, lda, B->f32, ldb, beta, C, ldc);
}
#endif

#endif
