/* Claim: the device port of plexus's counter-based RNG (tensor/cuda/rng.cuh,
 * the Philox4x32-10 the dropout and attention kernels call) gives
 * src/base/rng.c's words for the same (seed, counter_hi, counter_lo), and
 * the same unit floats, over seeds, streams and element indices that use
 * all 64 bits of each (the element's word is Philox(seed, hi, e / 4)[e % 4]).
 * rng.cuh is __host__ __device__: this runs its code compiled by nvcc for
 * the host, so it runs (and can fail) on a machine without a GPU; the
 * GPU's own bits are test_cuda_softmax_cross_entropy_dropout_match_cpu's.
 * If it fails, GPU dropout masks differ from the CPU's. */
#include "px_test.h"
#include "tensor/cuda/k_transformer_a.h"

int main(void) {
  px_rng r = px_rng_make(77, 0);
  int checked = 0;
  for (int k = 0; k < 20000; k++) {
    // Small values and all-bits values alike.
    const uint64_t seed = k % 3 == 0 ? (uint64_t)k : px_rng_u64(&r);
    const uint64_t hi = k % 5 == 0 ? ((uint64_t)(k % 97) << 40) ^ (uint64_t)k : px_rng_u64(&r);
    const uint64_t e = k % 7 == 0 ? (uint64_t)k : px_rng_u64(&r);
    uint32_t w[4], word;
    float unit;
    px_philox4x32(seed, hi, e >> 2, w);
    px_cuda_philox_port_check(seed, hi, e, &word, &unit);
    CHECK(word == w[e & 3], "seed %llu hi %llu e %llu: port 0x%08x, rng.c 0x%08x", (unsigned long long)seed,
          (unsigned long long)hi, (unsigned long long)e, word, w[e & 3]);
    px_rng one = {.seed = seed, .stream = hi, .counter = e >> 2, .left = 0};
    for (uint64_t j = 0; j < (e & 3); j++) px_rng_u32(&one);
    CHECK(unit == px_u32_to_unit(px_rng_u32(&one)), "unit float of e %llu differs", (unsigned long long)e);
    checked++;
  }
  printf("%d elements checked\n", checked);
  return px_test_finish("test_cuda_philox_port_matches_cpu");
}
