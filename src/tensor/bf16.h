/* tensor/bf16.h — bfloat16 as uint16_t bit patterns (internal).
 *
 * f32 -> bf16 rounds to nearest, ties to even, on the bits; a NaN stays a
 * (quiet) NaN with its sign.  The CUDA kernels (px_cuda_to_bf16) do the
 * same arithmetic, so the two give the same bits for every input.  Usable
 * from C and from CUDA (.cu) code. */
#ifndef PX_TENSOR_BF16_H
#define PX_TENSOR_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define PX_BF16_FN static inline __host__ __device__
#else
#define PX_BF16_FN static inline
#endif

/* The bf16 bits of an f32's bits. */
PX_BF16_FN uint16_t px_bits_to_bf16(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep it quiet */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

PX_BF16_FN uint16_t px_f32_to_bf16(float x) {
#if defined(__CUDA_ARCH__)
  return px_bits_to_bf16(__float_as_uint(x));
#else
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return px_bits_to_bf16(u);
#endif
}

PX_BF16_FN float px_bf16_to_f32(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

#endif
