/* Claim: the per-piece checksum of the checkpoint index (px_ckpt_crc32c,
 * SSE4.2's crc32 instruction where the CPU has it, slicing-by-8 elsewhere)
 * is CRC-32C: the check value of "123456789" is 0xE3069283, and on buffers
 * of every length 0..300 at every alignment 0..7, in one call or split in
 * two, it equals the byte-at-a-time reference (px_crc32c, src/log); and so
 * on long buffers (around the 24 KiB rounds of the three-stream path, whose
 * lanes are joined by a product mod P), whole and split mid-lane.
 *
 * If it failed, indexes written on one machine would not verify on another
 * (or a corrupted piece could pass). */
#include "io/checkpoint.h"
#include "plexus/log.h"
#include "px_test.h"

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
  return px_test_finish("test_checkpoint_piece_crc32c_matches_reference");
}
