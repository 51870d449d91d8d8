// CRC-32C of checkpoint pieces (the index's per-piece checksum): the same
// function as src/log/crc32c.c (Castagnoli, reflected 0x82F63B78), but over
// gigabytes, so with SSE4.2's crc32 instruction where the CPU has it (every
// x86-64 since 2008–2011), 8 bytes at a time over three streams at once,
// and a table 8 bytes at a time (slicing-by-8) elsewhere.  Both give the same value as px_crc32c.
#include "io/checkpoint.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_build(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[0][i] = c;
  }
  for (int s = 1; s < 8; s++)
    for (uint32_t i = 0; i < 256; i++) table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xFFu];
}

static uint32_t crc_table8(uint32_t crc, const unsigned char *p, size_t n) {
  pthread_once(&table_once, table_build);
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

// Three streams at once: the crc32 instruction takes 3 cycles before its
// result can feed the next one but starts one every cycle, so one stream
// runs at a third of what the unit can do.  Each round runs three lanes of
// LANE bytes side by side (the 2nd and 3rd from 0) and joins them with
//   crc(A B C) = shift(crc(A), 2·LANE) ^ shift(crc(B), LANE) ^ crc(C),
// shift(c, n) = c · x^(8n) mod P, a carry-less product of two 32-bit
// polynomials (zlib's crc32_combine, with Castagnoli's P).
#define LANE ((size_t)8 << 10)

static uint32_t multmodp(uint32_t a, uint32_t b) {  // a·b mod P, reflected
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ 0x82F63B78u : b >> 1;
  }
  return p;
}

static uint32_t xpow8n(size_t n) {                    // x^(8n) mod P
  uint32_t sq = 1u << 30, p = 1u << 31;               // x^1, x^0
  for (int k = 0; k < 3; k++) sq = multmodp(sq, sq);  // x^8
  for (; n; n >>= 1, sq = multmodp(sq, sq))
    if (n & 1) p = multmodp(sq, p);
  return p;
}

static uint32_t shift_lane, shift_lane2;  // x^(8·LANE), x^(16·LANE)
static pthread_once_t shifts_once = PTHREAD_ONCE_INIT;

static void shifts_build(void) {
  shift_lane = xpow8n(LANE);
  shift_lane2 = xpow8n(2 * LANE);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PX_HAVE_SSE42_PATH 1
__attribute__((target("sse4.2"))) static uint64_t crc_sse42_1(uint64_t c, const unsigned char *p, size_t n) {
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  return c;
}

__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const unsigned char *p, size_t n) {
  uint64_t c = crc;
  if (n >= 3 * LANE) {
    pthread_once(&shifts_once, shifts_build);
    while (n >= 3 * LANE) {
      uint64_t c1 = 0, c2 = 0;
      const unsigned char *q = p;
      for (size_t i = 0; i < LANE; i += 8, q += 8) {
        uint64_t v0, v1, v2;
        memcpy(&v0, q, 8);
        memcpy(&v1, q + LANE, 8);
        memcpy(&v2, q + 2 * LANE, 8);
        c = __builtin_ia32_crc32di(c, v0);
        c1 = __builtin_ia32_crc32di(c1, v1);
        c2 = __builtin_ia32_crc32di(c2, v2);
      }
      c = multmodp(shift_lane2, (uint32_t)c) ^ multmodp(shift_lane, (uint32_t)c1) ^ (uint32_t)c2;
      p += 3 * LANE;
      n -= 3 * LANE;
    }
  }
  c = crc_sse42_1(c, p, n);
  p += n / 8 * 8;
  n %= 8;
  uint32_t c32 = (uint32_t)c;
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

#ifdef PX_HAVE_SSE42_PATH
static int have_sse42;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static void cpu_check(void) { have_sse42 = __builtin_cpu_supports("sse4.2") ? 1 : 0; }
#endif

uint32_t px_ckpt_crc32c(uint32_t crc, const void *data, size_t n) {
  const unsigned char *p = data;
  crc = ~crc;
#ifdef PX_HAVE_SSE42_PATH
  pthread_once(&cpu_once, cpu_check);
  if (have_sse42) return ~crc_sse42(crc, p, n);
#endif
  return ~crc_table8(crc, p, n);
}

uint32_t px_ckpt_crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
  return multmodp(xpow8n(len_b), crc_a) ^ crc_b;
}

// The second half of a px_ckpt_crc32c_wide, on its own thread.
typedef struct half {
  const unsigned char *p;
  size_t n;
  uint32_t crc;
} half;

static void *crc_half(void *arg) {
  half *h = arg;
  h->crc = px_ckpt_crc32c(0, h->p, h->n);
  return NULL;
}

uint32_t px_ckpt_crc32c_wide(const void *data, size_t n) {
  const unsigned char *p = data;
  if (n < PX_CKPT_CRC_WIDE_MIN) return px_ckpt_crc32c(0, p, n);
  half h = {p + n / 2, n - n / 2, 0};
  pthread_t t;
  if (pthread_create(&t, NULL, crc_half, &h) != 0) return px_ckpt_crc32c(0, p, n);
  const uint32_t a = px_ckpt_crc32c(0, p, n / 2);
  pthread_join(t, NULL);
  return px_ckpt_crc32c_combine(a, h.crc, h.n);
}

uint32_t px_ckpt_crc32c_portable(uint32_t crc, const void *data, size_t n) { return ~crc_table8(~crc, data, n); }
