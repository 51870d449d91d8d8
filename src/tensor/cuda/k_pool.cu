// tensor/cuda/k_pool.cu — MaxPool2d, AvgPool2d and global average pooling
// on the device, the arithmetic of nn/pool.c and nn/global_pool.c: the same
// scan order and tie rule for max, the same summation order for avg, and
// backward in gather form (each input pixel sums what reaches it, in the
// order the CPU's scatter adds it), so the results are the CPU's bits.
#include "tensor/cuda/k_vision.h"
#include "tensor/cuda/k_reduce.cuh"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>

static cudaStream_t stream(void) { return (cudaStream_t)px_cuda_compute_stream(); }

#define GRID_LOOP(e, total)                                                         \
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < (total); \
       e += (long long)gridDim.x * blockDim.x)

// One thread per output.  The window clipped to the plane; its first pixel
// inside starts the scan; a later tap replaces when strictly greater or NaN.
static __global__ void maxpool_fwd_kernel(const float *__restrict__ x, float *__restrict__ y,
                                          int32_t *__restrict__ argmax, long long planes, int H, int W, int k, int s,
                                          int p, int Ho, int Wo) {
  const long long out_plane = (long long)Ho * Wo, total = planes * out_plane;
  GRID_LOOP(e, total) {
    const long long pl = e / out_plane;
    const int q = (int)(e - pl * out_plane), oh = q / Wo, ow = q - oh * Wo;
    const float *xp = x + pl * (long long)H * W;
    const int h0 = oh * s - p, w0 = ow * s - p;
    const int i_lo = h0 < 0 ? -h0 : 0, i_hi = h0 + k > H ? H - h0 : k;
    const int j_lo = w0 < 0 ? -w0 : 0, j_hi = w0 + k > W ? W - w0 : k;
    int32_t at = (h0 + i_lo) * W + (w0 + j_lo);
    float best = xp[at];
    for (int i = i_lo; i < i_hi; i++)
      for (int j = j_lo; j < j_hi; j++) {
        const int32_t idx = (h0 + i) * W + (w0 + j);
        const float v = xp[idx];
        if (v > best || v != v) {
          best = v;
          at = idx;
        }
      }
    y[e] = best;
    argmax[e] = at;
  }
}

// One thread per input pixel: Σ dy over the outputs whose window holds it
// and whose argmax it is, in output order (the CPU's q loop).
static __global__ void maxpool_bwd_kernel(const float *__restrict__ dy, const int32_t *__restrict__ argmax,
                                          float *__restrict__ dx, long long planes, int H, int W, int k, int s, int p,
                                          int Ho, int Wo) {
  const long long in_plane = (long long)H * W, out_plane = (long long)Ho * Wo, total = planes * in_plane;
  GRID_LOOP(e, total) {
    const long long pl = e / in_plane;
    const int a = (int)(e - pl * in_plane), ih = a / W, iw = a - ih * W;
    const int th = ih + p - k + 1, tw = iw + p - k + 1;
    const int oh_lo = th <= 0 ? 0 : (th + s - 1) / s, ow_lo = tw <= 0 ? 0 : (tw + s - 1) / s;
    const int oh_hi = min(Ho - 1, (ih + p) / s), ow_hi = min(Wo - 1, (iw + p) / s);
    const float *dyp = dy + pl * out_plane;
    const int32_t *ap = argmax + pl * out_plane;
    float sum = 0.0f;
    for (int oh = oh_lo; oh <= oh_hi; oh++)
      for (int ow = ow_lo; ow <= ow_hi; ow++)
        if (ap[oh * Wo + ow] == a) sum += dyp[oh * Wo + ow];
    dx[e] = sum;
  }
}

static __global__ void avgpool_fwd_kernel(const float *__restrict__ x, float *__restrict__ y, long long planes, int H,
                                          int W, int k, int s, int Ho, int Wo) {
  const long long out_plane = (long long)Ho * Wo, total = planes * out_plane;
  const float area = (float)(k * k);
  GRID_LOOP(e, total) {
    const long long pl = e / out_plane;
    const int q = (int)(e - pl * out_plane), oh = q / Wo, ow = q - oh * Wo;
    const float *xp = x + pl * (long long)H * W + (long long)oh * s * W + ow * s;
    float sum = 0.0f;
    for (int i = 0; i < k; i++)
      for (int j = 0; j < k; j++) sum += xp[i * W + j];
    y[e] = sum / area;
  }
}

