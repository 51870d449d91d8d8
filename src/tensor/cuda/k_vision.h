/* tensor/cuda/k_vision.h — the CNN layers' CUDA kernels (internal).
 *
 * Launchers for nn/conv2d.c, nn/batchnorm.c, nn/pool.c and
 * nn/global_pool.c's device paths, defined in k_conv.cu, k_batchnorm.cu and
 * k_pool.cu.  Every pointer is device memory; every launcher runs on the
 * compute stream (px_cuda_compute_stream) and returns px_status after
 * checking the launch (px_cuda_check_launch).
 *
 * Determinism: no float atomics.  Every output element is written by one
 * thread that sums its contributions in a fixed order (col2im and the pools'
 * backward in gather form), and every per-channel reduction is one block
 * summing in double in a fixed order (each thread a strided run, then a
 * fixed tree), so two runs give the same bits. */
#ifndef PX_TENSOR_CUDA_K_VISION_H
#define PX_TENSOR_CUDA_K_VISION_H

#include "plexus/base.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Convolution (k_conv.cu), a chunk of nb samples at a time ----------
 * x (nb, C, H, W) -> col (K, nb·P), K = C·k·k, P = Ho·Wo, sample b's
 * columns at b·P:
 *   col[(c·k + i)·k + j, b·P + oh·Wo + ow] = x[b, c, oh·s - p + i, ow·s - p + j] (0 outside) */
px_status px_k_im2col(const float *x, float *col, int nb, int C, int H, int W, int k, int s, int p, int Ho, int Wo);
/* dx (nb, C, H, W) = col2im(dcol (K, nb·P)): every input pixel sums the taps
 * that read it, in the order (i, j) ascending; written, not added. */
px_status px_k_col2im(const float *dcol, float *dx, int nb, int C, int H, int W, int k, int s, int p, int Ho, int Wo);
/* y (nb, O, P) from z (O, nb·P): y[b, o, q] = z[o, b·P + q] + bias[o] (bias NULL: + 0). */
px_status px_k_conv_unpack(const float *z, const float *bias, float *y, int nb, int O, int64_t P);
/* zp (O, nb·P) from dy (nb, O, P): zp[o, b·P + q] = dy[b, o, q]. */
px_status px_k_conv_pack(const float *dy, float *zp, int nb, int O, int64_t P);
/* db[o] += (float) Σ_n Σ_q dy[n, o, q] (double sum). */
px_status px_k_bias_grad(const float *dy, float *db, int64_t N, int O, int64_t P);

/* ---- Batch norm (k_batchnorm.cu); x seen as (N, C, S) ------------------
 * Training (batch_stats): mean[c], istd[c] from the batch (double sums,
 * biased variance); when update_running, running_mean/var updated with
 * momentum (running var unbiased: n/(n - 1)).  Eval: mean = running_mean,
 * istd = 1/√(running_var + eps). */
px_status px_k_bn_stats(const float *x, int64_t N, int C, int64_t S, bool batch_stats, bool update_running, float eps,
                        float momentum, float *running_mean, float *running_var, float *mean, float *istd);
/* y = x·α + (β - μ·α), α = γ·istd. */
px_status px_k_bn_apply(const float *x, float *y, int64_t N, int C, int64_t S, const float *gamma, const float *beta,
                        const float *mean, const float *istd);
/* dγ += Σ dy·x̂, dβ += Σ dy; dx (when not NULL) with batch statistics or
 * with constants (eval).  coef: 3·C floats of scratch. */
px_status px_k_bn_backward(const float *x, const float *dy, float *dx, int64_t N, int C, int64_t S, bool batch_stats,
                           const float *gamma, const float *mean, const float *istd, float *dgamma, float *dbeta,
                           float *coef);

/* ---- Pooling (k_pool.cu); planes = N·C, each (H, W) -> (Ho, Wo) ---------
 * Max: first maximum in scan order wins, NaN wins (as the CPU);
 * argmax[q] = ih·W + iw within the plane. */
px_status px_k_maxpool_fwd(const float *x, float *y, int32_t *argmax, int64_t planes, int H, int W, int k, int s, int p,
                           int Ho, int Wo);
/* dx[a] = Σ dy over the outputs whose argmax is a, in output order. */
px_status px_k_maxpool_bwd(const float *dy, const int32_t *argmax, float *dx, int64_t planes, int H, int W, int k,
                           int s, int p, int Ho, int Wo);
/* Avg (no padding): sum in scan order, then / k². */
px_status px_k_avgpool_fwd(const float *x, float *y, int64_t planes, int H, int W, int k, int s, int Ho, int Wo);
px_status px_k_avgpool_bwd(const float *dy, float *dx, int64_t planes, int H, int W, int k, int s, int Ho, int Wo);
/* Global average pool: y[pl] = (float)(Σ x / S) (double sum); dx = dy[pl] / S. */
px_status px_k_gap_fwd(const float *x, float *y, int64_t planes, int64_t S);
px_status px_k_gap_bwd(const float *dy, float *dx, int64_t planes, int64_t S);

#ifdef __cplusplus
}
#endif
#endif
