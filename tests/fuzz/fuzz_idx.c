// libFuzzer target: the IDX parser and the gzip inflater in front of it
// (src/data/idx.c, src/data/file.c).  Any input must give PX_OK or an error
// with a message — never a crash, an out-of-bounds read, a leak — and a
// parse that succeeds must describe exactly the bytes it was given.
//
// The first byte picks the path: the rest parsed as IDX, or inflated as
// gzip and then (if that worked) parsed as IDX, as px_idx_read does.
#include "data/file.h"
#include "plexus/data.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse(const uint8_t *buf, size_t n) {
  px_idx idx;
  if (px_idx_parse(buf, n, "fuzz.idx", &idx) != PX_OK) {
    if (!px_last_error()[0] || idx.data || idx.ndim || idx.nbytes) abort();
    return;
  }
  if (idx.ndim < 1 || idx.ndim > 8 || !idx.data) abort();
  size_t count = 1;
  for (int i = 0; i < idx.ndim; i++) {
    if (idx.dims[i] < 0) abort();
    count *= (size_t)idx.dims[i];
  }
  if (count * px_dtype_size(idx.dtype) != idx.nbytes || 4 + 4 * (size_t)idx.ndim + idx.nbytes != n) abort();
  // Every byte is there (ASan checks the copy's bounds).
  void *copy = malloc(idx.nbytes ? idx.nbytes : 1);
  if (!copy) abort();
  memcpy(copy, idx.data, idx.nbytes);
  free(copy);
  px_idx_free(&idx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  px_clear_error();
  if (data[0] & 1) {
    parse(data + 1, size - 1);
    return 0;
  }
  void *plain;
  size_t n;
  if (px_data_gunzip(data + 1, size - 1, "idx", "fuzz.gz", &plain, &n) != PX_OK) {
    if (!px_last_error()[0]) abort();
    return 0;
  }
  parse(plain, n);
  free(plain);
  return 0;
}
