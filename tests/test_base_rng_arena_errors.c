/* Claims about base/: Philox4x32-10 matches the published known-answer
 * vectors (Random123 kat_vectors), so masks and shuffles are the standard
 * generator; streams are reproducible and uniform enough; the arena hands
 * out 64-byte-aligned memory and consolidates; errors format and wrap. */
#include "px_test.h"

#include <string.h>

int main(void) {
  uint32_t out[4];
  // Random123 known answers for philox4x32_10: counter 0, key 0.
  px_philox4x32(0, 0, 0, out);
  CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u,
        "philox(0,0) = %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);
  // counter all-ones, key all-ones.
  px_philox4x32(0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffffffffffull, out);
  CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu,
        "philox(ones) = %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);

  px_rng a = px_rng_make(7, 1), b = px_rng_make(7, 1), c = px_rng_make(7, 2);
  int same = 0;
  double mean = 0, var = 0;
  for (int i = 0; i < 100000; i++) {
    uint32_t va = px_rng_u32(&a), vb = px_rng_u32(&b), vc = px_rng_u32(&c);
    CHECK(va == vb, "same stream differs at %d", i);
    same += va == vc;
    float n = px_rng_normal(&a);
    (void)px_rng_normal(&b);
    mean += n;
    var += (double)n * n;
  }
  CHECK(same < 5, "streams 1 and 2 agree %d times", same);
  mean /= 100000;
  var = var / 100000 - mean * mean;
  CHECK(fabs(mean) < 0.02 && fabs(var - 1) < 0.03, "normal mean %g var %g", mean, var);
  for (int i = 0; i < 1000; i++) CHECK(px_rng_below(&a, 7) < 7, "below");

  px_arena *ar = px_arena_create(0);
  CHECK(ar != NULL, "arena");
  for (int step = 0; step < 3; step++) {
    px_arena_reset(ar);
    for (int i = 0; i < 100; i++) {
      void *p = px_arena_alloc(ar, 100000 + (size_t)i);
      CHECK(p && ((uintptr_t)p % 64) == 0, "aligned");
      memset(p, 1, 100000);
    }
  }
  uint64_t n = px_arena_system_allocs(ar);
  px_arena_reset(ar);
  for (int i = 0; i < 100; i++) px_arena_alloc(ar, 100000 + (size_t)i);
  CHECK(px_arena_system_allocs(ar) == n, "consolidated arena still allocates");
  px_arena_free(ar);

  CHECK(px_error(PX_ERR_IO, "open %s", "x.bin") == PX_ERR_IO, "returns status");
  px_error_wrap(PX_ERR_IO, "loading model");
  CHECK(strcmp(px_last_error(), "loading model: open x.bin") == 0, "wrapped: %s", px_last_error());
  CHECK(strcmp(px_status_name(PX_ERR_SHAPE), "PX_ERR_SHAPE") == 0, "status name");
  return px_test_finish("test_base_rng_arena_errors");
}
