// Image datasets from a "path,label" CSV and from ImageNet's
// "ImageId,PredictionString" listing give the right labels, shapes and
// pixels, find train-layout images under <root>/<synset>/ and val-layout ones
// in <root>; malformed rows (a missing field, a bad or negative label, bad
// quoting), an unknown synset, a missing or differently sized image are
// errors that name the CSV and line, or the image file.  If this fails,
// a model trains on wrong labels, or a broken listing is found hours into a
// run — or never, with a message nobody can act on.
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"
#include "data/csv.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test_dir.h"

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  fputs(text, f);
  fclose(f);
}

// A w×h RGB image whose every pixel is (tag, tag+1, tag+2): each file is
// recognisable in the batch.
static void save_solid(const char *name, int w, int h, int tag) {
  px_image img = {.width = w, .height = h, .channels = 3, .data = malloc((size_t)w * h * 3)};
  for (int p = 0; p < w * h; p++)
    for (int k = 0; k < 3; k++) img.data[3 * p + k] = (uint8_t)(tag + k);
  CHECK_OK(px_image_save(in_dir(name), &img, 100));
  px_image_free(&img);
}

static void expect_open_error(const px_image_opts *o, const char *a, const char *b) {
  px_dataset *d = (px_dataset *)1;
  px_status st = px_image_dataset_open(&d, o);
  CHECK(st != PX_OK && d == NULL, "open of %s succeeded (want an error with \"%s\" and \"%s\")", o->csv, a, b);
  CHECK(strstr(px_last_error(), a) && strstr(px_last_error(), b), "message lacks \"%s\" or \"%s\": %s", a, b,
        px_last_error());
}

static void path_label_listing(void) {
  save_solid("a.png", 6, 5, 10);
  mkdir(in_dir("sub"), 0755);
  save_solid("sub/b.png", 6, 5, 50);
  save_solid("c.jpg", 6, 5, 90);
  // A quoted path with a comma and an escaped quote, and CRLF line ends.
  save_solid("we,ird\"name.png", 6, 5, 130);
  write_text(in_dir("list.csv"), "path,label\r\na.png,3\r\nsub/b.png,0\r\nc.jpg,7\r\n\"we,ird\"\"name.png\",1\r\n");
  px_image_opts o = PX_IMAGE_DEFAULTS;
  o.csv = in_dir("list.csv");
  px_dataset *d;
  CHECK_OK(px_image_dataset_open(&d, &o));
  CHECK(d->length == 4 && d->num_classes == 8, "length %zu, classes %zu; want 4 and 8 (max label 7 + 1)", d->length,
        d->num_classes);
  CHECK(d->x_ndim == 3 && d->x_shape[0] == 3 && d->x_shape[1] == 5 && d->x_shape[2] == 6 && d->y_ndim == 0,
        "sample shape (%lld,%lld,%lld), want (3,5,6) from the first image", (long long)d->x_shape[0],
        (long long)d->x_shape[1], (long long)d->x_shape[2]);
  px_batch b;
  CHECK_OK(px_batch_alloc(&b, d, 4));
  const int labels[4] = {3, 0, 7, 1}, tags[4] = {10, 50, 90, 130};
  for (size_t i = 0; i < 4; i++) {
    px_rng rng = px_rng_make(0, i);
    CHECK_OK(px_dataset_get(d, i, &b, 3 - i, &rng));  // rows in reverse: slot is honoured
    const float *x = (const float *)b.x.data + (3 - i) * 90;
    CHECK(((int32_t *)b.y.data)[3 - i] == labels[i], "sample %zu label %d, want %d", i, ((int32_t *)b.y.data)[3 - i],
          labels[i]);
    // Quality-100 JPEG of a flat colour: within 2 levels.
    for (int c = 0; c < 3; c++)
      CHECK(fabs(x[c * 30 + 17] * 255.0 - (tags[i] + c)) <= 2.0, "sample %zu channel %d is %g, want %d", i, c,
            x[c * 30 + 17] * 255.0, tags[i] + c);
  }
  px_batch_free(&b);
  px_dataset_free(d);

  // root overrides the CSV's directory.
  write_text(in_dir("elsewhere.csv"), "path,label\na.png,2\n");
  mkdir(in_dir("other"), 0755);
  rename(in_dir("elsewhere.csv"), in_dir("other/elsewhere.csv"));
  o.csv = in_dir("other/elsewhere.csv");
  o.root = dir;
  CHECK_OK(px_image_dataset_open(&d, &o));
  px_dataset_free(d);
  o.root = NULL;
  expect_open_error(&o, "a.png", "cannot open");  // other/a.png does not exist
}

