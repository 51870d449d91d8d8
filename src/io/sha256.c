// SHA-256 after FIPS 180-4: a message is padded to a multiple of 512 bits
// (a 1 bit, zeros, the bit length as a 64-bit big-endian number) and folded
// block by block into eight 32-bit words H0..H7.  Per 64-byte block:
//
//   W[t]   = the block's 16 big-endian words                       t < 16
//   W[t]   = σ1(W[t-2]) + W[t-7] + σ0(W[t-15]) + W[t-16]           16 ≤ t < 64
//   64 rounds:  T1 = h + Σ1(e) + Ch(e,f,g) + K[t] + W[t]
//               T2 = Σ0(a) + Maj(a,b,c)
//               h=g g=f f=e e=d+T1 d=c c=b b=a a=T1+T2
//   H += (a..h)
//
//   Σ0(x) = x⋙2 ^ x⋙13 ^ x⋙22     Σ1(x) = x⋙6 ^ x⋙11 ^ x⋙25
//   σ0(x) = x⋙7 ^ x⋙18 ^ x≫3      σ1(x) = x⋙17 ^ x⋙19 ^ x≫10
//
// K are the first 32 bits of the fractional parts of the cube roots of the
// first 64 primes, the initial H those of the square roots of the first 8.
#define _POSIX_C_SOURCE 200809L
#include "io/sha256.h"
#include "io/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define PX_SHA256_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

static const uint32_t K[64] = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

/* ---- portable ------------------------------------------------------------ */

static inline uint32_t rotr(uint32_t x, int n) { return x >> n | x << (32 - n); }

static inline uint32_t load_be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void blocks_portable(uint32_t h[8], const unsigned char *p, size_t n_blocks) {
  for (; n_blocks--; p += 64) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++) w[t] = load_be32(p + 4 * t);
    for (int t = 16; t < 64; t++) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = s1 + w[t - 7] + s0 + w[t - 16];
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
      uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
  }
}

/* ---- x86 SHA extensions ---------------------------------------------------
 * sha256rnds2(cdgh, abef, wk) runs two rounds on the state held as ABEF and
 * CDGH (lane 0 = the last letter) with the two words W+K in wk's low half.
 * The schedule works on X_g = W[4g..4g+3]:
 *   msg1(X_{g-4}, X_{g-3})            = X_{g-4} + σ0(W[4g-15..4g-12])
 *   alignr(X_{g-1}, X_{g-2}, 4 bytes) = W[4g-7..4g-4]
 *   msg2(sum, X_{g-1})                = sum + σ1(W[4g-2..4g+1])  = X_g
 * X_{g+1} is finished during group g, and X_{g-1} (no longer needed raw)
 * is turned into msg1's part of X_{g+3}: four registers carry the schedule. */
#ifdef PX_SHA256_X86
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_shani(uint32_t h[8], const unsigned char *p,
                                                                     size_t n_blocks) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i abcd = _mm_loadu_si128((const __m128i *)&h[0]);
  __m128i efgh = _mm_loadu_si128((const __m128i *)&h[4]);
  // (A B C D), (E F G H) in lane order -> ABEF and CDGH, last letter in lane 0.
  __m128i cdab = _mm_shuffle_epi32(abcd, 0xB1);
  efgh = _mm_shuffle_epi32(efgh, 0x1B);
  __m128i s0 = _mm_alignr_epi8(cdab, efgh, 8);
  __m128i s1 = _mm_blend_epi16(efgh, cdab, 0xF0);

  for (; n_blocks--; p += 64) {
    __m128i save0 = s0, save1 = s1;
    __m128i x[4];
#pragma GCC unroll 16
    for (int g = 0; g < 16; g++) {
      if (g < 4) x[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), bswap);
      __m128i wk = _mm_add_epi32(x[g & 3], _mm_loadu_si128((const __m128i *)&K[4 * g]));
      s1 = _mm_sha256rnds2_epu32(s1, s0, wk);
      if (g >= 3 && g <= 14) {
        __m128i w7 = _mm_alignr_epi8(x[g & 3], x[(g - 1) & 3], 4);
        x[(g + 1) & 3] = _mm_sha256msg2_epu32(_mm_add_epi32(x[(g + 1) & 3], w7), x[g & 3]);
      }
      s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(wk, 0x0E));
      if (g >= 1 && g <= 12) x[(g - 1) & 3] = _mm_sha256msg1_epu32(x[(g - 1) & 3], x[g & 3]);
    }
    s0 = _mm_add_epi32(s0, save0);
    s1 = _mm_add_epi32(s1, save1);
  }
  // ABEF, CDGH -> (A B C D), (E F G H).
  __m128i feba = _mm_shuffle_epi32(s0, 0x1B);
  __m128i dchg = _mm_shuffle_epi32(s1, 0xB1);
  _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}
