/* Claim: IDX files of every type code (u8, i8, i16, i32, f32, f64), plain
 * or gzip-compressed (one member or several, whatever the file name), read
 * back as the values written, in host byte order; the IDX dataset and
 * px_mnist_open give x = (v/255 - mean)/std and the label for every sample,
 * through the loader with and without workers; and every kind of bad file —
 * bad magic, an unsupported type code, a cut header, data cut short or
 * followed by extra bytes, dims that overflow, corrupt or truncated gzip,
 * images and labels that disagree in count or shape, a missing file — is
 * an error that names the file and says what was expected.  If it failed,
 * a model would train on byte-swapped or shifted pixels, or a damaged
 * download would crash the run or load as garbage. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "test_dir.h"

// An IDX file in memory: header for (type, dims) and `payload` (already
// big-endian) of `payload_n` bytes.
typedef struct bytes {
  unsigned char *p;
  size_t n;
} bytes;

static bytes idx_bytes(unsigned type, int ndim, const uint32_t *dims, const void *payload, size_t payload_n) {
  bytes b = {malloc(4 + 4 * (size_t)ndim + payload_n + 1), 4 + 4 * (size_t)ndim + payload_n};
  b.p[0] = 0;
  b.p[1] = 0;
  b.p[2] = (unsigned char)type;
  b.p[3] = (unsigned char)ndim;
  for (int i = 0; i < ndim; i++) {
    b.p[4 + 4 * i] = (unsigned char)(dims[i] >> 24);
    b.p[5 + 4 * i] = (unsigned char)(dims[i] >> 16);
    b.p[6 + 4 * i] = (unsigned char)(dims[i] >> 8);
    b.p[7 + 4 * i] = (unsigned char)dims[i];
  }
  if (payload_n) memcpy(b.p + 4 + 4 * ndim, payload, payload_n);
  return b;
}

static void write_plain(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(p, 1, n, f) == n, "cannot write %s", path);
  if (f) fclose(f);
}

// gzip through zlib's own gz* writer (what gzip(1) makes); `members` > 1
// concatenates that many gzip members, each holding a piece.
static void write_gzip(const char *path, const void *p, size_t n, int members) {
  FILE *f = fopen(path, "wb");
  fclose(f);
  size_t done = 0;
  for (int m = 0; m < members; m++) {
    size_t piece = m == members - 1 ? n - done : n / (size_t)members;
    gzFile g = gzopen(path, "ab");
    CHECK(g != NULL, "gzopen %s", path);
    if (piece) CHECK(gzwrite(g, (const char *)p + done, (unsigned)piece) == (int)piece, "gzwrite %s", path);
    gzclose(g);
    done += piece;
  }
}

static bytes slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  bytes b = {malloc(1 << 20), 0};
  b.n = fread(b.p, 1, 1 << 20, f);
  fclose(f);
  return b;
}

static void expect_read_error(const char *path, px_status want, const char *a, const char *b) {
  px_idx idx;
  px_status st = px_idx_read(path, &idx);
  CHECK(st == want, "reading %s gave %s, expected %s (%s)", path, px_status_name(st), px_status_name(want),
        px_last_error());
  CHECK(idx.data == NULL, "a failed read left data");
  CHECK(strstr(px_last_error(), path) && strstr(px_last_error(), a) && (!b || strstr(px_last_error(), b)),
        "message for %s lacks the file, \"%s\" or \"%s\": %s", path, a, b ? b : "", px_last_error());
}

static void every_type_plain_and_gzip(void) {
  // Each type: 2×3 values chosen so a byte swap or a sign slip shows.
  const uint32_t dims[2] = {2, 3};
  unsigned char be[6 * 8];
  struct {
    unsigned code;
    px_dtype dtype;
    size_t size;
  } types[] = {{0x08, PX_U8, 1},  {0x09, PX_I8, 1},  {0x0B, PX_I16, 2},
               {0x0C, PX_I32, 4}, {0x0D, PX_F32, 4}, {0x0E, PX_F64, 8}};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    double want[6];
    for (int i = 0; i < 6; i++) {
      uint64_t bits = 0;
      switch (types[t].dtype) {
      case PX_U8:
        want[i] = 250 - 37 * i;
        bits = (uint64_t)(uint8_t)want[i];
        break;
      case PX_I8:
        want[i] = -100 + 41 * i;
        bits = (uint8_t)(int8_t)want[i];
        break;
      case PX_I16:
        want[i] = -30000 + 12001 * i;
        bits = (uint16_t)(int16_t)want[i];
        break;
      case PX_I32:
        want[i] = -2000000000.0 + 800000001.0 * i;
        bits = (uint32_t)(int32_t)want[i];
        break;
      case PX_F32: {
        float v = -1.5f + 0.7f * (float)i;
        want[i] = v;
        uint32_t u;
        memcpy(&u, &v, 4);
        bits = u;
        break;
      }
      default: {
        double v = 1e300 / (i + 1) - 0.1;
        want[i] = v;
        memcpy(&bits, &v, 8);
        break;
      }
      }
      for (size_t k = 0; k < types[t].size; k++)
        be[i * types[t].size + k] = (unsigned char)(bits >> (8 * (types[t].size - 1 - k)));
    }
    bytes f = idx_bytes(types[t].code, 2, dims, be, 6 * types[t].size);
    for (int form = 0; form < 3; form++) {
      // Plain, gzip, gzip in three members; the name never says which.
      char name[32];
      snprintf(name, sizeof name, "type%02x_%d.idx", types[t].code, form);
      if (form == 0) write_plain(in_dir(name), f.p, f.n);
      else write_gzip(in_dir(name), f.p, f.n, form == 1 ? 1 : 3);
      px_idx idx;
      CHECK_OK(px_idx_read(in_dir(name), &idx));
      CHECK(idx.dtype == types[t].dtype && idx.ndim == 2 && idx.dims[0] == 2 && idx.dims[1] == 3 &&
              idx.nbytes == 6 * types[t].size,
            "%s: dtype %s ndim %d dims %lld×%lld", name, px_dtype_name(idx.dtype), idx.ndim, (long long)idx.dims[0],
            (long long)idx.dims[1]);
      for (int i = 0; i < 6; i++) {
        double got;
        switch (idx.dtype) {
        case PX_U8: got = ((uint8_t *)idx.data)[i]; break;
        case PX_I8: got = ((int8_t *)idx.data)[i]; break;
        case PX_I16: got = ((int16_t *)idx.data)[i]; break;
        case PX_I32: got = ((int32_t *)idx.data)[i]; break;
        case PX_F32: got = ((float *)idx.data)[i]; break;
        default: got = ((double *)idx.data)[i]; break;
        }
        CHECK(got == want[i], "%s element %d: %.17g, expected %.17g", name, i, got, want[i]);
      }
      px_idx_free(&idx);
    }
    free(f.p);
  }
}

static void corrupt_files_are_named_errors(void) {
  const uint32_t dims[3] = {2, 2, 3};
  unsigned char px[12];
  for (int i = 0; i < 12; i++) px[i] = (unsigned char)(i * 20);
  bytes good = idx_bytes(0x08, 3, dims, px, 12);

  bytes b = idx_bytes(0x08, 3, dims, px, 12);
  b.p[0] = 0x50;  // "P": a PNG or text file, say
  write_plain(in_dir("magic.idx"), b.p, b.n);
  expect_read_error(in_dir("magic.idx"), PX_ERR_FORMAT, "bad magic", "50 00 08 03");
  b.p[0] = 0;
  b.p[2] = 0x0A;
  write_plain(in_dir("type.idx"), b.p, b.n);
  expect_read_error(in_dir("type.idx"), PX_ERR_FORMAT, "unsupported type code 0x0A", "0x08 u8");
  b.p[2] = 0x08;
  b.p[3] = 0;
  write_plain(in_dir("ndim0.idx"), b.p, b.n);
  expect_read_error(in_dir("ndim0.idx"), PX_ERR_FORMAT, "0 dims", "1 to 8");
  b.p[3] = 9;
  write_plain(in_dir("ndim9.idx"), b.p, b.n);
  expect_read_error(in_dir("ndim9.idx"), PX_ERR_FORMAT, "9 dims", NULL);
  free(b.p);

  write_plain(in_dir("short.idx"), good.p, 2);
  expect_read_error(in_dir("short.idx"), PX_ERR_FORMAT, "too short", NULL);
  write_plain(in_dir("head.idx"), good.p, 10);  // 3 dims need 16 header bytes
  expect_read_error(in_dir("head.idx"), PX_ERR_FORMAT, "truncated header", "16 header bytes");
  write_plain(in_dir("cut.idx"), good.p, good.n - 1);
  expect_read_error(in_dir("cut.idx"), PX_ERR_FORMAT, "truncated: dims (2, 2, 3) of u8 need 12 bytes", "1 missing");
  unsigned char more[64];
  memcpy(more, good.p, good.n);
  memset(more + good.n, 7, 5);
  write_plain(in_dir("extra.idx"), more, good.n + 5);
  expect_read_error(in_dir("extra.idx"), PX_ERR_FORMAT, "trailing bytes", "5 extra");
  // Dims whose product overflows 64 bits must not wrap into "fits".
  const uint32_t huge[8] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 4, 1, 1, 1, 1};
  bytes h = idx_bytes(0x0E, 8, huge, px, 8);
  write_plain(in_dir("huge.idx"), h.p, h.n);
  expect_read_error(in_dir("huge.idx"), PX_ERR_FORMAT, "more data than any file holds", NULL);
  free(h.p);
  const uint32_t zero[2] = {0, 5};
  h = idx_bytes(0x0B, 2, zero, NULL, 0);  // an empty array is a valid IDX file
  write_plain(in_dir("empty.idx"), h.p, h.n);
  px_idx e;
  CHECK_OK(px_idx_read(in_dir("empty.idx"), &e));
  CHECK(e.nbytes == 0 && e.dims[0] == 0 && e.dims[1] == 5, "empty array read as %zu bytes", e.nbytes);
  px_idx_free(&e);
  free(h.p);

  // gzip: a flipped byte in the deflate stream or the CRC, and a file cut short.
  unsigned char big[4000];
  const uint32_t bd[1] = {4000};
  for (int i = 0; i < 4000; i++) big[i] = (unsigned char)((i * 7919) >> 3);
  bytes bg = idx_bytes(0x08, 1, bd, big, 4000);
  write_gzip(in_dir("big.gz"), bg.p, bg.n, 1);
  bytes z = slurp(in_dir("big.gz"));
  z.p[z.n / 2] ^= 0x55;
  write_plain(in_dir("flip.gz"), z.p, z.n);
  expect_read_error(in_dir("flip.gz"), PX_ERR_FORMAT, "corrupt gzip", NULL);
  z.p[z.n / 2] ^= 0x55;
  z.p[z.n - 6] ^= 0x01;  // the CRC-32 in the trailer
  write_plain(in_dir("crc.gz"), z.p, z.n);
  expect_read_error(in_dir("crc.gz"), PX_ERR_FORMAT, "corrupt gzip", "incorrect data check");
  z.p[z.n - 6] ^= 0x01;
  write_plain(in_dir("cutgz.gz"), z.p, z.n - 20);
  expect_read_error(in_dir("cutgz.gz"), PX_ERR_FORMAT, "corrupt gzip", "ends early");
  memcpy(more, "junk", 4);
  FILE *f = fopen(in_dir("tail.gz"), "wb");
  fwrite(z.p, 1, z.n, f);
  fwrite(more, 1, 4, f);
  fclose(f);
  expect_read_error(in_dir("tail.gz"), PX_ERR_FORMAT, "4 bytes after the end of the compressed data", NULL);
  // A gzip file whose content is a truncated IDX file: the IDX check still runs.
  write_gzip(in_dir("cutinside.gz"), bg.p, bg.n - 3, 1);
  expect_read_error(in_dir("cutinside.gz"), PX_ERR_FORMAT, "truncated", "3 missing");
  free(z.p);
  free(bg.p);
  expect_read_error(in_dir("absent.idx"), PX_ERR_NOT_FOUND, "cannot open", NULL);
  free(good.p);
}

// N×H×W images whose pixel k of image i is (i·31 + k·7) mod 256; labels i mod 7.
enum { N = 37, H = 3, W = 4 };

static void write_set(const char *images, const char *labels, int n_images, int n_labels, bool gz) {
  unsigned char px[N * H * W], lab[N + 5];
  for (int i = 0; i < N; i++)
    for (int k = 0; k < H * W; k++) px[i * H * W + k] = (unsigned char)((i * 31 + k * 7) % 256);
  for (int i = 0; i < N + 5; i++) lab[i] = (unsigned char)(i % 7);
  const uint32_t di[3] = {(uint32_t)n_images, H, W}, dl[1] = {(uint32_t)n_labels};
  bytes a = idx_bytes(0x08, 3, di, px, (size_t)n_images * H * W);
  bytes b = idx_bytes(0x08, 1, dl, lab, (size_t)n_labels);
  if (gz) {
    write_gzip(images, a.p, a.n, 1);
    write_gzip(labels, b.p, b.n, 1);
  } else {
    write_plain(images, a.p, a.n);
    write_plain(labels, b.p, b.n);
  }
  free(a.p);
  free(b.p);
}

static void check_through_loader(px_dataset *d, float mean, float std, int workers) {
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = 8;
  o.workers = workers;
  o.seed = 5;
  CHECK_OK(px_loader_create(&l, d, &o));
  CHECK_OK(px_loader_start_epoch(l, 0, 0));
  int seen[N] = {0};
  const px_batch *b;
  for (;;) {
    CHECK_OK(px_loader_next(l, &b));
    if (!b) break;
    CHECK(b->x.ndim == 4 && b->x.shape[1] == 1 && b->x.shape[2] == H && b->x.shape[3] == W, "batch x shape");
    for (size_t r = 0; r < b->n; r++) {
      size_t i = b->indices[r];
      seen[i]++;
      CHECK(((const int32_t *)b->y.data)[r] == (int32_t)(i % 7), "sample %zu label %d", i,
            ((const int32_t *)b->y.data)[r]);
      for (int k = 0; k < H * W; k++) {
        float v = (float)((i * 31 + (size_t)k * 7) % 256);
        float want = (v / 255.0f - mean) / std;
        CHECK(((const float *)b->x.data)[r * H * W + (size_t)k] == want, "sample %zu pixel %d", i, k);
      }
    }
  }
  for (int i = 0; i < N; i++) CHECK(seen[i] == 1, "workers %d: sample %d seen %d times", workers, i, seen[i]);
  px_loader_free(l);
}

static void dataset_and_mnist_layout(void) {
  write_set(in_dir("imgs"), in_dir("labs"), N, N, false);
  px_dataset *d;
  CHECK_OK(px_idx_dataset_open(&d, in_dir("imgs"), in_dir("labs"), 0.25f, 0.5f));
  CHECK(d->length == N && d->num_classes == 7 && d->x_dtype == PX_F32 && d->y_dtype == PX_I32 && d->x_ndim == 3 &&
          d->x_shape[0] == 1 && d->x_shape[1] == H && d->x_shape[2] == W && d->y_ndim == 0 &&
          strcmp(d->kind, "idx") == 0,
        "dataset: length %zu classes %zu", d->length, d->num_classes);
  check_through_loader(d, 0.25f, 0.5f, 0);
  check_through_loader(d, 0.25f, 0.5f, 3);
  px_dataset_free(d);

  // An MNIST-layout directory: train plain, test gzip.
  write_set(in_dir("train-images-idx3-ubyte"), in_dir("train-labels-idx1-ubyte"), N, N, false);
  write_set(in_dir("t10k-images-idx3-ubyte.gz"), in_dir("t10k-labels-idx1-ubyte.gz"), N, N, true);
  for (int split = 0; split < 2; split++) {
    CHECK_OK(px_mnist_open(&d, dir, split ? "test" : "train", 0.1307f, 0.3081f));
    CHECK(d->length == N, "mnist split %d length %zu", split, d->length);
    check_through_loader(d, 0.1307f, 0.3081f, 2);
    px_dataset_free(d);
  }
  px_status st = px_mnist_open(&d, dir, "valid", 0, 1);
  CHECK(st == PX_ERR_INVALID && d == NULL && strstr(px_last_error(), "\"valid\"") &&
          strstr(px_last_error(), "\"train\" or \"test\""),
        "bad split: %s", px_last_error());
  remove(in_dir("t10k-labels-idx1-ubyte.gz"));
  st = px_mnist_open(&d, dir, "test", 0, 1);
  CHECK(st == PX_ERR_NOT_FOUND && strstr(px_last_error(), "t10k-labels-idx1-ubyte not found") &&
          strstr(px_last_error(), dir),
        "missing labels: %s", px_last_error());
  st = px_idx_dataset_open(&d, in_dir("imgs"), in_dir("labs"), 0, 0);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "std"), "std 0: %s", px_last_error());

  // Counts that disagree, labels that are images, images that are labels.
  write_set(in_dir("imgs2"), in_dir("labs2"), N, N - 1, false);
  st = px_idx_dataset_open(&d, in_dir("imgs2"), in_dir("labs2"), 0, 1);
  CHECK(st == PX_ERR_FORMAT && d == NULL && strstr(px_last_error(), in_dir("imgs2")) &&
          strstr(px_last_error(), in_dir("labs2")) && strstr(px_last_error(), "37 images") &&
          strstr(px_last_error(), "36 labels"),
        "count mismatch: %s", px_last_error());
  st = px_idx_dataset_open(&d, in_dir("imgs"), in_dir("imgs"), 0, 1);
  CHECK(st == PX_ERR_FORMAT && strstr(px_last_error(), "labels") && strstr(px_last_error(), "idx1-ubyte"),
        "images as labels: %s", px_last_error());
  st = px_idx_dataset_open(&d, in_dir("labs"), in_dir("labs"), 0, 1);
  CHECK(st == PX_ERR_FORMAT && strstr(px_last_error(), "N×H×W u8"), "labels as images: %s", px_last_error());
  st = px_idx_dataset_open(&d, in_dir("imgs"), in_dir("cut.idx"), 0, 1);
  CHECK(st == PX_ERR_FORMAT && strstr(px_last_error(), in_dir("cut.idx")), "bad labels file: %s", px_last_error());
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_idx_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  every_type_plain_and_gzip();
  corrupt_files_are_named_errors();
  dataset_and_mnist_layout();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_idx_reads_every_type_and_rejects_corrupt_files");
}
