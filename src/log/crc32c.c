/* crc32c.c — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the
 * checksum TensorBoard/TFRecord framing uses.  Table-driven, one byte at a
 * time: event files are small (a few records per step), so speed does not
 * matter and the portable table keeps one code path on every CPU. */
#include <stddef.h>
#include <stdint.h>

#include "plexus/log.h"

static uint32_t crc_table[256];
static int crc_table_ready; /* benign race: every thread writes the same table */

static void crc_table_build(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    crc_table[i] = c;
  }
  crc_table_ready = 1;
}

/* `crc` is the value returned by a previous call (0 to start), so a buffer
 * can be checksummed in pieces. */
uint32_t px_crc32c(uint32_t crc, const void *data, size_t n) {
  if (!crc_table_ready) crc_table_build();
  const unsigned char *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

uint32_t px_crc32c_masked(const void *data, size_t n) {
  uint32_t crc = px_crc32c(0, data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
