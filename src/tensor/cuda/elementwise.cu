// Elementwise kernels and reductions of px_cuda.h (px_cuda_fill ...).
// Grid-stride loops on the calling thread's compute stream; each launcher
// checks its launch.  sumsq is deterministic: a fixed grid, each thread's
// grid-stride sum in double, a tree in shared memory per block, the block
// partials summed in index order by one thread: the same bits for the same
// input on every run (not the CPU's bits: the order differs).
#include "tensor/bf16.h"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 8192;
constexpr int kSumBlocks = 256; /* fixed: the order of sumsq's sum depends on it */

int blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return (int)(b < (size_t)kMaxBlocks ? (b ? b : 1) : (size_t)kMaxBlocks);
}

cudaStream_t stream() { return (cudaStream_t)px_cuda_compute_stream(); }

__global__ void k_fill(float *x, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] = v;
}

__global__ void k_scale(float *x, size_t n, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] *= a;
}

__global__ void k_axpy(float *y, const float *x, size_t n, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = fmaf(a, x[i], y[i]);
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void k_to_bf16(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = px_f32_to_bf16(src[i]);
}

// Four at a time (16-byte loads, 8-byte stores) where src and dst are
// aligned: the casts of a bf16 step are memory-bound, and the scalar loop
// above moved them well under the card's bandwidth (docs/PERFORMANCE.md,
// "Figures behind code comments").
__global__ void k_to_bf16_v4(uint2 *dst, const float4 *src, size_t n4) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
    const float4 v = src[i];
    uint2 o;
    o.x = (uint32_t)px_f32_to_bf16(v.x) | (uint32_t)px_f32_to_bf16(v.y) << 16;
    o.y = (uint32_t)px_f32_to_bf16(v.z) | (uint32_t)px_f32_to_bf16(v.w) << 16;
    dst[i] = o;
  }
}

__global__ void k_from_bf16(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = px_bf16_to_f32(src[i]);
}

// rows x cols of src (row stride sld) into dst with row stride dld.
__global__ void k_to_bf16_2d(uint16_t *dst, size_t dld, const float *src, size_t sld, size_t rows, size_t cols) {
  const size_t n = rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t r = i / cols, c = i - r * cols;
    dst[r * dld + c] = px_f32_to_bf16(src[r * sld + c]);
  }
}

__global__ void k_sumsq_partial(const float *x, size_t n, double *partial) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

__global__ void k_sumsq_final(const double *partial, int n, double *out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double acc = 0.0;
  for (int i = 0; i < n; i++) acc += partial[i];
  *out = acc;
}

__global__ void k_any_nonfinite(const float *x, size_t n, int *flag) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    if ((__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u) {
      *flag = 1; /* every writer stores the same value: no atomic needed */
      return;
    }
}

}  // namespace

extern "C" px_status px_cuda_fill(float *x, size_t n, float v) {
  if (n == 0) return PX_OK;
  k_fill<<<blocks_for(n), kThreads, 0, stream()>>>(x, n, v);
  return px_cuda_check_launch("fill");
}

extern "C" px_status px_cuda_scale(float *x, size_t n, float a) {
  if (n == 0) return PX_OK;
  k_scale<<<blocks_for(n), kThreads, 0, stream()>>>(x, n, a);
  return px_cuda_check_launch("scale");
}

extern "C" px_status px_cuda_axpy(float *y, const float *x, size_t n, float a) {
  if (n == 0) return PX_OK;
  k_axpy<<<blocks_for(n), kThreads, 0, stream()>>>(y, x, n, a);
  return px_cuda_check_launch("axpy");
}

extern "C" px_status px_cuda_add(float *out, const float *a, const float *b, size_t n) {
  if (n == 0) return PX_OK;
  k_add<<<blocks_for(n), kThreads, 0, stream()>>>(out, a, b, n);
  return px_cuda_check_launch("add");
}

