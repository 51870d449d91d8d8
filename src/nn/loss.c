// Losses: value and input gradient in one pass (as llm.c fuses them).
#include "plexus/nn.h"
#include "tensor/internal.h"

#include <math.h>
#include <stdio.h>

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_transformer_a.h"
#endif

// L = (1/n) Σ (p - t)²        ∂L/∂p = 2 (p - t) / n
PX_KERNEL px_status px_mse_loss(const px_tensor *pred, const px_tensor *target, float *loss, float *dpred) {
  if (!px_tensor_same_shape(pred, target)) {
    char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "mse_loss: prediction %s and target %s differ in shape",
                    px_shape_str(pred->ndim, pred->shape, a, sizeof a),
                    px_shape_str(target->ndim, target->shape, b, sizeof b));
  }
  if (pred->device == PX_CUDA || target->device == PX_CUDA)
    return px_error(PX_ERR_UNSUPPORTED, "mse_loss: runs on the CPU only (copy the tensors to the host)");
  const size_t n = (size_t)px_tensor_numel(pred);
  if (n == 0) return px_error(PX_ERR_SHAPE, "mse_loss: empty input");
  const float *P = px_f32(pred), *T = px_f32(target);
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)P[i] - T[i];
    s += d * d;
  }
  *loss = (float)(s / (double)n);
  if (dpred) {
    const float k = 2.0f / (float)n;
    for (size_t i = 0; i < n; i++) dpred[i] = k * (P[i] - T[i]);
  }
  return PX_OK;
}

// Per row with p = softmax(z), C classes, smoothing ε, target t:
//   ℓ = -(1-ε) log p_t - (ε/C) Σ_j log p_j
//   ∂ℓ/∂z_j = p_j - (1-ε)[j = t] - ε/C
// L = mean of ℓ over rows whose target is not ignore_index.
//
// One row in two passes over its C logits: max, then e_j = exp(z_j - max)
// (px_expf, vectorized) summed in double and, when the gradient is wanted,
// stored in dz; then dz is scaled in place.  Rows run in parallel; their
// losses are summed in a fixed order (CE_CHUNKS chunks whose bounds depend
// on N only), so the loss is the same for any thread count.  dlogits may be
// the logits' own memory (every z_j is read before dz_j is written).
#define CE_CHUNKS 64

PX_KERNEL static double ce_row(const float *z, float *dz, int C, int32_t t, float eps, float inv_valid) {
  float zmax = z[0];
#pragma omp simd reduction(max : zmax)
  for (int j = 0; j < C; j++) zmax = z[j] > zmax ? z[j] : zmax;
  const float zt = z[t];
  double se = 0, sz = 0;
  if (eps != 0.0f) {
#pragma omp simd reduction(+ : sz)
    for (int j = 0; j < C; j++) sz += z[j];
  }
  if (dz) {
#pragma omp simd reduction(+ : se)
    for (int j = 0; j < C; j++) {
      const float e = px_expf(z[j] - zmax);
      dz[j] = e;
      se += e;
    }
    // dz_j = (p_j - ε/C - (1-ε)[j = t]) / valid
    const float a = (float)(1.0 / se) * inv_valid, b = eps / (float)C * inv_valid;
#pragma omp simd
    for (int j = 0; j < C; j++) dz[j] = dz[j] * a - b;
    dz[t] -= (1.0f - eps) * inv_valid;
  } else {
#pragma omp simd reduction(+ : se)
    for (int j = 0; j < C; j++) se += px_expf(z[j] - zmax);
  }
  const double lse = zmax + log(se);  // log Σ e^z
  const double nll = lse - zt;
  const double smooth = lse - sz / C;  // -(1/C) Σ log p_j
  return (1.0 - eps) * nll + eps * smooth;
}

px_status px_cross_entropy_loss(const px_tensor *logits, const int32_t *targets, const px_ce_opts *opts, float *loss,
                                float *dlogits) {
  px_ce_opts o = opts ? *opts : PX_CE_DEFAULTS;
  if (logits->ndim < 1) return px_error(PX_ERR_SHAPE, "cross_entropy: logits need a class dimension");
  const int C = (int)logits->shape[logits->ndim - 1];
  const int64_t N = C ? px_tensor_numel(logits) / C : 0;
  if (C <= 0 || N <= 0) return px_error(PX_ERR_SHAPE, "cross_entropy: empty logits");
  if (o.label_smoothing < 0.0f || o.label_smoothing > 1.0f)
    return px_error(PX_ERR_INVALID, "cross_entropy: label_smoothing %g outside [0, 1]", (double)o.label_smoothing);
  if (logits->device == PX_CUDA) {
    // targets and dlogits are device memory, *loss a host float (nn.h).
#ifdef PX_HAVE_CUDA
    return px_cuda_cross_entropy(px_f32(logits), targets, N, C, o.ignore_index, o.label_smoothing, loss, dlogits);
#else
    return px_error(PX_ERR_UNSUPPORTED, "cross_entropy: logits on the GPU, but plexus was built without CUDA");
#endif
  }
  int64_t valid = 0;
  for (int64_t r = 0; r < N; r++) {
    if (targets[r] == o.ignore_index) continue;
    if (targets[r] < 0 || targets[r] >= C)
      return px_error(PX_ERR_INVALID, "cross_entropy: target %d of row %lld is not a class in [0, %d)", targets[r],
                      (long long)r, C);
    valid++;
  }
  const float eps = o.label_smoothing;
  const float inv_valid = valid ? 1.0f / (float)valid : 0.0f;
  const float *Z = px_f32(logits);
  const int chunks = N < CE_CHUNKS ? (int)N : CE_CHUNKS;
  double partial[CE_CHUNKS];
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)N * (size_t)C))
  for (int k = 0; k < chunks; k++) {
    const int64_t r0 = N * k / chunks, r1 = N * (k + 1) / chunks;
    double sum = 0;
    for (int64_t r = r0; r < r1; r++) {
      float *dz = dlogits ? dlogits + r * C : NULL;
      if (targets[r] == o.ignore_index) {
        if (dz)
          for (int j = 0; j < C; j++) dz[j] = 0.0f;
        continue;
      }
      sum += ce_row(Z + r * C, dz, C, targets[r], eps, inv_valid);
    }
    partial[k] = sum;
  }
  double total = 0;
  for (int k = 0; k < chunks; k++) total += partial[k];
  *loss = valid ? (float)(total / (double)valid) : 0.0f;
  return PX_OK;
}
