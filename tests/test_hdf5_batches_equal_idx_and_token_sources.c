/* Claim: the HDF5 dataset yields batches byte-identical to the IDX source
 * (Fashion-MNIST images and labels) and to the token-shard source (windows
 * with random offsets), for the same seed, over two shuffled epochs, with
 * 2 loader workers reading the file at once (serialised by the HDF5 lock)
 * against the reference's 1 — from files this test writes with the HDF5 C
 * library in every layout the source reads: contiguous (N, H, W) uint8 with
 * uint8 labels; chunked + deflate (N, 1, H, W) uint8 with int64 labels
 * (chunks of 50 whole images, read a chunk at a time through the source's
 * chunk cache, also with only 2 slots; and chunks of half images, read per
 * sample);
 * contiguous float32 images (v/255) with int32 labels; and 1-D token arrays
 * of uint16 (contiguous), uint32 (chunked + deflate) and big-endian int32 —
 * the contiguous native ones both by pread at their file offset (the
 * default) and through the library (library_reads).
 * With arguments (tests/test_hdf5_h5py_file_and_cli_train_equal_idx.py):
 *   --h5py-images F.h5 --h5py-tokens T.h5 --shard T.bin --n N
 * it checks files written by h5py the same way.
 * If it failed, training from an HDF5 copy of a dataset would see other
 * samples, other pixels or other labels than from the original files. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>

#define FMNIST "/usr/share/datasets/fashion-mnist"
enum { N_IMG = 640, BS = 32, EPOCHS = 2, T = 16, N_TOK = 3001, VOCAB = 30000 };
static const float MEAN = 0.2860f, STD = 0.3530f;

static char dir[64];

// Every batch of EPOCHS epochs: indices, x and y, concatenated.
typedef struct record {
  unsigned char *bytes;
  size_t len, cap;
} record;

static void append(record *r, const void *p, size_t n) {
  if (r->len + n > r->cap) {
    r->cap = (r->len + n) * 2;
    r->bytes = realloc(r->bytes, r->cap);
    if (!r->bytes) exit(1);
  }
  memcpy(r->bytes + r->len, p, n);
  r->len += n;
}

// Rows of a batch: the bytes of its first b->n samples (the tensors hold capacity rows).
static size_t row_bytes(const px_tensor *t) {
  return (size_t)(px_tensor_numel(t) / t->shape[0]) * px_dtype_size(t->dtype);
}

static void run(record *r, px_dataset *d, int workers) {
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = BS;
  o.workers = workers;
  o.seed = 77;
  CHECK_OK(px_loader_create(&l, d, &o));
  r->len = 0;
  for (int e = 0; e < EPOCHS; e++) {
    CHECK_OK(px_loader_start_epoch(l, (uint64_t)e, 0));
    const px_batch *b;
    for (;;) {
      CHECK_OK(px_loader_next(l, &b));
      if (!b) break;
      append(r, b->indices, b->n * sizeof(size_t));
      append(r, b->x.data, b->n * row_bytes(&b->x));
      append(r, b->y.data, b->n * row_bytes(&b->y));
    }
  }
  px_loader_free(l);
}

static void expect_same(px_dataset *ref, px_dataset *h5, const char *what) {
  static record a, b;
  CHECK(ref->length == h5->length, "%s: %zu samples, the reference %zu", what, h5->length, ref->length);
  CHECK(ref->num_classes == h5->num_classes, "%s: %zu classes, the reference %zu", what, h5->num_classes,
        ref->num_classes);
  CHECK(ref->x_ndim == h5->x_ndim && memcmp(ref->x_shape, h5->x_shape, sizeof ref->x_shape) == 0,
        "%s: sample shape differs", what);
  if (ref->length != h5->length) return;
  run(&a, ref, 1);
  run(&b, h5, 2);
  CHECK(a.len > 0 && a.len == b.len && memcmp(a.bytes, b.bytes, a.len) == 0,
        "%s: batches differ from the reference's (%zu vs %zu bytes)", what, b.len, a.len);
  if (a.len == b.len && memcmp(a.bytes, b.bytes, a.len) == 0)
    printf("%s: %zu bytes of batches identical\n", what, a.len);
}

// ---- Writing with the C library -----------------------------------------------

static void write_ds(hid_t f, const char *name, hid_t ftype, hid_t mtype, int rank, const hsize_t *dims,
                     const hsize_t *chunk, const void *data) {
  hid_t sp = H5Screate_simple(rank, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (chunk) {
    H5Pset_chunk(dcpl, rank, chunk);
    H5Pset_deflate(dcpl, 4);
  }
  hid_t d = H5Dcreate2(f, name, ftype, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  CHECK(d >= 0, "cannot create %s", name);
  CHECK(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0, "cannot write %s", name);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(sp);
}

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

static bool library_reads;  // read contiguous datasets through libhdf5 as well (not by pread)
static size_t cache_bytes;  // 0: the default chunk cache

static void check_images(const char *path, const char *x, const char *y, px_dataset *ref, const char *what) {
  px_hdf5_opts o = PX_HDF5_DEFAULTS;
  o.library_reads = library_reads;
  o.cache_bytes = cache_bytes;
  o.path = path;
  o.x = x;
  o.y = y;
  for (int c = 0; c < 3; c++) o.mean[c] = MEAN, o.std[c] = STD;
  px_dataset *d;
  CHECK_OK(px_hdf5_dataset_open(&d, &o));
  CHECK(strcmp(d->kind, "hdf5") == 0, "kind %s", d->kind);
  expect_same(ref, d, what);
  px_dataset_free(d);
}

static void check_tokens(const char *path, const char *x, px_dataset *ref, const char *what) {
  px_hdf5_opts o = PX_HDF5_DEFAULTS;
  o.library_reads = library_reads;
  o.path = path;
  o.layout = PX_HDF5_TOKENS;
  o.x = x;
  o.T = T;
  o.random_offset = true;
  o.vocab_size = VOCAB;
  px_dataset *d;
  CHECK_OK(px_hdf5_dataset_open(&d, &o));
  expect_same(ref, d, what);
  px_dataset_free(d);
}

static px_dataset *idx_subset(px_dataset **base, size_t n) {
  CHECK_OK(
    px_idx_dataset_open(base, FMNIST "/train-images-idx3-ubyte.gz", FMNIST "/train-labels-idx1-ubyte.gz", MEAN, STD));
  px_dataset *sub;
  CHECK_OK(px_dataset_subset(&sub, *base, 0, n));
  return sub;
}

static px_dataset *token_ref(const char *shard) {
  px_dataset *d;
  CHECK_OK(px_token_dataset_open(&d, shard, T, true, VOCAB));
  return d;
}

// Files written by h5py (the Python test passes them).
static int h5py_mode(int argc, char **argv) {
  const char *images = NULL, *tokens = NULL, *shard = NULL;
  size_t n = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--h5py-images") == 0) images = argv[i + 1];
    else if (strcmp(argv[i], "--h5py-tokens") == 0) tokens = argv[i + 1];
    else if (strcmp(argv[i], "--shard") == 0) shard = argv[i + 1];
    else if (strcmp(argv[i], "--n") == 0) n = (size_t)strtoull(argv[i + 1], NULL, 10);
  }
  if (!images || !tokens || !shard || !n) {
    fprintf(stderr, "usage: %s [--h5py-images F.h5 --h5py-tokens T.h5 --shard T.bin --n N]\n", argv[0]);
    return 2;
  }
  px_dataset *base, *ref = idx_subset(&base, n);
  check_images(images, "images", "labels", ref, "h5py chunked+gzip (N, 1, H, W) uint8, int64 labels");
  px_dataset_free(ref);
  px_dataset_free(base);
  ref = token_ref(shard);
  check_tokens(tokens, "tokens", ref, "h5py chunked+gzip uint16 tokens");
  px_dataset_free(ref);
  return px_test_finish("test_hdf5_batches_equal_idx_and_token_sources (h5py files)");
}

int main(int argc, char **argv) {
  if (argc > 1) return h5py_mode(argc, argv);
  snprintf(dir, sizeof dir, "/tmp/px_h5eq_XXXXXX");
  if (!mkdtemp(dir)) return 1;

  // ---- Images: the first N_IMG Fashion-MNIST training images. ----
  px_idx im, lb;
  CHECK_OK(px_idx_read(FMNIST "/train-images-idx3-ubyte.gz", &im));
  CHECK_OK(px_idx_read(FMNIST "/train-labels-idx1-ubyte.gz", &lb));
  const size_t px = 28 * 28;
  const uint8_t *pix = im.data, *lab = lb.data;
  int64_t *lab64 = malloc(N_IMG * sizeof *lab64);
  int32_t *lab32 = malloc(N_IMG * sizeof *lab32);
  float *pixf = malloc(N_IMG * px * sizeof *pixf);
  if (!lab64 || !lab32 || !pixf) return 1;
  for (size_t i = 0; i < N_IMG; i++) lab64[i] = lab32[i] = lab[i];
  for (size_t k = 0; k < N_IMG * px; k++) pixf[k] = (float)pix[k] / 255.0f;

  char contiguous[128], chunked[128], floats[128], tiles[128];
  path_in(contiguous, sizeof contiguous, "contiguous.h5");
  path_in(chunked, sizeof chunked, "chunked.h5");
  path_in(floats, sizeof floats, "float.h5");
  path_in(tiles, sizeof tiles, "tiles.h5");
  hid_t f = H5Fcreate(contiguous, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  write_ds(f, "images", H5T_STD_U8LE, H5T_NATIVE_UINT8, 3, (hsize_t[]){N_IMG, 28, 28}, NULL, pix);
  write_ds(f, "labels", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, (hsize_t[]){N_IMG}, NULL, lab);
  H5Fclose(f);
  f = H5Fcreate(chunked, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Gclose(H5Gcreate2(f, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  write_ds(f, "train/x", H5T_STD_U8LE, H5T_NATIVE_UINT8, 4, (hsize_t[]){N_IMG, 1, 28, 28}, (hsize_t[]){50, 1, 28, 28},
           pix);
  write_ds(f, "train/y", H5T_STD_I64BE, H5T_NATIVE_INT64, 1, (hsize_t[]){N_IMG}, (hsize_t[]){128}, lab64);
  H5Fclose(f);
  f = H5Fcreate(tiles, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);  // chunks of half images: read per sample
  write_ds(f, "images", H5T_STD_U8LE, H5T_NATIVE_UINT8, 4, (hsize_t[]){N_IMG, 1, 28, 28}, (hsize_t[]){7, 1, 14, 28},
           pix);
  write_ds(f, "labels", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, (hsize_t[]){N_IMG}, NULL, lab);
  H5Fclose(f);
  f = H5Fcreate(floats, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  write_ds(f, "images", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 3, (hsize_t[]){N_IMG, 28, 28}, NULL, pixf);
  write_ds(f, "labels", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, (hsize_t[]){N_IMG}, NULL, lab32);
  H5Fclose(f);
  px_idx_free(&im);
  px_idx_free(&lb);
  free(lab64);
  free(lab32);
  free(pixf);

  px_dataset *base, *ref = idx_subset(&base, N_IMG);
  check_images(contiguous, "images", "labels", ref, "contiguous (N, H, W) uint8, uint8 labels");
  check_images(chunked, "/train/x", "train/y", ref, "chunked+deflate (N, 1, H, W) uint8, int64 big-endian labels");
  check_images(floats, "images", "labels", ref, "contiguous float32 images, int32 labels");
  check_images(tiles, "images", "labels", ref, "chunks of (7, 1, 14, 28) + deflate: per-sample library reads");
  cache_bytes = 2 * 50 * 28 * 28;  // two chunk slots: chunks evicted all the time
  check_images(chunked, "/train/x", "train/y", ref, "chunked+deflate through a 2-slot chunk cache");
  cache_bytes = 0;
  library_reads = true;
  check_images(contiguous, "images", "labels", ref, "contiguous uint8 read by the library (library_reads)");
  check_images(floats, "images", "labels", ref, "contiguous float32 read by the library (library_reads)");
  library_reads = false;
  px_dataset_free(ref);
  px_dataset_free(base);

  // ---- Tokens: one stream, as a shard and as 1-D HDF5 arrays. ----
  uint32_t *tok = malloc(N_TOK * sizeof *tok);
  uint16_t *tok16 = malloc(N_TOK * sizeof *tok16);
  int32_t *tok32 = malloc(N_TOK * sizeof *tok32);
  if (!tok || !tok16 || !tok32) return 1;
  px_rng rng = px_rng_make(5, 0);
  for (size_t k = 0; k < N_TOK; k++) {
    tok[k] = (uint32_t)px_rng_below(&rng, VOCAB);
    tok16[k] = (uint16_t)tok[k];
    tok32[k] = (int32_t)tok[k];
  }
  char shard[128], toks[128];
  path_in(shard, sizeof shard, "train_000000.bin");
  path_in(toks, sizeof toks, "tokens.h5");
  CHECK_OK(px_shard_write(shard, tok, N_TOK, 2));
  f = H5Fcreate(toks, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  write_ds(f, "u16", H5T_STD_U16LE, H5T_NATIVE_UINT16, 1, (hsize_t[]){N_TOK}, NULL, tok16);
  write_ds(f, "u32", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1, (hsize_t[]){N_TOK}, (hsize_t[]){100}, tok);
  write_ds(f, "i32", H5T_STD_I32BE, H5T_NATIVE_INT32, 1, (hsize_t[]){N_TOK}, NULL, tok32);
  H5Fclose(f);
  free(tok);
  free(tok16);
  free(tok32);
  ref = token_ref(shard);
  CHECK(ref->length == (N_TOK - T) / T, "%zu windows", ref->length);
  check_tokens(toks, "u16", ref, "contiguous uint16 tokens");
  check_tokens(toks, "u32", ref, "chunked+deflate uint32 tokens");
  check_tokens(toks, "i32", ref, "contiguous int32 big-endian tokens");
  library_reads = true;
  check_tokens(toks, "u16", ref, "contiguous uint16 tokens read by the library (library_reads)");
  library_reads = false;
  px_dataset_free(ref);

  printf("libhdf5 thread-safe: %s (reads serialised by plexus either way)\n",
         px_hdf5_library_threadsafe() ? "yes" : "no");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_hdf5_batches_equal_idx_and_token_sources");
}
