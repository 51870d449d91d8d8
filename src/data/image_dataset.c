// Images listed in a CSV (data.h, px_image_dataset_open).  The listing is
// read and checked whole at open; each get decodes one image and runs the
// fused transform (transform.c) straight into its batch row.
#define _POSIX_C_SOURCE 200809L
#include "data/csv.h"
#include "data/file.h"
#include "data/transform.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct image_source {
  px_image_listing list;
  px_transform t;
  int channels;
  int out_w, out_h;  // sample size (C, out_h, out_w)
  char *csv;         // for messages
} image_source;

static px_status image_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  image_source *s = d->impl;
  const char *path = s->list.paths[i];
  px_image img;
  px_status st = px_image_load(path, s->channels, &img);
  if (st != PX_OK)
    return px_error_wrap(st == PX_ERR_IO ? PX_ERR_IO : PX_ERR_FORMAT, "csv %s line %zu", s->csv, s->list.lines[i]);
  px_transform_plan plan;
  st = px_transform_plan_make(&s->t, &img, path, rng, &plan);
  if (st == PX_OK && (plan.out_w != s->out_w || plan.out_h != s->out_h))
    st = px_error(PX_ERR_FORMAT,
                  "image %s: %d×%d gives a %d×%d sample, but the dataset's samples are %d×%d (from its first image); "
                  "set a crop, or resize all images alike",
                  path, img.width, img.height, plan.out_w, plan.out_h, s->out_w, s->out_h);
  if (st != PX_OK) {
    px_image_free(&img);
    return px_error_wrap(PX_ERR_FORMAT, "csv %s line %zu", s->csv, s->list.lines[i]);
  }
  size_t per = (size_t)s->channels * (size_t)s->out_h * (size_t)s->out_w;
  px_transform_apply(&s->t, &img, &plan, (float *)b->x.data + slot * per);
  ((int32_t *)b->y.data)[slot] = s->list.labels[i];
  px_image_free(&img);
  return PX_OK;
}

static void image_destroy(px_dataset *d) {
  image_source *s = d->impl;
  if (s) {
    px_image_listing_free(&s->list);
    free(s->csv);
    free(s);
  }
  free(d);
}

static const px_dataset_ops image_ops = {image_get, image_destroy};

// The CSV's directory: "a/b/list.csv" -> "a/b", "list.csv" -> ".".
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  char *d = malloc((size_t)(slash - path) + 1);
  if (d) {
    memcpy(d, path, (size_t)(slash - path));
    d[slash - path] = '\0';
  }
  return d;
}

px_status px_image_dataset_open(px_dataset **out, const px_image_opts *opts) {
  if (!out) return px_error(PX_ERR_INVALID, "image dataset: NULL output");
  *out = NULL;
  if (!opts || !opts->csv || !*opts->csv) return px_error(PX_ERR_INVALID, "image dataset: no CSV listing given");
  if (opts->channels != 3 && opts->channels != 1)
    return px_error(PX_ERR_INVALID, "image dataset %s: channels must be 3 or 1, got %d", opts->csv, opts->channels);
  image_source *s = calloc(1, sizeof *s);
  px_dataset *d = calloc(1, sizeof *d);
  char *root = NULL, *text = NULL, *syn_text = NULL;
  px_synsets syn = {0};
  px_status st = (s && d) ? PX_OK : px_error(PX_ERR_NOMEM, "image dataset %s: out of memory", opts->csv);
  if (st == PX_OK) {
    s->channels = opts->channels;
    s->csv = strdup(opts->csv);
    root = opts->root ? strdup(opts->root) : dir_of(opts->csv);
    if (!s->csv || !root) st = px_error(PX_ERR_NOMEM, "image dataset %s: out of memory", opts->csv);
  }
  if (st == PX_OK)
    st = px_transform_init(&s->t, opts->resize, opts->crop, opts->random_crop, opts->hflip, opts->mean, opts->std);
  if (st == PX_OK && opts->layout == PX_CSV_IMAGENET) {
    if (!opts->synsets || !*opts->synsets)
      st = px_error(PX_ERR_INVALID, "image dataset %s: the ImageNet layout needs opts.synsets (LOC_synset_mapping.txt)",
                    opts->csv);
    size_t n = 0;
    if (st == PX_OK) st = px_data_read_file(opts->synsets, "synsets", false, (void **)&syn_text, &n);
    if (st == PX_OK) st = px_synsets_parse(syn_text, n, opts->synsets, &syn);
  }
  size_t n = 0;
  if (st == PX_OK) st = px_data_read_file(opts->csv, "csv", false, (void **)&text, &n);
  if (st == PX_OK) st = px_image_listing_parse(text, n, opts->csv, opts->layout, &syn, root, &s->list);
  free(text);
  free(syn_text);
  free(root);
  px_synsets_free(&syn);

  if (st == PX_OK) {
    if (opts->crop > 0) {
      s->out_w = s->out_h = opts->crop;
    } else {
      // Without a crop every sample must have the first image's size.
      px_image first;
      st = px_image_load(s->list.paths[0], s->channels, &first);
      if (st != PX_OK) {
        st = px_error_wrap(st, "image dataset %s line %zu: the first image sets the sample size (no crop)", opts->csv,
                           s->list.lines[0]);
      } else {
        px_transform_output_size(&s->t, first.width, first.height, &s->out_w, &s->out_h);
        px_image_free(&first);
      }
    }
  }
  if (st != PX_OK) {
    if (s) px_image_listing_free(&s->list);
    if (s) free(s->csv);
    free(s);
    free(d);
    return st;
  }
  d->ops = &image_ops;
  d->kind = "images";
  d->length = s->list.count;
  d->x_dtype = PX_F32;
  d->y_dtype = PX_I32;
  d->x_ndim = 3;
  d->x_shape[0] = s->channels;
  d->x_shape[1] = s->out_h;
  d->x_shape[2] = s->out_w;
  d->y_ndim = 0;
  d->num_classes = s->list.num_classes;
  d->impl = s;
  *out = d;
  return PX_OK;
}