// Two messages' blocks at once: the rounds of blocks_shani for each,
// interleaved, so one's sha256rnds2 runs while the other's result is due.
__attribute__((target("sha,sse4.1,ssse3"))) static void
blocks_shani2(uint32_t ha[8], uint32_t hb[8], const unsigned char *p, const unsigned char *q, size_t n_blocks) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i s0, s1, t0, t1;
  {
    __m128i abcd = _mm_loadu_si128((const __m128i *)&ha[0]), efgh = _mm_loadu_si128((const __m128i *)&ha[4]);
    __m128i cdab = _mm_shuffle_epi32(abcd, 0xB1);
    efgh = _mm_shuffle_epi32(efgh, 0x1B);
    s0 = _mm_alignr_epi8(cdab, efgh, 8);
    s1 = _mm_blend_epi16(efgh, cdab, 0xF0);
    abcd = _mm_loadu_si128((const __m128i *)&hb[0]);
    efgh = _mm_loadu_si128((const __m128i *)&hb[4]);
    cdab = _mm_shuffle_epi32(abcd, 0xB1);
    efgh = _mm_shuffle_epi32(efgh, 0x1B);
    t0 = _mm_alignr_epi8(cdab, efgh, 8);
    t1 = _mm_blend_epi16(efgh, cdab, 0xF0);
  }
  for (; n_blocks--; p += 64, q += 64) {
    const __m128i a0 = s0, a1 = s1, b0 = t0, b1 = t1;
    __m128i x[4], y[4];
#pragma GCC unroll 16
    for (int g = 0; g < 16; g++) {
      if (g < 4) {
        x[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), bswap);
        y[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(q + 16 * g)), bswap);
      }
      const __m128i k = _mm_loadu_si128((const __m128i *)&K[4 * g]);
      const __m128i wk = _mm_add_epi32(x[g & 3], k), vk = _mm_add_epi32(y[g & 3], k);
      s1 = _mm_sha256rnds2_epu32(s1, s0, wk);
      t1 = _mm_sha256rnds2_epu32(t1, t0, vk);
      if (g >= 3 && g <= 14) {
        __m128i w7 = _mm_alignr_epi8(x[g & 3], x[(g - 1) & 3], 4), v7 = _mm_alignr_epi8(y[g & 3], y[(g - 1) & 3], 4);
        x[(g + 1) & 3] = _mm_sha256msg2_epu32(_mm_add_epi32(x[(g + 1) & 3], w7), x[g & 3]);
        y[(g + 1) & 3] = _mm_sha256msg2_epu32(_mm_add_epi32(y[(g + 1) & 3], v7), y[g & 3]);
      }
      s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(wk, 0x0E));
      t0 = _mm_sha256rnds2_epu32(t0, t1, _mm_shuffle_epi32(vk, 0x0E));
      if (g >= 1 && g <= 12) {
        x[(g - 1) & 3] = _mm_sha256msg1_epu32(x[(g - 1) & 3], x[g & 3]);
        y[(g - 1) & 3] = _mm_sha256msg1_epu32(y[(g - 1) & 3], y[g & 3]);
      }
    }
    s0 = _mm_add_epi32(s0, a0);
    s1 = _mm_add_epi32(s1, a1);
    t0 = _mm_add_epi32(t0, b0);
    t1 = _mm_add_epi32(t1, b1);
  }
  __m128i feba = _mm_shuffle_epi32(s0, 0x1B), dchg = _mm_shuffle_epi32(s1, 0xB1);
  _mm_storeu_si128((__m128i *)&ha[0], _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128((__m128i *)&ha[4], _mm_alignr_epi8(dchg, feba, 8));
  feba = _mm_shuffle_epi32(t0, 0x1B);
  dchg = _mm_shuffle_epi32(t1, 0xB1);
  _mm_storeu_si128((__m128i *)&hb[0], _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128((__m128i *)&hb[4], _mm_alignr_epi8(dchg, feba, 8));
}
#endif

bool px_sha256_have_shani(void) {
#ifdef PX_SHA256_X86
  static _Atomic int cached = -1;  // every thread that races here computes the same answer
  if (cached < 0) {
    unsigned a, b, c, d;
    bool ok = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSSE3) && (c & bit_SSE4_1) &&
      __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));  // CPUID.7.0:EBX.SHA
    cached = ok;
  }
  return cached == 1;
#else
  return false;
#endif
}

const char *px_sha256_impl_name(void) { return px_sha256_have_shani() ? "sha-ni" : "portable"; }

/* ---- streaming ----------------------------------------------------------- */

void px_sha256_init_impl(px_sha256 *s, px_sha256_impl impl) {
  memcpy(s->h, H0, sizeof H0);
  s->n_bytes = 0;
  s->buf_len = 0;
  s->blocks = blocks_portable;
#ifdef PX_SHA256_X86
  if (impl != PX_SHA256_PORTABLE && px_sha256_have_shani()) s->blocks = blocks_shani;
#else
  (void)impl;
#endif
}

