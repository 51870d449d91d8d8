// The IDX image dataset (data.h, px_idx_dataset_open, px_mnist_open).
//
// Both files are read, checked and held in memory at open (Fashion-MNIST's
// training set is 47 MB of pixels); get is a table lookup per pixel,
//   x[k] = lut[v],  lut[v] = (v/255 - mean) / std,
// into the sample's batch row, and reads nothing shared that changes.
// The files may be s3:// objects (data/s3.h), read whole like local ones.
#define _POSIX_C_SOURCE 200809L
#include "plexus/data.h"

#include "data/s3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct idx_source {
  px_idx images;  // (N, H, W) u8
  px_idx labels;  // (N,) u8
  size_t pixels;  // H·W
  float lut[256];
} idx_source;

static px_status idx_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  (void)rng;
  const idx_source *s = d->impl;
  const uint8_t *src = (const uint8_t *)s->images.data + i * s->pixels;
  float *x = (float *)b->x.data + slot * s->pixels;
  for (size_t k = 0; k < s->pixels; k++) x[k] = s->lut[src[k]];
  ((int32_t *)b->y.data)[slot] = ((const uint8_t *)s->labels.data)[i];
  return PX_OK;
}

static void idx_destroy(px_dataset *d) {
  idx_source *s = d->impl;
  if (s) {
    px_idx_free(&s->images);
    px_idx_free(&s->labels);
    free(s);
  }
  free(d);
}

static const px_dataset_ops idx_ops = {idx_get, idx_destroy};

px_status px_idx_dataset_open(px_dataset **out, const char *images_path, const char *labels_path, float mean,
                              float std) {
  if (!out) return px_error(PX_ERR_INVALID, "idx dataset: NULL output");
  *out = NULL;
  if (!images_path || !labels_path) return px_error(PX_ERR_INVALID, "idx dataset: need an images and a labels file");
  if (!isfinite(mean) || !isfinite(std) || !(std > 0))
    return px_error(PX_ERR_INVALID, "idx dataset %s: mean %g and std %g must be finite and std > 0", images_path,
                    (double)mean, (double)std);
  idx_source *s = calloc(1, sizeof *s);
  px_dataset *d = calloc(1, sizeof *d);
  if (!s || !d) {
    free(s);
    free(d);
    return px_error(PX_ERR_NOMEM, "idx dataset %s: out of memory", images_path);
  }
  px_status st = px_idx_read(images_path, &s->images);
  if (st == PX_OK) st = px_idx_read(labels_path, &s->labels);
  const px_idx *im = &s->images, *lb = &s->labels;
  if (st == PX_OK && (im->dtype != PX_U8 || im->ndim != 3))
    st = px_error(PX_ERR_FORMAT, "idx dataset: images %s hold %d-dim %s data; expected N×H×W u8 (an idx3-ubyte file)",
                  images_path, im->ndim, px_dtype_name(im->dtype));
  if (st == PX_OK && (lb->dtype != PX_U8 || lb->ndim != 1))
    st = px_error(PX_ERR_FORMAT, "idx dataset: labels %s hold %d-dim %s data; expected N u8 (an idx1-ubyte file)",
                  labels_path, lb->ndim, px_dtype_name(lb->dtype));
  if (st == PX_OK && (im->dims[0] == 0 || im->dims[1] == 0 || im->dims[2] == 0))
    st = px_error(PX_ERR_FORMAT, "idx dataset: images %s are %lld×%lld×%lld: no pixels", images_path,
                  (long long)im->dims[0], (long long)im->dims[1], (long long)im->dims[2]);
  if (st == PX_OK && im->dims[0] != lb->dims[0])
    st = px_error(PX_ERR_FORMAT, "idx dataset: images %s hold %lld images but labels %s hold %lld labels", images_path,
                  (long long)im->dims[0], labels_path, (long long)lb->dims[0]);
  if (st != PX_OK) {
    d->impl = s;
    idx_destroy(d);
    return st;
  }
  uint8_t max_label = 0;
  const uint8_t *labels = lb->data;
  for (int64_t i = 0; i < lb->dims[0]; i++)
    if (labels[i] > max_label) max_label = labels[i];
  s->pixels = (size_t)im->dims[1] * (size_t)im->dims[2];
  for (int v = 0; v < 256; v++) s->lut[v] = ((float)v / 255.0f - mean) / std;
  d->ops = &idx_ops;
  d->kind = "idx";
  d->length = (size_t)im->dims[0];
  d->x_dtype = PX_F32;
  d->y_dtype = PX_I32;
  d->x_ndim = 3;
  d->x_shape[0] = 1;
  d->x_shape[1] = im->dims[1];
  d->x_shape[2] = im->dims[2];
  d->y_ndim = 0;
  d->num_classes = (size_t)max_label + 1;
  d->impl = s;
  *out = d;
  return PX_OK;
}

// dir/name if it exists, else dir/name.gz if that does; *out NULL if
// neither.  dir may be an s3:// prefix: then existence is a HEAD request,
// and an error other than a missing object (credentials, bucket) is
// returned as it is.
static px_status find_file(const char *dir, const char *name, char **out) {
  *out = NULL;
  size_t cap = strlen(dir) + strlen(name) + 8;
  char *p = malloc(cap);
  if (!p) return px_error(PX_ERR_NOMEM, "mnist %s: out of memory", dir);
  bool s3 = px_s3_is_url(dir);
  for (int gz = 0; gz < 2; gz++) {
    snprintf(p, cap, "%s%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", name, gz ? ".gz" : "");
    if (s3) {
      uint64_t size;
      bool missing_key;
      px_status st = px_s3_size(p, "mnist", &size, &missing_key);
      if (st == PX_OK) {
        *out = p;
        return PX_OK;
      }
      if (!missing_key) {
        free(p);
        return st;
      }
    } else {
      struct stat sb;
      if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
        *out = p;
        return PX_OK;
      }
    }
  }
  free(p);
  return PX_OK;
}

px_status px_mnist_open(px_dataset **out, const char *dir, const char *split, float mean, float std) {
  if (!out) return px_error(PX_ERR_INVALID, "mnist: NULL output");
  *out = NULL;
  if (!dir || !*dir) return px_error(PX_ERR_INVALID, "mnist: no directory given");
  const char *prefix;
  if (split && strcmp(split, "train") == 0) prefix = "train";
  else if (split && strcmp(split, "test") == 0) prefix = "t10k";
  else
    return px_error(PX_ERR_INVALID, "mnist %s: split \"%s\"; expected \"train\" or \"test\"", dir,
                    split ? split : "(null)");
  char images_name[64], labels_name[64];
  snprintf(images_name, sizeof images_name, "%s-images-idx3-ubyte", prefix);
  snprintf(labels_name, sizeof labels_name, "%s-labels-idx1-ubyte", prefix);
  char *images = NULL, *labels = NULL;
  px_status st = find_file(dir, images_name, &images);
  if (st == PX_OK) st = find_file(dir, labels_name, &labels);
  if (st == PX_OK && (!images || !labels))
    st = px_error(PX_ERR_NOT_FOUND, "mnist %s: %s not found, plain or .gz (the %s split needs %s and %s)", dir,
                  images ? labels_name : images_name, split, images_name, labels_name);
  if (st == PX_OK) st = px_idx_dataset_open(out, images, labels, mean, std);
  free(images);
  free(labels);
  return st;
}