extern "C" px_status px_cuda_to_bf16(uint16_t *dst, const float *src, size_t n) {
  if (n == 0) return PX_OK;
  const size_t n4 = ((((uintptr_t)dst & 7u) | ((uintptr_t)src & 15u)) == 0) ? n / 4 : 0;
  if (n4) k_to_bf16_v4<<<blocks_for(n4), kThreads, 0, stream()>>>((uint2 *)dst, (const float4 *)src, n4);
  if (n > 4 * n4) k_to_bf16<<<blocks_for(n - 4 * n4), kThreads, 0, stream()>>>(dst + 4 * n4, src + 4 * n4, n - 4 * n4);
  return px_cuda_check_launch("to_bf16");
}

extern "C" px_status px_cuda_from_bf16(float *dst, const uint16_t *src, size_t n) {
  if (n == 0) return PX_OK;
  k_from_bf16<<<blocks_for(n), kThreads, 0, stream()>>>(dst, src, n);
  return px_cuda_check_launch("from_bf16");
}

extern "C" px_status px_cuda_to_bf16_2d(uint16_t *dst, size_t dld, const float *src, size_t sld, size_t rows,
                                        size_t cols) {
  if (rows == 0 || cols == 0) return PX_OK;
  if (dld == cols && sld == cols) return px_cuda_to_bf16(dst, src, rows * cols);
  k_to_bf16_2d<<<blocks_for(rows * cols), kThreads, 0, stream()>>>(dst, dld, src, sld, rows, cols);
  return px_cuda_check_launch("to_bf16 (2-D)");
}

extern "C" px_status px_cuda_copy_2d(float *dst, size_t dld, const float *src, size_t sld, size_t rows, size_t cols) {
  if (rows == 0 || cols == 0) return PX_OK;
  const cudaError_t e = cudaMemcpy2DAsync(dst, dld * sizeof(float), src, sld * sizeof(float), cols * sizeof(float),
                                          rows, cudaMemcpyDeviceToDevice, stream());
  return e == cudaSuccess
    ? PX_OK
    : px_error(PX_ERR_INTERNAL, "cuda: 2-D copy of %zu x %zu floats: %s", rows, cols, cudaGetErrorString(e));
}

extern "C" px_status px_cuda_sumsq(const float *x, size_t n, double *out) {
  *out = 0.0;
  if (n == 0) return PX_OK;
  double *partial = (double *)px_cuda_malloc((kSumBlocks + 1) * sizeof(double));
  if (!partial) return px_error_wrap(PX_ERR_NOMEM, "sumsq");
  k_sumsq_partial<<<kSumBlocks, kThreads, 0, stream()>>>(x, n, partial);
  px_status st = px_cuda_check_launch("sumsq");
  if (st == PX_OK) {
    k_sumsq_final<<<1, 1, 0, stream()>>>(partial, kSumBlocks, partial + kSumBlocks);
    st = px_cuda_check_launch("sumsq (final)");
  }
  if (st == PX_OK) st = px_cuda_to_host(out, partial + kSumBlocks, sizeof(double));
  px_cuda_free(partial);
  return st;
}

extern "C" px_status px_cuda_any_nonfinite(const float *x, size_t n, bool *out) {
  *out = false;
  if (n == 0) return PX_OK;
  int *flag = (int *)px_cuda_malloc(sizeof(int));
  if (!flag) return px_error_wrap(PX_ERR_NOMEM, "any_nonfinite");
  px_status st = px_cuda_zero(flag, sizeof(int));
  if (st == PX_OK) {
    k_any_nonfinite<<<blocks_for(n), kThreads, 0, stream()>>>(x, n, flag);
    st = px_cuda_check_launch("any_nonfinite");
  }
  int h = 0;
  if (st == PX_OK) st = px_cuda_to_host(&h, flag, sizeof h);
  px_cuda_free(flag);
  if (st == PX_OK) *out = h != 0;
  return st;
}
