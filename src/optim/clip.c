// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_
// (PyTorch 1.13, norm_type 2, error_if_nonfinite False):
//   norm = ‖grads‖₂                      (sum of squares accumulated in double)
//   coef = max_norm / (norm + 1e-6)      (float32, as torch computes it)
//   grads ·= min(coef, 1)
// Multiplying by 1 changes nothing, so only coef < 1 touches the buffer.  A
// NaN or infinite norm gives coef NaN or 0 and, as in torch, NaN or zero
// gradients: the step that follows is visibly broken rather than silently
// skipped.
#include "plexus/optim.h"

#include <math.h>

void px_clip_grad_scale(float *grads, size_t n, float norm, float max_norm) {
  const float coef = max_norm / (norm + 1e-6f);
  if (!(coef >= 1.0f)) px_scale(grads, n, coef);
}

float px_clip_grad_norm(float *grads, size_t n, float max_norm) {
  const float norm = (float)sqrt(px_sumsq(grads, n));
  px_clip_grad_scale(grads, n, norm, max_norm);
  return norm;
}