// The CPU adds, for each output row oh (ascending), the taps (i, j) in
// order; for one input pixel and one oh the tap j ascending means ow
// descending.  The same order here.
static __global__ void avgpool_bwd_kernel(const float *__restrict__ dy, float *__restrict__ dx, long long planes, int H,
                                          int W, int k, int s, int Ho, int Wo) {
  const long long in_plane = (long long)H * W, out_plane = (long long)Ho * Wo, total = planes * in_plane;
  const float area = (float)(k * k);
  GRID_LOOP(e, total) {
    const long long pl = e / in_plane;
    const int a = (int)(e - pl * in_plane), ih = a / W, iw = a - ih * W;
    const int th = ih - k + 1, tw = iw - k + 1;
    const int oh_lo = th <= 0 ? 0 : (th + s - 1) / s, ow_lo = tw <= 0 ? 0 : (tw + s - 1) / s;
    const int oh_hi = min(Ho - 1, ih / s), ow_hi = min(Wo - 1, iw / s);
    const float *dyp = dy + pl * out_plane;
    float sum = 0.0f;
    for (int oh = oh_lo; oh <= oh_hi; oh++)
      for (int ow = ow_hi; ow >= ow_lo; ow--) sum += dyp[oh * Wo + ow] / area;
    dx[e] = sum;
  }
}

// One block per plane: Σ x in double, divided by S once.
static __global__ void gap_fwd_kernel(const float *__restrict__ x, float *__restrict__ y, long long S) {
  __shared__ double buf[PX_K_RED_THREADS];
  const long long pl = blockIdx.x;
  const float *xp = x + pl * S;
  double acc = 0.0;
  for (long long q = threadIdx.x; q < S; q += PX_K_RED_THREADS) acc += xp[q];
  const double sum = px_k_block_sum(acc, buf);
  if (threadIdx.x == 0) y[pl] = (float)(sum / (double)S);
}

static __global__ void gap_bwd_kernel(const float *__restrict__ dy, float *__restrict__ dx, long long planes,
                                      long long S) {
  GRID_LOOP(e, planes * S) dx[e] = dy[e / S] / (float)S;
}

extern "C" px_status px_k_maxpool_fwd(const float *x, float *y, int32_t *argmax, int64_t planes, int H, int W, int k,
                                      int s, int p, int Ho, int Wo) {
  maxpool_fwd_kernel<<<px_k_blocks((long long)planes * Ho * Wo), 256, 0, stream()>>>(x, y, argmax, planes, H, W, k, s,
                                                                                     p, Ho, Wo);
  return px_cuda_check_launch("MaxPool2d forward");
}

extern "C" px_status px_k_maxpool_bwd(const float *dy, const int32_t *argmax, float *dx, int64_t planes, int H, int W,
                                      int k, int s, int p, int Ho, int Wo) {
  maxpool_bwd_kernel<<<px_k_blocks((long long)planes * H * W), 256, 0, stream()>>>(dy, argmax, dx, planes, H, W, k, s,
                                                                                   p, Ho, Wo);
  return px_cuda_check_launch("MaxPool2d backward");
}

extern "C" px_status px_k_avgpool_fwd(const float *x, float *y, int64_t planes, int H, int W, int k, int s, int Ho,
                                      int Wo) {
  avgpool_fwd_kernel<<<px_k_blocks((long long)planes * Ho * Wo), 256, 0, stream()>>>(x, y, planes, H, W, k, s, Ho, Wo);
  return px_cuda_check_launch("AvgPool2d forward");
}

extern "C" px_status px_k_avgpool_bwd(const float *dy, float *dx, int64_t planes, int H, int W, int k, int s, int Ho,
                                      int Wo) {
  avgpool_bwd_kernel<<<px_k_blocks((long long)planes * H * W), 256, 0, stream()>>>(dy, dx, planes, H, W, k, s, Ho, Wo);
  return px_cuda_check_launch("AvgPool2d backward");
}

extern "C" px_status px_k_gap_fwd(const float *x, float *y, int64_t planes, int64_t S) {
  if (planes > 2147483647LL)
    return px_error(PX_ERR_SHAPE, "GlobalAvgPool2d: %lld planes exceed one grid", (long long)planes);
  gap_fwd_kernel<<<(unsigned)planes, PX_K_RED_THREADS, 0, stream()>>>(x, y, S);
  return px_cuda_check_launch("GlobalAvgPool2d forward");
}

extern "C" px_status px_k_gap_bwd(const float *dy, float *dx, int64_t planes, int64_t S) {
  gap_bwd_kernel<<<px_k_blocks((long long)planes * S), 256, 0, stream()>>>(dy, dx, planes, S);
  return px_cuda_check_launch("GlobalAvgPool2d backward");
}
