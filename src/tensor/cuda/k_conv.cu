// tensor/cuda/k_conv.cu — Conv2d's device kernels (im2col, gather col2im,
// bias fill and bias gradient); the GEMMs between them are cuBLAS calls in
// nn/conv2d.c (px_cuda_sgemm / px_cuda_gemm_bf16).  Layouts: k_vision.h.
#include "tensor/cuda/k_vision.h"
#include "tensor/cuda/k_reduce.cuh"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>

static cudaStream_t stream(void) { return (cudaStream_t)px_cuda_compute_stream(); }

// One thread per col element (K·P of them).
static __global__ void im2col_kernel(const float *__restrict__ x, float *__restrict__ col, int C, int H, int W,
                                     int k, int s, int p, int Ho, int Wo) {
  const long long P = (long long)Ho * Wo, total = (long long)C * k * k * P;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const long long row = e / P;
    const int q = (int)(e - row * P);
    const int j = (int)(row % k), i = (int)((row / k) % k), c = (int)(row / ((long long)k * k));
    const int oh = q / Wo, ow = q - oh * Wo;
    const int ih = oh * s - p + i, iw = ow * s - p + j;
    col[e] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((long long)c * H + ih) * W + iw] : 0.0f;
  }
}

// One thread per input pixel (c, ih, iw): the taps (i, j) that read it are
// those with oh·s = ih + p - i and ow·s = iw + p - j inside the output;
// summed in (i, j) order, the CPU's col2im order for one pixel.
static __global__ void col2im_kernel(const float *__restrict__ dcol, float *__restrict__ dx, int C, int H, int W,
                                     int k, int s, int p, int Ho, int Wo) {
  const long long P = (long long)Ho * Wo, total = (long long)C * H * W;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const int iw = (int)(e % W), ih = (int)((e / W) % H), c = (int)(e / ((long long)H * W));
    float sum = 0.0f;
    for (int i = 0; i < k; i++) {
      const int th = ih + p - i;
      if (th < 0 || th % s != 0) continue;
      const int oh = th / s;
      if (oh >= Ho) continue;
      for (int j = 0; j < k; j++) {
        const int tw = iw + p - j;
        if (tw < 0 || tw % s != 0) continue;
        const int ow = tw / s;
        if (ow >= Wo) continue;
        sum += dcol[(((long long)c * k + i) * k + j) * P + (long long)oh * Wo + ow];
      }
    }
    dx[e] = sum;
  }
}

static __global__ void bias_fill_kernel(float *__restrict__ y, const float *__restrict__ b, long long total, int O,
                                        long long P) {
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x)
    y[e] = b ? b[(e / P) % O] : 0.0f;
}

// One block per output channel o: Σ over (n, q) of dy[n, o, q] in double.
static __global__ void bias_grad_kernel(const float *__restrict__ dy, float *__restrict__ db, long long N, int O,
                                        long long P) {
  __shared__ double buf[PX_K_RED_THREADS];
  const int o = blockIdx.x;
  const long long n_vals = N * P;
  double acc = 0.0;
  for (long long v = threadIdx.x; v < n_vals; v += PX_K_RED_THREADS) {
    const long long n = v / P, q = v - n * P;
    acc += dy[(n * O + o) * P + q];
  }
  const double total = px_k_block_sum(acc, buf);
  if (threadIdx.x == 0) db[o] += (float)total;
}

extern "C" px_status px_k_im2col(const float *x, float *col, int C, int H, int W, int k, int s, int p, int Ho,
                                 int Wo) {
  const long long total = (long long)C * k * k * Ho * Wo;
  im2col_kernel<<<px_k_blocks(total), 256, 0, stream()>>>(x, col, C, H, W, k, s, p, Ho, Wo);
  return px_cuda_check_launch("Conv2d im2col");
}

extern "C" px_status px_k_col2im(const float *dcol, float *dx, int C, int H, int W, int k, int s, int p, int Ho,
                                 int Wo) {
  const long long total = (long long)C * H * W;
  col2im_kernel<<<px_k_blocks(total), 256, 0, stream()>>>(dcol, dx, C, H, W, k, s, p, Ho, Wo);
  return px_cuda_check_launch("Conv2d col2im");
}

extern "C" px_status px_k_bias_fill(float *y, const float *b, int64_t N, int O, int64_t P) {
  const long long total = (long long)N * O * P;
  bias_fill_kernel<<<px_k_blocks(total), 256, 0, stream()>>>(y, b, total, O, P);
  return px_cuda_check_launch("Conv2d bias fill");
}

extern "C" px_status px_k_bias_grad(const float *dy, float *db, int64_t N, int O, int64_t P) {
  bias_grad_kernel<<<O, PX_K_RED_THREADS, 0, stream()>>>(dy, db, N, O, P);
  return px_cuda_check_launch("Conv2d bias gradient");
}
