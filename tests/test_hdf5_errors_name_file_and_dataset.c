/* Claim: every way an HDF5 file can fail to be the dataset the config says
 * is refused with a message naming the file and the dataset and saying what
 * was expected and what was found: a missing file, a file that is not HDF5,
 * a missing dataset (listing what the file holds), a group where a dataset
 * is named, images of the wrong rank or type, labels of the wrong shape,
 * count or type, labels out of range (negative, or past num_classes),
 * token arrays of the wrong rank or type or too short, and tokens outside
 * the vocabulary or negative (found when a batch reads them, naming the
 * position).  If it failed, a user would get a crash, garbage batches or a
 * message that does not say which file or dataset to fix. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <hdf5.h>
#include <string.h>

static char dir[64], path[128];

static void write_ds(hid_t f, const char *name, hid_t type, int rank, const hsize_t *dims, const void *data) {
  hid_t sp = H5Screate_simple(rank, dims, NULL);
  hid_t d = H5Dcreate2(f, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(d);
  H5Sclose(sp);
}

enum { N = 60 };
static uint8_t img_u8[N * 28 * 28];
static int16_t img_i16[N * 28 * 28];
static double img_f64[N * 28 * 28];
static double lab_f64[N * 2];
static int32_t lab_ok[N], lab_neg[N], lab_big[N];
static uint16_t tok16[400];
static int32_t tok_neg[400];
static float tok_f32[400];

static void write_file(void) {
  for (int i = 0; i < N; i++) lab_ok[i] = lab_neg[i] = lab_big[i] = i % 10;
  lab_neg[7] = -1;
  lab_big[9] = 12;
  for (int k = 0; k < 400; k++) tok16[k] = tok_neg[k] = (uint16_t)(k % 100);
  tok16[250] = 5000;
  tok_neg[123] = -3;
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  write_ds(f, "images", H5T_NATIVE_UINT8, 3, (hsize_t[]){N, 28, 28}, img_u8);
  write_ds(f, "flat", H5T_NATIVE_UINT8, 2, (hsize_t[]){N, 784}, img_u8);
  write_ds(f, "images_i16", H5T_NATIVE_INT16, 3, (hsize_t[]){N, 28, 28}, img_i16);
  write_ds(f, "images_f64", H5T_NATIVE_DOUBLE, 3, (hsize_t[]){N, 28, 28}, img_f64);
  write_ds(f, "labels", H5T_NATIVE_DOUBLE, 2, (hsize_t[]){N, 2}, lab_f64);
  write_ds(f, "labels_short", H5T_NATIVE_INT32, 1, (hsize_t[]){N - 1}, lab_ok);
  write_ds(f, "labels_neg", H5T_NATIVE_INT32, 1, (hsize_t[]){N}, lab_neg);
  write_ds(f, "labels_big", H5T_NATIVE_INT32, 1, (hsize_t[]){N}, lab_big);
  write_ds(f, "labels_ok", H5T_NATIVE_INT32, 1, (hsize_t[]){N}, lab_ok);
  write_ds(f, "tokens", H5T_NATIVE_UINT16, 1, (hsize_t[]){400}, tok16);
  write_ds(f, "tokens_neg", H5T_NATIVE_INT32, 1, (hsize_t[]){400}, tok_neg);
  write_ds(f, "tokens_2d", H5T_NATIVE_UINT16, 2, (hsize_t[]){200, 2}, tok16);
  write_ds(f, "tokens_f32", H5T_NATIVE_FLOAT, 1, (hsize_t[]){400}, tok_f32);
  write_ds(f, "tokens_short", H5T_NATIVE_UINT16, 1, (hsize_t[]){8}, tok16);  // T = 8: a window needs 9
  H5Gclose(H5Gcreate2(f, "grp", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5Fclose(f);
}

// Opening must fail with `want` and a message holding every string of `has` (NULL-terminated).
static void expect_open_fails(const px_hdf5_opts *o, px_status want, const char *const *has) {
  px_dataset *d = NULL;
  px_status st = px_hdf5_dataset_open(&d, o);
  const char *msg = px_last_error();
  CHECK(st == want, "x='%s' y='%s': %s, expected %s (%s)", o->x, o->y ? o->y : "", px_status_name(st),
        px_status_name(want), msg);
  CHECK(d == NULL, "a dataset was returned on error");
  if (d) px_dataset_free(d);
  for (const char *const *h = has; *h; h++) CHECK(strstr(msg, *h) != NULL, "message \"%s\" lacks \"%s\"", msg, *h);
  printf("  %s\n", msg);
}

static px_hdf5_opts images(const char *x, const char *y) {
  px_hdf5_opts o = PX_HDF5_DEFAULTS;
  o.path = path;
  o.x = x;
  o.y = y;
  return o;
}

static px_hdf5_opts tokens(const char *x, size_t vocab) {
  px_hdf5_opts o = PX_HDF5_DEFAULTS;
  o.path = path;
  o.layout = PX_HDF5_TOKENS;
  o.x = x;
  o.T = 8;
  o.vocab_size = vocab;
  return o;
}

// Reading every sample through a loader must fail with a message holding `has`.
static void expect_read_fails(const px_hdf5_opts *o, const char *const *has) {
  px_dataset *d;
  CHECK_OK(px_hdf5_dataset_open(&d, o));
  px_loader *l;
  px_loader_opts lo = PX_LOADER_DEFAULTS;
  lo.batch_size = 8;
  lo.workers = 2;
  lo.shuffle = false;
  CHECK_OK(px_loader_create(&l, d, &lo));
  CHECK_OK(px_loader_start_epoch(l, 0, 0));
  px_status st = PX_OK;
  const px_batch *b;
  do {
    st = px_loader_next(l, &b);
  } while (st == PX_OK && b);
  const char *msg = px_last_error();
  CHECK(st == PX_ERR_FORMAT, "x='%s': reading gave %s, expected PX_ERR_FORMAT", o->x, px_status_name(st));
  for (const char *const *h = has; *h; h++) CHECK(strstr(msg, *h) != NULL, "message \"%s\" lacks \"%s\"", msg, *h);
  printf("  %s\n", msg);
  px_loader_free(l);
  px_dataset_free(d);
}

#define HAS(...) ((const char *const[]){__VA_ARGS__, NULL})

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_h5err_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  snprintf(path, sizeof path, "%s/f.h5", dir);
  write_file();

  px_hdf5_opts o = images("images", "labels_ok");
  px_dataset *d;
  CHECK_OK(px_hdf5_dataset_open(&d, &o));  // the good pair opens
  CHECK(d->length == N && d->num_classes == 10, "%zu samples, %zu classes", d->length, d->num_classes);
  px_dataset_free(d);

  char missing[160], text[160];
  snprintf(missing, sizeof missing, "%s/nope.h5", dir);
  snprintf(text, sizeof text, "%s/text.h5", dir);
  FILE *fp = fopen(text, "w");
  if (fp) {
    fputs("not hdf5\n", fp);
    fclose(fp);
  }
  o.path = missing;
  expect_open_fails(&o, PX_ERR_NOT_FOUND, HAS(missing, "No such file"));
  o.path = text;
  expect_open_fails(&o, PX_ERR_FORMAT, HAS(text, "not an HDF5 file"));

  o = images("images", "targets");
  expect_open_fails(&o, PX_ERR_NOT_FOUND, HAS("no dataset 'targets'", path, "'images'", "'labels_ok'"));
  o = images("missing/x", "labels_ok");
  expect_open_fails(&o, PX_ERR_NOT_FOUND, HAS("no dataset 'missing/x'", path));
  o = images("grp", "labels_ok");
  expect_open_fails(&o, PX_ERR_FORMAT, HAS("'grp'", path, "is a group, not a dataset"));

  char want[256];
  snprintf(want, sizeof want, "dataset 'labels' in %s: expected 1 dimension of N=60 integers", path);
  o = images("images", "labels");
  expect_open_fails(&o, PX_ERR_FORMAT, HAS(want, "found (60, 2) float64"));
  o = images("images", "labels_short");
  expect_open_fails(&o, PX_ERR_FORMAT, HAS("dataset 'labels_short'", path, "N=60", "found (59,) int32"));
  o = images("flat", "labels_ok");
  expect_open_fails(&o, PX_ERR_FORMAT,
                    HAS("dataset 'flat'", path, "(N, H, W) or (N, C, H, W)", "found (60, 784) uint8"));
  o = images("images_i16", "labels_ok");
  expect_open_fails(&o, PX_ERR_FORMAT, HAS("dataset 'images_i16'", "uint8 or float32", "found (60, 28, 28) int16"));
  o = images("images_f64", "labels_ok");
  expect_open_fails(&o, PX_ERR_FORMAT, HAS("dataset 'images_f64'", "found (60, 28, 28) float64"));
  o = images("images", "labels_neg");
  expect_open_fails(&o, PX_ERR_FORMAT, HAS("dataset 'labels_neg'", path, "label -1 at index 7 is out of range"));
  o = images("images", "labels_big");
  o.num_classes = 10;
  expect_open_fails(&o, PX_ERR_FORMAT,
                    HAS("dataset 'labels_big'", path, "label 12 at index 9 is out of range [0, 10)"));

  o = tokens("tokens_2d", 0);
  expect_open_fails(&o, PX_ERR_FORMAT,
                    HAS("dataset 'tokens_2d'", path, "expected 1 dimension of integer tokens",
                        "found (200, 2) uint16"));
  o = tokens("tokens_f32", 0);
  expect_open_fails(&o, PX_ERR_FORMAT, HAS("dataset 'tokens_f32'", "found (400,) float32"));
  o = tokens("tokens_short", 0);
  expect_open_fails(&o, PX_ERR_INVALID, HAS("dataset 'tokens_short'", path, "8 tokens give no sample"));
  o = tokens("tokens", 1000);
  expect_read_fails(&o, HAS("dataset 'tokens'", path, "token at position 250", "is 5000, outside the vocabulary"));
  o = tokens("tokens_neg", 0);
  expect_read_fails(&o, HAS("dataset 'tokens_neg'", path, "token at position 123", "is -3"));

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_hdf5_errors_name_file_and_dataset");
}
