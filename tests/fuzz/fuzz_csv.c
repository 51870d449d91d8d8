// libFuzzer target: the strict CSV reader, the ImageNet synset mapping and
// PredictionString parsing, and both image listings built on them
// (src/data/csv.c).  Any input must give PX_OK or an error with a message —
// never a crash, an out-of-bounds read, a leak, or a listing whose labels
// fall outside [0, num_classes).
//
// The first byte picks what the rest is: a "path,label" listing, an ImageNet
// listing (against a fixed three-class mapping), or a synset mapping whose
// own words are then looked up.
#include "data/csv.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_listing(const px_image_listing *l) {
  for (size_t k = 0; k < l->count; k++) {
    if (l->labels[k] < 0 || (size_t)l->labels[k] >= l->num_classes || !l->paths[k] || !l->paths[k][0]) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int mode = data[0] % 4;
  const char *text = (const char *)data + 1;
  size_t n = size - 1;
  px_image_listing l;
  if (mode == 0) {
    if (px_image_listing_parse(text, n, "fuzz.csv", PX_CSV_PATH_LABEL, NULL, "/root", &l) == PX_OK) {
      check_listing(&l);
      px_image_listing_free(&l);
    } else if (!px_last_error()[0]) {
      abort();  // an error without a message
    }
  } else if (mode == 1) {
    static const char map[] = "n01440764 tench\nn01443537 goldfish\nn01484850 shark\n";
    px_synsets s;
    if (px_synsets_parse(map, sizeof map - 1, "map", &s) != PX_OK) abort();
    if (px_image_listing_parse(text, n, "fuzz.csv", PX_CSV_IMAGENET, &s, "", &l) == PX_OK) {
      if (l.num_classes != 3) abort();
      check_listing(&l);
      px_image_listing_free(&l);
    } else if (!px_last_error()[0]) {
      abort();
    }
    px_synsets_free(&s);
  } else if (mode == 2) {
    px_synsets s;
    if (px_synsets_parse(text, n, "fuzz.txt", &s) == PX_OK) {
      // Every class is found under its own name, at its own index.
      for (size_t k = 0; k < s.count; k++)
        if (px_synsets_find(&s, s.names[k], strlen(s.names[k])) != (int64_t)k) abort();
      px_synsets_free(&s);
    }
  } else {
    // Raw records: fields are NUL-terminated and their lengths agree.
    px_csv c;
    px_csv_init(&c, text, n, "fuzz.csv");
    bool got = true;
    while (got && px_csv_next(&c, &got) == PX_OK && got) {
      for (int k = 0; k < c.nfields; k++)
        if (strlen(px_csv_field(&c, k)) != c.len[k]) abort();
      // The PredictionString splitter on every field.
      const char *w;
      size_t wl;
      px_imagenet_first_synset(px_csv_field(&c, c.nfields - 1), &w, &wl);
      if (wl > c.len[c.nfields - 1]) abort();
      int32_t label;
      (void)px_csv_parse_label(px_csv_field(&c, 0), "fuzz.csv", c.line, &label);
    }
    px_csv_free(&c);
  }
  return 0;
}
