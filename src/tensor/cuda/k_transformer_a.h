/* tensor/cuda/k_transformer_a.h — CUDA launchers for attention, softmax,
 * cross-entropy and dropout (internal; defined in k_attention.cu,
 * k_softmax_loss.cu, k_dropout.cu).
 *
 * Every pointer is device memory unless said otherwise; every launcher runs
 * on the compute stream (px_cuda_compute_stream), checks its launch and
 * returns a px_status.  Only the cross-entropy launcher waits for the stream
 * (it returns the mean loss to the host). */
#ifndef PX_TENSOR_CUDA_K_TRANSFORMER_A_H
#define PX_TENSOR_CUDA_K_TRANSFORMER_A_H

#include "plexus/base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head width the attention kernels take. */
#define PX_CUDA_ATT_MAX_D 128

/* Dropout of attention probabilities, as attention.c's mask_row: element
 * (i, j) of local head h keeps when unit(Philox(seed, hi, e/4)[e%4]) >= p,
 * hi = (stream << 40) ^ step, e = ((n·heads_total + head0 + h)·T + i)·T + j.
 * p = 0 (or drop false) means no dropout. */
typedef struct px_cuda_att_drop {
  bool drop;
  float p;
  uint64_t seed, hi;
  int head0, heads_total;
} px_cuda_att_drop;

/* Causal attention forward.  qkv (N, T, 3C) packed [q | k | v], H heads of
 * width d = C/H <= 128; writes o (N, T, C) (heads merged) and lse (N, H, T)
 * = log Σ_{j<=i} e^{S_ij}, S = q·kᵀ/√d (before dropout).  Tiled kernels by
 * default; PX_CUDA_ATTENTION=rowwise in the environment selects the simpler
 * per-row kernels (each warp reads its keys itself) for both passes.
 * bf16: the step computes in bf16 (px_ctx.compute_dtype): q, k, v (and in
 * backward dO) are rounded to bf16 and every product runs on the tensor
 * cores with f32 accumulation, for head widths 16, 32, 64 and 128 (others,
 * and rows not 16-byte aligned, take the f32 kernels); lse and the softmax
 * stay f32.  The backward must be given the forward's bf16. */
px_status px_cuda_attention_forward(const float *qkv, float *o, float *lse, int N, int T, int C, int H,
                                    const px_cuda_att_drop *drop, bool bf16);
/* Backward from qkv, o, lse and dout (N, T, C): writes dqkv (N, T, 3C)
 * entirely.  scratch: N·H·T floats (the row terms D_i = dO_i·O_i). */
px_status px_cuda_attention_backward(const float *qkv, const float *o, const float *lse, const float *dout, float *dqkv,
                                     float *scratch, int N, int T, int C, int H, const px_cuda_att_drop *drop,
                                     bool bf16);

/* Softmax over the last dimension of (R, D): forward y, backward dx from y, dy. */
px_status px_cuda_softmax_forward(const float *x, float *y, size_t R, size_t D);
px_status px_cuda_softmax_backward(const float *y, const float *dy, float *dx, size_t R, size_t D);

/* Cross-entropy of logits (N, C) against targets (N,) (device int32), as
 * px_cross_entropy_loss: mean over rows whose target is not ignore_index;
 * dlogits (device, may be NULL, may alias logits) gets ∂L/∂logits.  *loss
 * is a host float; waits for the stream once.  A target outside [0, C)
 * that is not ignore_index is PX_ERR_INVALID (dlogits is then unspecified). */
px_status px_cuda_cross_entropy(const float *logits, const int32_t *targets, int64_t N, int C, int ignore_index,
                                float label_smoothing, float *loss, float *dlogits);

/* Dropout: out = in ⊙ mask/(1-p) with mask_i = unit(Philox(seed, hi, i/4)[i%4]) >= p
 * (dropout.c's apply_mask).  in may equal out. */
px_status px_cuda_dropout(const float *in, float *out, size_t n, float p, uint64_t seed, uint64_t hi);
/* The same for part `part` of `parts` along axis 1 (dropout.c's
 * apply_mask_part): in (N, Tl, inner), element (n, t, j) draws the whole's
 * index ((n·parts + part)·Tl + t)·inner + j. */
px_status px_cuda_dropout_part(const float *in, float *out, int64_t N, int64_t Tl, size_t inner, int part, int parts,
                               float p, uint64_t seed, uint64_t hi);

/* Host-side run of rng.cuh's device Philox (the same __host__ __device__
 * code the kernels use): the word and unit float of flat element e. */
void px_cuda_philox_port_check(uint64_t seed, uint64_t hi, uint64_t e, uint32_t *word, float *unit);

#ifdef __cplusplus
}
#endif
#endif
