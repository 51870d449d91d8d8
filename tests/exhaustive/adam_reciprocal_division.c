/* The exhaustive check behind Adam's division-free sqrt(v) / sqrt(bc2)
 * (src/optim/optim.c, "Markstein's correction"): for each divisor b, every
 * float s in [2^-100, 2^100] (every finite sqrt(v) lies there, or is 0):
 *   y = RN(1/b),  q = RN(s·y),  r = RN(q + RN(s - q·b)·y)  (two fmas)
 * must be RN(s / b), bit for bit.  The divisors: Adam's sqrt(1 - β2^t) for
 * β2 0.999, 0.99, 0.95 and 0.9999 at t = 1 .. 100000 (10 steps each), six
 * significands at the edges (all ones among them), ten random ones.  Not a
 * ctest (minutes on 2 cores: 2^31 values a divisor); CI runs its sample,
 * tests/test_optim_adam_reciprocal_division_is_exact.c.
 *
 *   gcc -O2 -fopenmp -std=c11 -march=x86-64-v3 tests/exhaustive/adam_reciprocal_division.c -lm -o /tmp/adiv
 *   /tmp/adiv        # one line a divisor, "bad 0" each; exit 1 on any mismatch
 *
 * Run on 2026-12-02: 56 divisors, 0 mismatches. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mismatches(float b) {
  const float y = 1.0f / b;
  uint64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t hi = 0; hi < 0x7f800000LL; hi += 1 << 16) {
    uint64_t local = 0;
    for (uint32_t lo = 0; lo < (1u << 16); lo++) {
      const uint32_t u = (uint32_t)hi + lo;
      float s;
      memcpy(&s, &u, sizeof s);
      if (!(s >= 0x1p-100f && s <= 0x1p100f)) continue;
      const float q = s * y, r = fmaf(fmaf(-q, b, s), y, q), t = s / b;
      local += memcmp(&r, &t, sizeof r) != 0;
    }
    bad += local;
  }
  return bad;
}

int main(void) {
  static const double betas[] = {0.999, 0.99, 0.95, 0.9999};
  static const int steps[] = {1, 2, 3, 5, 10, 100, 1000, 3000, 10000, 100000};
  static const uint32_t edges[] = {0x3f7fffff, 0x3effffff, 0x3d7fffff, 0x3f000001, 0x3f800000, 0x3f3504f3};
  uint64_t total = 0;
  int n = 0;
  for (int k = 0; k < 4; k++)
    for (int j = 0; j < 10; j++, n++) {
      const float b = (float)sqrt(1.0 - pow(betas[k], steps[j]));
      const uint64_t bad = mismatches(b);
      printf("beta2 %g t %d b %.9g bad %llu\n", betas[k], steps[j], (double)b, (unsigned long long)bad);
      fflush(stdout);
      total += bad;
    }
  for (int j = 0; j < 6; j++, n++) {
    float b;
    memcpy(&b, &edges[j], sizeof b);
    const uint64_t bad = mismatches(b);
    printf("b %a bad %llu\n", (double)b, (unsigned long long)bad);
    fflush(stdout);
    total += bad;
  }
  srand(5);
  for (int j = 0; j < 10; j++, n++) {
    const uint32_t u = 0x3d000000u + (uint32_t)rand() % 0x2800000u;
    float b;
    memcpy(&b, &u, sizeof b);
    const uint64_t bad = mismatches(b);
    printf("random b %.9g bad %llu\n", (double)b, (unsigned long long)bad);
    fflush(stdout);
    total += bad;
  }
  printf("%d divisors, %llu mismatches\n", n, (unsigned long long)total);
  return total != 0;
}
