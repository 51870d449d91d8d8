/* Claim: the per-piece checksum of the checkpoint index (px_ckpt_crc32c,
 * SSE4.2's crc32 instruction where the CPU has it, slicing-by-8 elsewhere)
 * is CRC-32C: the check value of "123456789" is 0xE3069283, and on buffers
 * of every length 0..300 at every alignment 0..7, in one call or split in
 * two, it equals the byte-at-a-time reference (px_crc32c, src/log).
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
  return px_test_finish("test_checkpoint_piece_crc32c_matches_reference");
}
