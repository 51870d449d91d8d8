// tensor/cuda/k_conv.cu — Conv2d's device kernels (im2col, gather col2im,
// the (nb, O, P) <-> (O, nb·P) layout changes around the GEMMs, the bias
// gradient); the GEMMs are cuBLAS calls in nn/conv2d.c (px_cuda_sgemm /
// px_cuda_gemm_bf16).  Layouts: k_vision.h.
#include "tensor/cuda/k_vision.h"
#include "tensor/cuda/k_reduce.cuh"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>

static cudaStream_t stream(void) { return (cudaStream_t)px_cuda_compute_stream(); }

// One thread per col element (K·nb·P of them).
static __global__ void im2col_kernel(const float *__restrict__ x, float *__restrict__ col, int nb, int C, int H, int W,
                                     int k, int s, int p, int Ho, int Wo) {
  const long long P = (long long)Ho * Wo, BP = nb * P, total = (long long)C * k * k * BP;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const long long row = e / BP, r = e - row * BP, b = r / P;
    const int q = (int)(r - b * P);
    const int j = (int)(row % k), i = (int)((row / k) % k), c = (int)(row / ((long long)k * k));
    const int oh = q / Wo, ow = q - oh * Wo;
    const int ih = oh * s - p + i, iw = ow * s - p + j;
    col[e] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((b * C + c) * H + ih) * W + iw] : 0.0f;
  }
}

// One thread per input pixel (b, c, ih, iw): the taps (i, j) that read it
// are those with oh·s = ih + p - i and ow·s = iw + p - j inside the output;
// summed in (i, j) order, the CPU's col2im order for one pixel.
static __global__ void col2im_kernel(const float *__restrict__ dcol, float *__restrict__ dx, int nb, int C, int H,
                                     int W, int k, int s, int p, int Ho, int Wo) {
  const long long P = (long long)Ho * Wo, BP = nb * P, total = (long long)nb * C * H * W;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const int iw = (int)(e % W), ih = (int)((e / W) % H);
    const long long bc = e / ((long long)H * W), b = bc / C;
    const int c = (int)(bc - b * C);
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
        sum += dcol[(((long long)c * k + i) * k + j) * BP + b * P + (long long)oh * Wo + ow];
      }
    }
    dx[e] = sum;
  }
}

// y[b, o, q] = z[o, b·P + q] + bias[o]: the GEMM's sum, then the bias (as
// the CPU's GEMM adds its sum onto the bias-filled output).
static __global__ void unpack_kernel(const float *__restrict__ z, const float *__restrict__ bias, float *__restrict__ y,
                                     int nb, int O, long long P) {
  const long long total = (long long)nb * O * P;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const long long q = e % P, bo = e / P, b = bo / O;
    const int o = (int)(bo - b * O);
    const float v = z[(long long)o * nb * P + b * P + q];
    y[e] = bias ? v + bias[o] : v;
  }
}

static __global__ void pack_kernel(const float *__restrict__ dy, float *__restrict__ zp, int nb, int O, long long P) {
  const long long total = (long long)nb * O * P;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const long long q = e % P, bo = e / P, b = bo / O;
    const int o = (int)(bo - b * O);
    zp[(long long)o * nb * P + b * P + q] = dy[e];
  }
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

extern "C" px_status px_k_im2col(const float *x, float *col, int nb, int C, int H, int W, int k, int s, int p, int Ho,
                                 int Wo) {
  const long long total = (long long)C * k * k * nb * Ho * Wo;
  im2col_kernel<<<px_k_blocks(total), 256, 0, stream()>>>(x, col, nb, C, H, W, k, s, p, Ho, Wo);
  return px_cuda_check_launch("Conv2d im2col");
}

extern "C" px_status px_k_col2im(const float *dcol, float *dx, int nb, int C, int H, int W, int k, int s, int p, int Ho,
                                 int Wo) {
  const long long total = (long long)nb * C * H * W;
  col2im_kernel<<<px_k_blocks(total), 256, 0, stream()>>>(dcol, dx, nb, C, H, W, k, s, p, Ho, Wo);
  return px_cuda_check_launch("Conv2d col2im");
}

extern "C" px_status px_k_conv_unpack(const float *z, const float *bias, float *y, int nb, int O, int64_t P) {
  unpack_kernel<<<px_k_blocks((long long)nb * O * P), 256, 0, stream()>>>(z, bias, y, nb, O, P);
  return px_cuda_check_launch("Conv2d output layout");
}

extern "C" px_status px_k_conv_pack(const float *dy, float *zp, int nb, int O, int64_t P) {
  pack_kernel<<<px_k_blocks((long long)nb * O * P), 256, 0, stream()>>>(dy, zp, nb, O, P);
  return px_cuda_check_launch("Conv2d dy layout");
}

extern "C" px_status px_k_bias_grad(const float *dy, float *db, int64_t N, int O, int64_t P) {
  bias_grad_kernel<<<O, PX_K_RED_THREADS, 0, stream()>>>(dy, db, N, O, P);
  return px_cuda_check_launch("Conv2d bias gradient");
}
