// CRC-32C of checkpoint pieces (the index's per-piece checksum): the same
// function as src/log/crc32c.c (Castagnoli, reflected 0x82F63B78), but over
// gigabytes, so with SSE4.2's crc32 instruction where the CPU has it (every
// x86-64 since 2008–2011), 8 bytes at a time, and a table 8 bytes at a time
// (slicing-by-8) elsewhere.  Both give the same value as px_crc32c.
#include "io/checkpoint.h"

#include <stdint.h>
#include <string.h>

static uint32_t table[8][256];
static int table_ready;  // benign race: every thread writes the same table

static void table_build(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[0][i] = c;
  }
  for (int s = 1; s < 8; s++)
    for (uint32_t i = 0; i < 256; i++) table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xFFu];
  table_ready = 1;
}

static uint32_t crc_table8(uint32_t crc, const unsigned char *p, size_t n) {
  if (!table_ready) table_build();
  while (n >= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= crc;  // little-endian hosts (the safetensors code assumes one too)
    crc = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
          table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^ table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = table[0][(crc ^ *p++) & 0xFFu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PX_HAVE_SSE42_PATH 1
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const unsigned char *p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = (uint32_t)c;
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

uint32_t px_ckpt_crc32c(uint32_t crc, const void *data, size_t n) {
  const unsigned char *p = data;
  crc = ~crc;
#ifdef PX_HAVE_SSE42_PATH
  static int have = -1;
  if (have < 0) have = __builtin_cpu_supports("sse4.2") ? 1 : 0;
  if (have) return ~crc_sse42(crc, p, n);
#endif
  return ~crc_table8(crc, p, n);
}

uint32_t px_ckpt_crc32c_portable(uint32_t crc, const void *data, size_t n) {
  return ~crc_table8(~crc, data, n);
}
