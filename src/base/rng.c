// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11): a counter-based generator, so the numbers of element i
// at step s are a pure function of (seed, s, i).
#include "plexus/base.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

void px_philox4x32(uint64_t seed, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
  uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(PHILOX_M0, c0, &hi0);
    uint32_t lo1 = mulhilo(PHILOX_M1, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

px_rng px_rng_make(uint64_t seed, uint64_t stream) {
  px_rng r = {.seed = seed, .stream = stream, .counter = 0, .left = 0};
  return r;
}

uint32_t px_rng_u32(px_rng *r) {
  if (r->left == 0) {
    px_philox4x32(r->seed, r->stream, r->counter++, r->buf);
    r->left = 4;
  }
  return r->buf[4 - r->left--];
}

uint64_t px_rng_u64(px_rng *r) {
  uint64_t hi = px_rng_u32(r);
  return (hi << 32) | px_rng_u32(r);
}

float px_rng_uniform(px_rng *r) { return px_u32_to_unit(px_rng_u32(r)); }

double px_rng_uniform_f64(px_rng *r) { return (double)(px_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

float px_rng_normal(px_rng *r) {
  // Box-Muller; 1 - u keeps log() away from 0.
  double u1 = 1.0 - px_rng_uniform_f64(r), u2 = px_rng_uniform_f64(r);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t px_rng_below(px_rng *r, uint64_t n) {
  if (n <= 1) return 0;
  // Rejection sampling removes the modulo bias.
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = px_rng_u64(r);
  } while (x >= limit);
  return x % n;
}
