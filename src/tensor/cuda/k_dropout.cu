// Dropout on the device with dropout.c's mask: element i keeps when
// unit(Philox(seed, hi, i/4)[i%4]) >= p.  One thread per block of four
// elements (one Philox call each, as the CPU draws them).
#include "tensor/cuda/k_transformer_a.h"
#include "tensor/cuda/px_cuda.h"
#include "tensor/cuda/rng.cuh"

#include <cuda_runtime.h>

namespace {

__global__ void dropout_kernel(const float *in, float *out, size_t n, float p, float scale, uint64_t seed,
                               uint64_t hi) {
  const size_t blocks = (n + 3) / 4;
  for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += (size_t)gridDim.x * blockDim.x) {
    uint32_t w[4];
    px_philox4x32_dev(seed, hi, (uint64_t)b, w);
    const size_t i0 = b * 4;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const size_t i = i0 + (size_t)k;
      if (i < n) out[i] = px_u32_to_unit_dev(w[k]) >= p ? in[i] * scale : 0.0f;
    }
  }
}

__global__ void dropout_part_kernel(const float *in, float *out, int64_t N, int64_t Tl, size_t inner, int part,
                                    int parts, float p, float scale, uint64_t seed, uint64_t hi) {
  const size_t n = (size_t)N * (size_t)Tl * inner;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t r = i / inner, j = i % inner;
    const int64_t nn = (int64_t)r / Tl, t = (int64_t)r % Tl;
    const uint64_t g = (uint64_t)((nn * parts + part) * Tl + t) * inner + j;
    out[i] = px_u32_to_unit_dev(px_philox_word_dev(seed, hi, g)) >= p ? in[i] * scale : 0.0f;
  }
}

unsigned grid_for(size_t work, unsigned threads) {
  size_t g = (work + threads - 1) / threads;
  if (g > 65535u * 8u) g = 65535u * 8u;
  return g ? (unsigned)g : 1u;
}

}  // namespace

extern "C" px_status px_cuda_dropout(const float *in, float *out, size_t n, float p, uint64_t seed, uint64_t hi) {
  if (n == 0) return PX_OK;
  const float scale = 1.0f / (1.0f - p);
  cudaStream_t s = (cudaStream_t)px_cuda_compute_stream();
  dropout_kernel<<<grid_for((n + 3) / 4, 256), 256, 0, s>>>(in, out, n, p, scale, seed, hi);
  return px_cuda_check_launch("dropout");
}

extern "C" px_status px_cuda_dropout_part(const float *in, float *out, int64_t N, int64_t Tl, size_t inner, int part,
                                          int parts, float p, uint64_t seed, uint64_t hi) {
  const size_t n = (size_t)N * (size_t)Tl * inner;
  if (n == 0) return PX_OK;
  const float scale = 1.0f / (1.0f - p);
  cudaStream_t s = (cudaStream_t)px_cuda_compute_stream();
  dropout_part_kernel<<<grid_for(n, 256), 256, 0, s>>>(in, out, N, Tl, inner, part, parts, p, scale, seed, hi);
  return px_cuda_check_launch("dropout (sequence part)");
}

extern "C" void px_cuda_philox_port_check(uint64_t seed, uint64_t hi, uint64_t e, uint32_t *word, float *unit) {
  *word = px_philox_word_dev(seed, hi, e);
  *unit = px_u32_to_unit_dev(*word);
}