void px_sha256_init(px_sha256 *s) { px_sha256_init_impl(s, PX_SHA256_BEST); }

void px_sha256_update(px_sha256 *s, const void *data, size_t n) {
  if (n == 0) return;  // data may be NULL then
  const unsigned char *p = data;
  s->n_bytes += n;
  if (s->buf_len) {
    size_t take = 64 - s->buf_len < n ? 64 - s->buf_len : n;
    memcpy(s->buf + s->buf_len, p, take);
    s->buf_len += take;
    p += take;
    n -= take;
    if (s->buf_len < 64) return;
    s->blocks(s->h, s->buf, 1);
    s->buf_len = 0;
  }
  if (n >= 64) {
    s->blocks(s->h, p, n / 64);
    p += n / 64 * 64;
    n %= 64;
  }
  memcpy(s->buf, p, n);
  s->buf_len = n;
}

void px_sha256_update2(px_sha256 *a, const void *pa, size_t na, px_sha256 *b, const void *pb, size_t nb) {
#ifdef PX_SHA256_X86
  if (a->blocks == blocks_shani && b->blocks == blocks_shani) {
    // Each partial block filled from its own message first, then the
    // blocks both have, two at a time.
    size_t ka = a->buf_len ? 64 - a->buf_len : 0, kb = b->buf_len ? 64 - b->buf_len : 0;
    if (ka <= na && kb <= nb) {
      px_sha256_update(a, pa, ka);
      px_sha256_update(b, pb, kb);
      pa = (const unsigned char *)pa + ka;
      pb = (const unsigned char *)pb + kb;
      na -= ka;
      nb -= kb;
      const size_t k = (na < nb ? na : nb) / 64 * 64;
      if (k) {
        blocks_shani2(a->h, b->h, pa, pb, k / 64);
        a->n_bytes += k;
        b->n_bytes += k;
        pa = (const unsigned char *)pa + k;
        pb = (const unsigned char *)pb + k;
        na -= k;
        nb -= k;
      }
    }
  }
#endif
  px_sha256_update(a, pa, na);
  px_sha256_update(b, pb, nb);
}

void px_sha256_final(px_sha256 *s, unsigned char digest[PX_SHA256_BYTES]) {
  uint64_t bits = s->n_bytes * 8;
  // 0x80, zeros up to 56 mod 64, the 64-bit big-endian bit length.
  unsigned char pad[72] = {0x80};
  size_t npad = (s->buf_len < 56 ? 56 : 120) - s->buf_len;
  for (int i = 0; i < 8; i++) pad[npad + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
  uint64_t keep = s->n_bytes;
  px_sha256_update(s, pad, npad + 8);
  s->n_bytes = keep;
  for (int i = 0; i < 8; i++) {
    digest[4 * i + 0] = (unsigned char)(s->h[i] >> 24);
    digest[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
    digest[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
    digest[4 * i + 3] = (unsigned char)s->h[i];
  }
}

void px_sha256_bytes(const void *data, size_t n, unsigned char digest[PX_SHA256_BYTES]) {
  px_sha256 s;
  px_sha256_init(&s);
  px_sha256_update(&s, data, n);
  px_sha256_final(&s, digest);
}

void px_sha256_hex(const unsigned char digest[PX_SHA256_BYTES], char hex[PX_SHA256_HEX]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < PX_SHA256_BYTES; i++) {
    hex[2 * i] = digits[digest[i] >> 4];
    hex[2 * i + 1] = digits[digest[i] & 15];
  }
  hex[64] = '\0';
}

px_status px_sha256_file(const char *path, unsigned char digest[PX_SHA256_BYTES], uint64_t *size) {
  enum { PIECE = 1 << 20 };
  char why[128];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return px_error(err == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "cannot open %s: %s", path,
                    px_io_strerror(err, why, sizeof why));
  }
  unsigned char *buf = malloc(PIECE);
  if (!buf) {
    close(fd);
    return px_error(PX_ERR_NOMEM, "cannot allocate a buffer to hash %s", path);
  }
  px_sha256 s;
  px_sha256_init(&s);
  px_status st = PX_OK;
  for (;;) {
    ssize_t got = read(fd, buf, PIECE);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int err = errno;
      st = px_error(PX_ERR_IO, "reading %s failed: %s", path, px_io_strerror(err, why, sizeof why));
      break;
    }
    if (got == 0) break;
    px_sha256_update(&s, buf, (size_t)got);
  }
  free(buf);
  close(fd);
  if (st != PX_OK) return st;
  if (size) *size = s.n_bytes;
  px_sha256_final(&s, digest);
  return PX_OK;
}
