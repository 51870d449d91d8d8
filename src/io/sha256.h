// SHA-256 (FIPS 180-4), internal to the io layer: checkpoints list the
// SHA-256 of every file in SHA256SUMS, the format `sha256sum -c` reads.
//
// Two implementations of the compression function, chosen once at run time:
// the portable C one, and one with the x86 SHA extensions (SHA-NI: Intel
// since Goldmont / Ice Lake, AMD since Zen), about 5× faster.  Both are
// checked against the NIST vectors in the tests.
#ifndef PX_IO_SHA256_H
#define PX_IO_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plexus/base.h"

#define PX_SHA256_BYTES 32
#define PX_SHA256_HEX 65  // 64 lowercase hex digits + NUL

// Compress n_blocks 64-byte blocks of p into the state h.
typedef void (*px_sha256_blocks_fn)(uint32_t h[8], const unsigned char *p, size_t n_blocks);

typedef struct px_sha256 {
  uint32_t h[8];
  uint64_t n_bytes;       // message length so far
  unsigned char buf[64];  // a partial block
  size_t buf_len;
  px_sha256_blocks_fn blocks;
} px_sha256;

typedef enum px_sha256_impl {
  PX_SHA256_BEST = 0,  // SHA-NI when the CPU has it, else portable
  PX_SHA256_PORTABLE,
  PX_SHA256_SHANI,  // falls back to portable where unavailable
} px_sha256_impl;

void px_sha256_init(px_sha256 *s);
// For tests that check each implementation.
void px_sha256_init_impl(px_sha256 *s, px_sha256_impl impl);
void px_sha256_update(px_sha256 *s, const void *data, size_t n);
void px_sha256_final(px_sha256 *s, unsigned char digest[PX_SHA256_BYTES]);
// px_sha256_update(a, pa, na) and px_sha256_update(b, pb, nb) at once:
// with SHA-NI, the whole blocks the two have in common run with the two
// messages' rounds interleaved on one core (one stream leaves the SHA unit
// waiting on each round's result; two ran 1.75x as fast in all here), the
// rest one message at a time.
void px_sha256_update2(px_sha256 *a, const void *pa, size_t na, px_sha256 *b, const void *pb, size_t nb);

// Whether this CPU and build can run the SHA-NI implementation.
bool px_sha256_have_shani(void);
// "sha-ni" or "portable": what px_sha256_init picks here.
const char *px_sha256_impl_name(void);

// One call: digest of n bytes.
void px_sha256_bytes(const void *data, size_t n, unsigned char digest[PX_SHA256_BYTES]);
// Lowercase hex, as sha256sum prints it.
void px_sha256_hex(const unsigned char digest[PX_SHA256_BYTES], char hex[PX_SHA256_HEX]);

// Digest of a file read in pieces (never whole in memory); *size (may be
// NULL) receives its length.  Errors (PX_ERR_IO) name the file.
px_status px_sha256_file(const char *path, unsigned char digest[PX_SHA256_BYTES], uint64_t *size);

#endif
