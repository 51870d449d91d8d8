/* Strict CSV reading for image listings (internal).
 *
 * RFC 4180 records: fields separated by commas, a field may be quoted with
 * "..." and then holds commas, newlines and "" (one quote).  LF or CRLF end
 * a record; a UTF-8 byte order mark at the start is skipped; empty lines are
 * skipped.  Errors — an unterminated quote, a quote inside an unquoted
 * field, text after a closing quote, a NUL byte — name the file and line.
 *
 * On top of it, the two listings px_image_dataset_open reads (data.h):
 *   PX_CSV_PATH_LABEL: header "path,label", label a non-negative integer;
 *   PX_CSV_IMAGENET:   header "ImageId,PredictionString", the label the
 *                      class index of the first synset of the prediction
 *                      string in LOC_synset_mapping.txt. */
#ifndef PX_DATA_CSV_H
#define PX_DATA_CSV_H

#include "plexus/data.h"

typedef struct px_csv {
  const char *name; /* file name for messages */
  const char *text;
  size_t size, pos;
  size_t line; /* 1-based line where the current record starts */
  size_t next_line;
  char *buf; /* the record's fields, unescaped, each NUL-terminated */
  size_t buf_cap;
  size_t *start; /* (nfields,) offset of field k in buf */
  size_t *len;   /* (nfields,) its length */
  int nfields, fields_cap;
} px_csv;

void px_csv_init(px_csv *c, const char *text, size_t size, const char *name);
/* Read the next record: *got = false at the end of the input. */
px_status px_csv_next(px_csv *c, bool *got);
static inline const char *px_csv_field(const px_csv *c, int k) { return c->buf + c->start[k]; }
void px_csv_free(px_csv *c);

/* A non-negative decimal integer below 2^31, digits only. */
px_status px_csv_parse_label(const char *s, const char *name, size_t line, int32_t *out);

/* LOC_synset_mapping.txt: line k is "<synset> <description>"; class k. */
typedef struct px_synsets {
  char **names;  /* (count,) synset of class k */
  size_t *order; /* (count,) classes sorted by name, for lookup */
  size_t count;
} px_synsets;

px_status px_synsets_parse(const char *text, size_t size, const char *name, px_synsets *out);
/* Class index of a synset, or -1. */
int64_t px_synsets_find(const px_synsets *s, const char *synset, size_t len);
void px_synsets_free(px_synsets *s);

/* The first word of an ImageNet PredictionString ("n01751748 343 3 490 234
 * ..."): *word points into s, *len its length (0 when there is none). */
void px_imagenet_first_synset(const char *s, const char **word, size_t *len);

/* A parsed listing: the image paths (root joined) and labels. */
typedef struct px_image_listing {
  char **paths;    /* (count,) */
  int32_t *labels; /* (count,) */
  size_t *lines;   /* (count,) CSV line of each record, for messages */
  size_t count;
  size_t num_classes;
} px_image_listing;

/* Parse a listing held in memory.  synsets: required for the ImageNet
 * layout (its count is num_classes), ignored otherwise.  root: prefix of
 * every path ("" or NULL: none). */
px_status px_image_listing_parse(const char *text, size_t size, const char *csv_name, px_csv_layout layout,
                                 const px_synsets *synsets, const char *root, px_image_listing *out);
void px_image_listing_free(px_image_listing *l);

#endif
