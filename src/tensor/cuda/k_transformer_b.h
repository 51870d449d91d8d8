/* tensor/cuda/k_transformer_b.h — kernel launchers of the device path of
 * LayerNorm, the embeddings, the pointwise activations and the bias of
 * Linear / Conv1D (internal; CUDA builds only).
 *
 * Every launcher takes device pointers, runs on the compute stream
 * (px_cuda_compute_stream), checks the launch and returns a px_status.
 * No launcher uses atomics on floats: every sum is taken in a fixed order,
 * so a run repeated with the same inputs gives the same bits. */
#ifndef PX_TENSOR_CUDA_K_TRANSFORMER_B_H
#define PX_TENSOR_CUDA_K_TRANSFORMER_B_H

#include "plexus/base.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- LayerNorm over the last dimension (k_norm.cu) --------------------------
 * x, y: (R, D).  Forward writes mean[r], rstd[r] (row statistics in double,
 * as the CPU path).  Backward: dgamma[j] += Σ_r dy·x̂, dbeta[j] += Σ_r dy
 * (per-chunk partials in double, summed over chunks in order by a second
 * kernel; `partials` is scratch of px_k_layernorm_partials_bytes(R, D)
 * bytes), and dx (NULL: skipped). */
px_status px_k_layernorm_forward(const float *x, const float *gamma, const float *beta, float *y, float *mean,
                                 float *rstd, int64_t R, int D, float eps);
size_t px_k_layernorm_partials_bytes(int64_t R, int D);
px_status px_k_layernorm_backward(const float *x, const float *dy, const float *gamma, const float *mean,
                                  const float *rstd, float *dgamma, float *dbeta, float *dx, void *partials, int64_t R,
                                  int D);

/* ---- Columns of a (R, C) matrix (k_norm.cu) --------------------------------
 * dst[j] += Σ_r src[r, j] (the bias gradient of Linear and Conv1D), the same
 * two-stage fixed-order reduction; `partials` of px_k_colsum_partials_bytes. */
size_t px_k_colsum_partials_bytes(int64_t R, int C);
px_status px_k_colsum_add(float *dst, const float *src, void *partials, int64_t R, int C);
/* y[r, j] = b[j] for every row (the bias a GEMM with beta = 1 adds onto). */
px_status px_k_rows_set(float *y, const float *b, int64_t R, int C);

/* ---- Embeddings (k_embedding.cu) --------------------------------------------
 * Gather: y[p, :] = W[ids[p], :] for p in [0, R).  An id outside [0, V)
 * writes no row; the smallest such p is stored in *bad (a device uint64_t,
 * set to UINT64_MAX by the launcher first), so the caller copies one word
 * back and reports the first bad position as the CPU path does. */
px_status px_k_embedding_forward(const int32_t *ids, const float *W, float *y, uint64_t *bad, int64_t R, int V, int C);
/* Scatter-add in position order: for segment s (positions pos[seg_start[s]
 * .. seg_start[s+1]), all with id seg_id[s], in increasing order)
 * dW[seg_id[s], c] += dy[p, c] for each p in turn, one thread per (s, c):
 * the same additions in the same order as the CPU path, so the same bits. */
px_status px_k_embedding_backward(const int32_t *seg_id, const int32_t *seg_start, const int32_t *pos, int n_seg,
                                  const float *dy, float *dW, int C);
/* y[n, t, :] = x[n, t, :] + W[t, :]  (W already offset to the first position). */
px_status px_k_pos_embedding_forward(const float *x, const float *W, float *y, int64_t N, int64_t T, int C);
/* dW[t, c] += Σ_n dy[n, t, c], n in order, one thread per (t, c). */
px_status px_k_pos_embedding_backward(const float *dy, float *dW, int64_t N, int64_t T, int C);

/* ---- Pointwise activations (k_activation.cu) ------------------------------
 * kind: the act_kind of src/nn/activation.c (0 ReLU, 1 Tanh, 2 Sigmoid,
 * 3 GELU (erf), 4 GELU (tanh approximation)).  Backward reads `saved`: x for
 * ReLU and the GELUs, y for Tanh and Sigmoid. */
enum { PX_K_RELU = 0, PX_K_TANH, PX_K_SIGMOID, PX_K_GELU, PX_K_GELU_TANH };
px_status px_k_activation_forward(int kind, const float *x, float *y, size_t n);
px_status px_k_activation_backward(int kind, const float *saved, const float *dy, float *dx, size_t n);

#ifdef __cplusplus
}
#endif
#endif