static void bad_rows_name_csv_and_line(void) {
  struct {
    const char *text, *want;
  } cases[] = {
    {"path,label\na.png,1\nb.png\n", "line 3"},                 // missing field
    {"path,label\na.png,1\na.png,1,2\n", "line 3"},             // extra field
    {"path,label\na.png,x1\n", "line 2"},                       // non-integer label
    {"path,label\na.png,-4\n", "negative"},                     // negative label
    {"path,label\na.png,\n", "empty label"},                    // empty label
    {"path,label\n,3\n", "empty path"},                         // empty path
    {"path,label\na.png,1\n\"a.png,1\n", "not closed"},         // unterminated quote
    {"path,label\na\"b.png,1\n", "quote inside"},               // stray quote
    {"path,label\n\"a.png\"x,1\n", "after its closing quote"},  // text after a quote
    {"file,label\na.png,1\n", "header"},                        // wrong header
    {"", "empty"},                                              // no header
    {"path,label\n", "no images"},                              // header only
    {"path,label\na.png,99999999999\n", "too large"},
  };
  px_image_opts o = PX_IMAGE_DEFAULTS;
  o.csv = in_dir("bad.csv");
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    write_text(o.csv, cases[k].text);
    expect_open_error(&o, "bad.csv", cases[k].want);
  }
  // A missing image is found when the sample is read (here: at open, as the
  // first image, and in get for a later row), named with its CSV line.
  write_text(o.csv, "path,label\na.png,1\nnope.png,2\n");
  px_dataset *d;
  CHECK_OK(px_image_dataset_open(&d, &o));
  px_batch b;
  CHECK_OK(px_batch_alloc(&b, d, 1));
  px_rng rng = px_rng_make(0, 0);
  px_status st = px_dataset_get(d, 1, &b, 0, &rng);
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), "nope.png") && strstr(px_last_error(), "line 3"),
        "missing image: %s: %s", px_status_name(st), px_last_error());
  px_batch_free(&b);
  px_dataset_free(d);

  // Without a crop a differently sized image is a bad record naming both sizes.
  save_solid("big.png", 8, 5, 0);
  write_text(o.csv, "path,label\na.png,1\nbig.png,2\n");
  CHECK_OK(px_image_dataset_open(&d, &o));
  CHECK_OK(px_batch_alloc(&b, d, 1));
  st = px_dataset_get(d, 1, &b, 0, &rng);
  CHECK(st == PX_ERR_FORMAT && strstr(px_last_error(), "big.png") && strstr(px_last_error(), "8×5") &&
          strstr(px_last_error(), "6×5"),
        "size mismatch: %s: %s", px_status_name(st), px_last_error());
  px_batch_free(&b);
  px_dataset_free(d);
  // A corrupt image: PX_ERR_FORMAT naming it (what the loader's skip_bad skips).
  write_text(in_dir("junk.png"), "not a png at all");
  write_text(o.csv, "path,label\na.png,1\njunk.png,2\n");
  CHECK_OK(px_image_dataset_open(&d, &o));
  CHECK_OK(px_batch_alloc(&b, d, 1));
  st = px_dataset_get(d, 1, &b, 0, &rng);
  CHECK(st == PX_ERR_FORMAT && strstr(px_last_error(), "junk.png"), "corrupt image: %s: %s", px_status_name(st),
        px_last_error());
  px_batch_free(&b);
  px_dataset_free(d);
}

