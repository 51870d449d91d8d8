// Token and positional embeddings on the device (src/nn/embedding.c).
//
// The gather checks every id; a bad one writes no row and lowers a device
// word to its position (an integer atomicMin: the smallest bad position
// wins whatever the order, the one the CPU path names).  The scatter-add of
// the backward runs over segments of positions sorted by (id, position)
// (the caller sorts): one thread per (segment, column) adds the rows of dy
// of that id in position order, the additions the CPU makes, in its order.
#include "tensor/cuda/k_transformer_b.h"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>

namespace {

inline cudaStream_t stream() { return (cudaStream_t)px_cuda_compute_stream(); }

inline unsigned grid_for(size_t n, int threads) {
  size_t b = (n + threads - 1) / threads;
  return (unsigned)(b > 65535u * 16u ? 65535u * 16u : (b ? b : 1));
}

__global__ void embedding_forward_kernel(const int32_t *__restrict__ ids, const float *__restrict__ W,
                                         float *__restrict__ y, unsigned long long *__restrict__ bad, size_t n, int V,
                                         int C) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t p = i / (size_t)C, c = i % (size_t)C;
    const int32_t id = ids[p];
    if (id < 0 || id >= V) {
      if (c == 0) atomicMin(bad, (unsigned long long)p);
    } else {
      y[i] = W[(size_t)id * C + c];
    }
  }
}

__global__ void embedding_backward_kernel(const int32_t *__restrict__ seg_id, const int32_t *__restrict__ seg_start,
                                          const int32_t *__restrict__ pos, const float *__restrict__ dy,
                                          float *__restrict__ dW, int C) {
  const int s = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float *w = dW + (size_t)seg_id[s] * C + c;
  float acc = *w;
  for (int k = seg_start[s]; k < seg_start[s + 1]; k++) acc = __fadd_rn(acc, dy[(size_t)pos[k] * C + c]);
  *w = acc;
}

__global__ void pos_forward_kernel(const float *__restrict__ x, const float *__restrict__ W, float *__restrict__ y,
                                   size_t n, size_t T, int C) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t r = i / (size_t)C, c = i % (size_t)C;
    y[i] = __fadd_rn(x[i], W[(r % T) * C + c]);
  }
}

// One thread per (t, c) of dW: Σ over n in order.
__global__ void pos_backward_kernel(const float *__restrict__ dy, float *__restrict__ dW, size_t N, size_t T, int C) {
  const size_t TC = T * (size_t)C;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < TC; i += (size_t)gridDim.x * blockDim.x) {
    float acc = dW[i];
    for (size_t n = 0; n < N; n++) acc = __fadd_rn(acc, dy[n * TC + i]);
    dW[i] = acc;
  }
}

}  // namespace

extern "C" px_status px_k_embedding_forward(const int32_t *ids, const float *W, float *y, uint64_t *bad, int64_t R,
                                            int V, int C) {
  cudaError_t e = cudaMemsetAsync(bad, 0xff, sizeof(uint64_t), stream());
  if (e != cudaSuccess)
    return px_error(PX_ERR_INTERNAL, "cuda: embedding forward: cudaMemsetAsync: %s", cudaGetErrorString(e));
  const size_t n = (size_t)R * (size_t)C;
  if (n == 0) return PX_OK;
  embedding_forward_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(ids, W, y, (unsigned long long *)bad, n, V, C);
  return px_cuda_check_launch("embedding forward");
}

extern "C" px_status px_k_embedding_backward(const int32_t *seg_id, const int32_t *seg_start, const int32_t *pos,
                                             int n_seg, const float *dy, float *dW, int C) {
  if (n_seg == 0 || C == 0) return PX_OK;
  const int threads = C < 256 ? ((C + 31) / 32) * 32 : 256;
  dim3 grid((unsigned)n_seg, (unsigned)((C + threads - 1) / threads));
  if (grid.y > 65535) return px_error(PX_ERR_INVALID, "embedding backward: dim %d is too wide for one grid", C);
  embedding_backward_kernel<<<grid, threads, 0, stream()>>>(seg_id, seg_start, pos, dy, dW, C);
  return px_cuda_check_launch("embedding backward");
}

extern "C" px_status px_k_pos_embedding_forward(const float *x, const float *W, float *y, int64_t N, int64_t T, int C) {
  const size_t n = (size_t)N * (size_t)T * (size_t)C;
  if (n == 0) return PX_OK;
  pos_forward_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(x, W, y, n, (size_t)T, C);
  return px_cuda_check_launch("position embedding forward");
}

extern "C" px_status px_k_pos_embedding_backward(const float *dy, float *dW, int64_t N, int64_t T, int C) {
  const size_t tc = (size_t)T * (size_t)C;
  if (tc == 0) return PX_OK;
  pos_backward_kernel<<<grid_for(tc, 256), 256, 0, stream()>>>(dy, dW, (size_t)N, (size_t)T, C);
  return px_cuda_check_launch("position embedding backward");
}
