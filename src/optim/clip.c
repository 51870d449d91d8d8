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
#ifdef PX_HAVE_CUDA
#include "tensor/cuda/px_cuda.h"
#endif

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

/* ---- On either device ------------------------------------------------------
 * The same arithmetic with the sum of squares and the scale on the device:
 * norm = (float)sqrt(Σ g²) on the host from px_cuda_sumsq's double, coef in
 * float as above, and only coef < 1 launches the scale. */

#ifndef PX_HAVE_CUDA
static px_status no_cuda(const char *what) {
  return px_error(PX_ERR_UNSUPPORTED, "%s: gradients on the GPU, but plexus was built without CUDA", what);
}
#endif

static px_status check_dev(px_device dev, const char *what) {
  if (dev != PX_CPU && dev != PX_CUDA)
    return px_error(PX_ERR_INVALID, "%s: device %d is neither PX_CPU nor PX_CUDA", what, (int)dev);
  return PX_OK;
}

px_status px_sumsq_on(px_device dev, const float *grads, size_t n, double *out) {
  px_status st = check_dev(dev, "px_sumsq_on");
  if (st != PX_OK) return st;
  if (!out) return px_error(PX_ERR_INVALID, "px_sumsq_on: out is NULL");
  *out = 0;
  if (n > 0 && !grads) return px_error(PX_ERR_INVALID, "px_sumsq_on: grads is NULL for %zu elements", n);
  if (dev == PX_CPU) {
    *out = px_sumsq(grads, n);
    return PX_OK;
  }
#ifdef PX_HAVE_CUDA
  return n ? px_cuda_sumsq(grads, n, out) : PX_OK;
#else
  return no_cuda("px_sumsq_on");
#endif
}

px_status px_clip_grad_scale_on(px_device dev, float *grads, size_t n, float norm, float max_norm) {
  px_status st = check_dev(dev, "px_clip_grad_scale_on");
  if (st != PX_OK) return st;
  if (n > 0 && !grads) return px_error(PX_ERR_INVALID, "px_clip_grad_scale_on: grads is NULL for %zu elements", n);
  if (dev == PX_CPU) {
    px_clip_grad_scale(grads, n, norm, max_norm);
    return PX_OK;
  }
#ifdef PX_HAVE_CUDA
  const float coef = max_norm / (norm + 1e-6f);
  if (!(coef >= 1.0f) && n > 0) return px_cuda_scale(grads, n, coef);
  return PX_OK;
#else
  return no_cuda("px_clip_grad_scale_on");
#endif
}

px_status px_clip_grad_norm_on(px_device dev, float *grads, size_t n, float max_norm, float *norm) {
  double ss = 0;
  px_status st = px_sumsq_on(dev, grads, n, &ss);
  if (st != PX_OK) return st;
  const float nrm = (float)sqrt(ss);
  if (norm) *norm = nrm;
  return px_clip_grad_scale_on(dev, grads, n, nrm, max_norm);
}
