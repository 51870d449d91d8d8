/* Claim: the per-piece checksum of the checkpoint index (px_ckpt_crc32c,
 * SSE4.2's crc32 instruction where the CPU has it, slicing-by-8 elsewhere)
 * is CRC-32C: the check value of "123456789" is 0xE3069283, and on buffers
 * of every length 0..300 at every alignment 0..7, in one call or split in
 * two, it equals the byte-at-a-time reference (px_crc32c, src/log); and so
 * on long buffers (around the 24 KiB rounds of the three-stream path, whose
 * lanes are joined by a product mod P), whole and split mid-lane.  Two
 * CRCs joined with px_ckpt_crc32c_combine equal the CRC of the joined
 * bytes, and px_ckpt_crc32c_wide (the halves on two threads, from 8 MiB)
 * equals px_ckpt_crc32c on buffers just below, at and above 8 MiB, odd
 * lengths included.
 *
 * If it failed, indexes written on one machine would not verify on another
 * (or a corrupted piece could pass). */
#include "io/checkpoint.h"
#include "plexus/log.h"
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

int main(void) {
  CHECK(px_ckpt_crc32c_portable(0, "123456789", 9) == 0xE3069283u, "portable check value");
  CHECK(px_ckpt_crc32c(0, "123456789", 9) == 0xE3069283u, "check value %08x", px_ckpt_crc32c(0, "123456789", 9));
  static unsigned char buf[320];
  uint32_t x = 12345;
  for (size_t i = 0; i < sizeof buf; i++) {
    x = x * 1103515245u + 12345u;
    buf[i] = (unsigned char)(x >> 16);
  }
  for (size_t a = 0; a < 8; a++)
    for (size_t n = 0; n + a <= 308; n++) {
      const uint32_t ref = px_crc32c(0, buf + a, n);
      CHECK(px_ckpt_crc32c(0, buf + a, n) == ref, "align %zu length %zu", a, n);
      CHECK(px_ckpt_crc32c_portable(0, buf + a, n) == ref, "portable: align %zu length %zu", a, n);
      const size_t k = n / 3;
      CHECK(px_ckpt_crc32c(px_ckpt_crc32c(0, buf + a, k), buf + a + k, n - k) == ref, "split %zu+%zu", k, n - k);
    }
  // Long buffers: below, at and past multiples of 3 lanes of 8 KiB.
  static unsigned char big[100003 + 8];
  for (size_t i = 0; i < sizeof big; i++) {
    x = x * 1103515245u + 12345u;
    big[i] = (unsigned char)(x >> 16);
  }
  const size_t lens[] = {24575, 24576, 24577, 24583, 49152, 49159, 73728 + 4097, 100003};
  for (size_t a = 0; a < 8; a += 3)
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
      const size_t n = lens[i];
      const uint32_t ref = px_crc32c(0, big + a, n);
      CHECK(px_ckpt_crc32c(0, big + a, n) == ref, "align %zu length %zu", a, n);
      CHECK(px_ckpt_crc32c_portable(0, big + a, n) == ref, "portable: align %zu length %zu", a, n);
      const size_t k = 8192 + 1000 + a;
      CHECK(px_ckpt_crc32c(px_ckpt_crc32c(0, big + a, k), big + a + k, n - k) == ref, "split %zu+%zu", k, n - k);
    }
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    const size_t n = lens[i], k = n / 2 + 7;
    CHECK(px_ckpt_crc32c_combine(px_ckpt_crc32c(0, big, k), px_ckpt_crc32c(0, big + k, n - k), n - k) ==
            px_crc32c(0, big, n),
          "combine %zu+%zu", k, n - k);
  }
  // The two-thread CRC of large pieces.
  const size_t wide = PX_CKPT_CRC_WIDE_MIN + 4099;
  unsigned char *w = malloc(wide);
  CHECK(w != NULL, "out of memory");
  if (w) {
    for (size_t i = 0; i < wide; i++) {
      x = x * 1103515245u + 12345u;
      w[i] = (unsigned char)(x >> 16);
    }
    const size_t wl[] = {PX_CKPT_CRC_WIDE_MIN - 1, PX_CKPT_CRC_WIDE_MIN, PX_CKPT_CRC_WIDE_MIN + 1, wide - 3, wide};
    for (size_t i = 0; i < sizeof wl / sizeof wl[0]; i++)
      CHECK(px_ckpt_crc32c_wide(w, wl[i]) == px_ckpt_crc32c(0, w, wl[i]), "wide: length %zu", wl[i]);
    CHECK(px_ckpt_crc32c_wide(w + 3, wide - 3) == px_crc32c(0, w + 3, wide - 3), "wide against the reference");
    free(w);
  }
  return px_test_finish("test_checkpoint_piece_crc32c_matches_reference");
}
