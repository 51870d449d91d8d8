// px_digest_sha256: the io layer's SHA-256 (sha256.c, SHA-NI where the CPU
// has it) for callers outside the library's internals, such as `plexus
// inspect`, which prints a digest of every tensor.
#include "plexus/io.h"
#include "io/sha256.h"

void px_digest_sha256(const void *data, size_t n, char hex[65]) {
  unsigned char d[PX_SHA256_BYTES];
  px_sha256_bytes(data, n, d);
  px_sha256_hex(d, hex);
}