static void imagenet_listing(void) {
  mkdir(in_dir("train"), 0755);
  mkdir(in_dir("train/n01443537"), 0755);
  mkdir(in_dir("train/n01440764"), 0755);
  save_solid("train/n01443537/n01443537_7.JPEG", 12, 10, 20);
  save_solid("train/n01440764/n01440764_10026.JPEG", 10, 14, 60);
  save_solid("train/ILSVRC2012_val_00000001.JPEG", 16, 11, 100);
  write_text(in_dir("LOC_synset_mapping.txt"),
             "n01440764 tench, Tinca tinca\nn01443537 goldfish, Carassius auratus\nn01484850 great white shark\n");
  write_text(in_dir("LOC_train_solution.csv"),
             "ImageId,PredictionString\n"
             "n01443537_7,n01443537 1 2 30 40 n01443537 5 5 9 9 \n"
             "n01440764_10026,n01440764 0 0 9 9\n"
             "ILSVRC2012_val_00000001,n01484850 3 3 10 10 n01440764 1 1 2 2\n");
  px_image_opts o = PX_IMAGE_DEFAULTS;
  o.csv = in_dir("LOC_train_solution.csv");
  o.root = in_dir("train");
  o.layout = PX_CSV_IMAGENET;
  o.synsets = in_dir("LOC_synset_mapping.txt");
  o.crop = 8;  // images differ in size: a crop makes one sample shape
  px_dataset *d;
  CHECK_OK(px_image_dataset_open(&d, &o));
  CHECK(d->length == 3 && d->num_classes == 3, "length %zu classes %zu; want 3 and 3 (the synset count)", d->length,
        d->num_classes);
  CHECK(d->x_shape[1] == 8 && d->x_shape[2] == 8, "crop 8 gives %lldx%lld", (long long)d->x_shape[1],
        (long long)d->x_shape[2]);
  px_batch b;
  CHECK_OK(px_batch_alloc(&b, d, 3));
  const int labels[3] = {1, 0, 2}, tags[3] = {20, 60, 100};
  for (size_t i = 0; i < 3; i++) {
    px_rng rng = px_rng_make(0, i);
    CHECK_OK(px_dataset_get(d, i, &b, i, &rng));
    CHECK(((int32_t *)b.y.data)[i] == labels[i], "row %zu label %d, want %d (first synset's line)", i,
          ((int32_t *)b.y.data)[i], labels[i]);
    const float *x = (const float *)b.x.data + i * 3 * 64;
    CHECK(fabs(x[64 + 10] * 255.0 - (tags[i] + 1)) <= 2.0, "row %zu green %g, want %d: the wrong file?", i,
          x[64 + 10] * 255.0, tags[i] + 1);
  }
  px_batch_free(&b);
  px_dataset_free(d);

  // Unknown synset: CSV, line and synset named.
  write_text(in_dir("bad_in.csv"), "ImageId,PredictionString\nn01443537_7,n01443537 1 2 3 4\nx_1,n09999999 1 1 2 2\n");
  o.csv = in_dir("bad_in.csv");
  expect_open_error(&o, "line 3", "n09999999");
  expect_open_error(&o, "bad_in.csv", "not in the synset mapping");
  write_text(o.csv, "ImageId,PredictionString\nn01443537_7,\n");
  expect_open_error(&o, "line 2", "empty PredictionString");
  write_text(o.csv, "path,label\na,1\n");
  expect_open_error(&o, "bad_in.csv", "ImageId,PredictionString");
  // Mapping problems: a duplicate synset, a blank line (classes would shift).
  write_text(in_dir("dup.txt"), "n01440764 tench\nn01443537 goldfish\nn01440764 again\n");
  o.csv = in_dir("LOC_train_solution.csv");
  o.synsets = in_dir("dup.txt");
  expect_open_error(&o, "dup.txt", "lines 1 and 3");
  write_text(in_dir("blank.txt"), "n01440764 tench\n\nn01443537 goldfish\n");
  o.synsets = in_dir("blank.txt");
  expect_open_error(&o, "blank.txt", "line 2");
  o.synsets = NULL;
  expect_open_error(&o, "LOC_train_solution.csv", "synset");
}

static void synset_lookup_and_prediction_words(void) {
  const char *map = "n3 c\nn1 a\nn22 b\r\nn2 d";
  px_synsets s;
  CHECK_OK(px_synsets_parse(map, strlen(map), "m", &s));
  CHECK(s.count == 4, "count %zu", s.count);
  CHECK(px_synsets_find(&s, "n3", 2) == 0 && px_synsets_find(&s, "n1", 2) == 1 && px_synsets_find(&s, "n22", 3) == 2 &&
          px_synsets_find(&s, "n2", 2) == 3,
        "lookup gives the wrong class");
  CHECK(px_synsets_find(&s, "n222", 3) == 2 && px_synsets_find(&s, "n", 1) == -1 && px_synsets_find(&s, "n4", 2) == -1,
        "prefixes or absent names found");
  px_synsets_free(&s);
  const char *w;
  size_t n;
  px_imagenet_first_synset("  n015 1 2 3 4 n016 ", &w, &n);
  CHECK(n == 4 && strncmp(w, "n015", 4) == 0, "first word \"%.*s\"", (int)n, w);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_imgcsv_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  path_label_listing();
  bad_rows_name_csv_and_line();
  imagenet_listing();
  synset_lookup_and_prediction_words();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_image_csv_datasets_and_bad_rows");
}
