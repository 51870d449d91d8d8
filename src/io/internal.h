// Internal helpers of the io layer shared by its files in src/io/.
#ifndef PX_IO_INTERNAL_H
#define PX_IO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "plexus/io.h"

/* ---- atomic writes: base/atomic.c (libc only; data/ writes files too) ---- */
#include "base/internal.h"

/* ---- safetensors (safetensors.c, safetensors_header.c) -------------------- */

// The reference implementation's limit; a bigger "header" is another file.
#define PX_ST_MAX_HEADER 100000000u

typedef struct px_st_span {
  uint64_t begin, end;  // [begin, end) in the body
} px_st_span;

typedef struct px_st_meta {
  char *key;
  char *value;
} px_st_meta;

struct px_safetensors {
  char *path;
  unsigned char *bytes;  // the whole file
  size_t size;
  unsigned char *body;  // bytes + 8 + N
  size_t body_size;
  px_named_tensor *tensors;  // in header order; views into body
  px_st_span *spans;         // tensors[i] holds body[spans[i].begin, spans[i].end)
  int count, cap;
  int *by_name;      // tensor indices sorted by name
  px_st_meta *meta;  // sorted by key once the header is parsed
  int n_meta, meta_cap;
  bool has_meta;
};

// Parses the n-byte JSON header of f (whose body and body_size are set),
// appending its tensors and metadata to f; checks each tensor's dtype, shape
// and offsets against the body.  Names unique and tensors disjoint are the
// caller's to check.
px_status px_st_parse_header(px_safetensors *f, const unsigned char *json, size_t n);

// numel(shape) · elem into *out; false on overflow.
bool px_st_nbytes(const int64_t *shape, int ndim, size_t elem, uint64_t *out);

// Well-formed UTF-8 (RFC 3629)?
bool px_st_utf8_valid(const char *s);

// The bytes px_safetensors_save writes for a state dict, as chunks: [0] the
// 8-byte header length, [1] the JSON header, then each tensor's bytes (views
// of the state dict, no copies).  A checkpoint writes and hashes them in one
// pass.  Do not move img while chunks[0] points into it.
typedef struct px_st_image {
  px_io_chunk *chunks;
  int n_chunks;
  unsigned char len_le[8];
  char *header;
} px_st_image;

// Validates sd and metadata as px_safetensors_save does (errors name path).
px_status px_st_image_build(const char *path, const px_state_dict *sd, const px_kv *metadata, int n_metadata,
                            px_st_image *img);
void px_st_image_free(px_st_image *img);

// px_safetensors_open over bytes already in memory (ownership of the malloc'ed
// bytes passes to the file, also on failure); path names it in messages.
px_status px_st_open_buffer(const char *path, unsigned char *bytes, size_t size, px_safetensors **out);
// px_safetensors_load from an opened file: all checks, then the copies.
px_status px_st_load_open(const px_safetensors *f, const px_state_dict *sd, bool strict);

#endif
