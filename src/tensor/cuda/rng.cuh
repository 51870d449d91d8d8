/* tensor/cuda/rng.cuh — plexus's counter-based RNG on the device (internal).
 *
 * px_philox4x32_dev is src/base/rng.c's px_philox4x32 (Philox4x32-10) as a
 * __device__ function: the same (seed, counter_hi, counter_lo) gives the same
 * four words as on the CPU, so a GPU dropout mask equals the CPU's bit for
 * bit.  px_u32_to_unit_dev is base.h's px_u32_to_unit (top 24 bits / 2^24,
 * exact in f32 on both sides).  __host__ too, so the port is checked against
 * rng.c on a machine without a GPU (px_cuda_philox_port_check, k_dropout.cu;
 * tests/test_cuda_philox_port_matches_cpu.c). */
#ifndef PX_TENSOR_CUDA_RNG_CUH
#define PX_TENSOR_CUDA_RNG_CUH

#include <stdint.h>

__host__ __device__ __forceinline__ void px_philox4x32_dev(uint64_t seed, uint64_t counter_hi, uint64_t counter_lo,
                                                           uint32_t out[4]) {
  uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
  uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    // mulhilo: (lo, hi) of the 64-bit product, as rng.c's.
    const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;  // mul.lo / mul.hi
    const uint32_t lo0 = (uint32_t)p0, hi0 = (uint32_t)(p0 >> 32);
    const uint32_t lo1 = (uint32_t)p1, hi1 = (uint32_t)(p1 >> 32);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* Word e % 4 of block e / 4: the u32 of flat element e under dropout.c's
 * scheme, Philox(seed, hi, e / 4)[e % 4]. */
__host__ __device__ __forceinline__ uint32_t px_philox_word_dev(uint64_t seed, uint64_t hi, uint64_t e) {
  uint32_t w[4];
  px_philox4x32_dev(seed, hi, e >> 2, w);
  const uint32_t k = (uint32_t)(e & 3);
  return k == 0 ? w[0] : k == 1 ? w[1] : k == 2 ? w[2] : w[3];
}

__host__ __device__ __forceinline__ float px_u32_to_unit_dev(uint32_t x) {
  return (float)(x >> 8) * (1.0f / 16777216.0f);
}

#endif
