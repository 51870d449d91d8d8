// libFuzzer target: the token shard header check (src/data/tokens.c,
// px_shard_parse_header).  Any header and any claimed file size must give
// PX_OK or an error with a message; an accepted header must describe a file
// of exactly the claimed size, 1024 + count · token_bytes bytes.
//
// Input: 8 bytes of little-endian file size, then the header bytes (of any
// length; a real header is 1024).  The header is also checked against its
// own length, as a whole shard held in memory.
#include "plexus/data.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *h, size_t n, uint64_t file_size) {
  px_shard_info info;
  px_clear_error();
  if (px_shard_parse_header(h, n, file_size, "fuzz.bin", &info) != PX_OK) {
    if (!px_last_error()[0] || info.num_tokens || info.token_bytes) abort();
    return;
  }
  if (info.token_bytes != 2 && info.token_bytes != 4) abort();
  if (n < PX_SHARD_HEADER_BYTES || info.num_tokens > INT32_MAX) abort();
  if (PX_SHARD_HEADER_BYTES + info.num_tokens * (uint64_t)info.token_bytes != file_size) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 8) return 0;
  uint64_t file_size = 0;
  for (int k = 7; k >= 0; k--) file_size = file_size << 8 | data[k];
  check(data + 8, size - 8, file_size);
  check(data + 8, size - 8, size - 8);
  return 0;
}
