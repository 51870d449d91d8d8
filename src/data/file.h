/* Whole-file reads for the data sources (internal).
 *
 * IDX files, vocabularies and text corpora are read whole; a file that
 * starts with gzip's magic (1F 8B) is inflated, whatever its name, so
 * "train-images-idx3-ubyte.gz" and "wiki.train.tokens.gz" read like their
 * plain forms.  Every path here may also be an s3:// URL (s3.h). */
#ifndef PX_DATA_FILE_H
#define PX_DATA_FILE_H

#include "plexus/base.h"

/* Inflate gzip data (one or more concatenated members, as gzip(1) writes
 * them).  `name` and `what` ("idx", "text", ...) are for messages.  Errors:
 * corrupt data, a CRC or length mismatch, data cut short, bytes after the
 * last member.  *out is malloc'ed (at least 1 byte). */
px_status px_data_gunzip(const void *buf, size_t n, const char *what, const char *name, void **out, size_t *out_n);

/* Read a whole file; inflate it when it is gzip by content (gunzip).  An
 * "s3://bucket/key" path reads the object (s3.h: one GET, or the cache). */
px_status px_data_read_file(const char *path, const char *what, bool gunzip, void **out, size_t *out_n);

static inline bool px_data_is_gzip(const void *buf, size_t n) {
  const unsigned char *b = buf;
  return n >= 2 && b[0] == 0x1f && b[1] == 0x8b;
}

#endif
