// bench_loader: plexus's prefetching loader, in samples per second, on
// Fashion-MNIST (Debian's IDX files; batch 256, normalised) and on a folder of
// JPEGs listed in a "path,label" CSV (random crop + flip + normalise, batch
// 64), for several worker counts.  bench/run_loader.sh runs it beside
// bench_loader_torch.py and prints the table.
//
//   bench_loader make-jpegs DIR COUNT SIZE      write COUNT SIZE×SIZE JPEGs + DIR/list.csv
//   bench_loader fmnist DIR WORKERS EPOCHS      DIR holds train-images-idx3-ubyte.gz, ...
//   bench_loader jpeg CSV CROP WORKERS EPOCHS
//   bench_loader make-h5 DIR FILE CHUNK        Fashion-MNIST's training set from DIR's IDX files
//                                              into FILE ("images" (N, 28, 28) uint8, "labels"
//                                              int64): contiguous (CHUNK 0), or chunks of CHUNK
//                                              images compressed with deflate (level 4)
//   bench_loader hdf5 FILE WORKERS EPOCHS [CACHE_MIB | lib]   (or hdf5z: the same, named so;
//                                              lib: every read through libhdf5, per sample)
//                                              that file through px_hdf5_dataset_open (batch
//                                              256, normalised as fmnist; chunk cache CACHE_MIB)
//
// Each run prints one line:
//   plexus <case> workers=W samples=N warmup_s=S epoch_s=S samples_per_s=R wait_s=S
// where the warm-up epoch (thread start, first page-cache reads) is timed
// apart, and samples_per_s is over the EPOCHS epochs after it.
//
// Fashion-MNIST is read by px_mnist_open (the IDX source: the files are
// inflated and held in memory at open; get maps u8 -> (v/255 - mean)/std).
#define _POSIX_C_SOURCE 200809L
#include "plexus/plexus.h"

#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fail(const char *what) {
  fprintf(stderr, "bench_loader: %s: %s\n", what, px_last_error());
  return 1;
}

// ---- JPEG generation ----------------------------------------------------------
// Photograph-like content (smooth colour fields, edges and noise) so the
// files are of realistic size (~15-25 KB at 256×256, quality 90).
static int make_jpegs(const char *dir, int count, int size) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    perror(dir);
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/list.csv", dir);
  FILE *csv = fopen(path, "w");
  if (!csv) {
    perror(path);
    return 1;
  }
  fprintf(csv, "path,label\n");
  px_image img = {.width = size, .height = size, .channels = 3, .data = malloc((size_t)size * size * 3)};
  px_rng rng = px_rng_make(1234, 0);
  for (int i = 0; i < count; i++) {
    float fx = 0.02f + 0.08f * px_rng_uniform(&rng), fy = 0.02f + 0.08f * px_rng_uniform(&rng);
    int base[3] = {(int)px_rng_below(&rng, 200), (int)px_rng_below(&rng, 200), (int)px_rng_below(&rng, 200)};
    int cx = (int)px_rng_below(&rng, (uint64_t)size), cy = (int)px_rng_below(&rng, (uint64_t)size);
    int r2 = (int)(size * size / 16);
    for (int y = 0; y < size; y++)
      for (int x = 0; x < size; x++) {
        bool disc = (x - cx) * (x - cx) + (y - cy) * (y - cy) < r2;
        for (int c = 0; c < 3; c++) {
          float v = (float)base[c] + 40.0f * sinf(fx * (float)x * (float)(c + 1)) * cosf(fy * (float)y) +
            (disc ? 50.0f : 0.0f) + 12.0f * (px_rng_uniform(&rng) - 0.5f);
          img.data[((size_t)y * size + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
      }
    snprintf(path, sizeof path, "%s/img_%05d.jpg", dir, i);
    if (px_image_save(path, &img, 90) != PX_OK) return fail("make-jpegs");
    fprintf(csv, "img_%05d.jpg,%d\n", i, i % 10);
  }
  free(img.data);
  return fclose(csv) == 0 ? 0 : 1;
}

// ---- An HDF5 copy of Fashion-MNIST -------------------------------------------------
static int make_h5(const char *dir, const char *file, int chunk) {
  char ip[4096], lp[4096];
  snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte.gz", dir);
  snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte.gz", dir);
  px_idx im, lb;
  if (px_idx_read(ip, &im) != PX_OK || px_idx_read(lp, &lb) != PX_OK) return fail("make-h5");
  const hsize_t n = (hsize_t)im.dims[0];
  int64_t *labels = malloc(n * sizeof *labels);
  if (!labels) return 1;
  for (hsize_t i = 0; i < n; i++) labels[i] = ((const uint8_t *)lb.data)[i];
  hid_t f = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (chunk > 0) {
    H5Pset_chunk(dcpl, 3, (hsize_t[]){(hsize_t)chunk, 28, 28});
    H5Pset_deflate(dcpl, 4);
  }
  hid_t sp = H5Screate_simple(3, (hsize_t[]){n, 28, 28}, NULL);
  hid_t d = H5Dcreate2(f, "images", H5T_STD_U8LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  herr_t r = H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, im.data);
  H5Dclose(d);
  H5Sclose(sp);
  sp = H5Screate_simple(1, &n, NULL);
  d = H5Dcreate2(f, "labels", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (r >= 0) r = H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels);
  H5Dclose(d);
  H5Sclose(sp);
  H5Pclose(dcpl);
  free(labels);
  px_idx_free(&im);
  px_idx_free(&lb);
  if (H5Fclose(f) < 0 || r < 0 || f < 0) {
    fprintf(stderr, "bench_loader: make-h5: writing %s failed\n", file);
    return 1;
  }
  return 0;
}

// ---- Timing ---------------------------------------------------------------------
static int run(const char *name, px_dataset *d, size_t batch, int workers, int epochs) {
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = batch;
  o.workers = workers;
  o.shuffle = true;
  o.seed = 42;
  px_loader *l;
  if (px_loader_create(&l, d, &o) != PX_OK) return fail("loader");
  double warm = 0, timed = 0, wait = 0;
  size_t samples = 0;
  double checksum = 0;  // touch each batch, as a training step would read it
  for (int e = 0; e <= epochs; e++) {
    double t0 = px_time_now();
    if (px_loader_start_epoch(l, (uint64_t)e, 0) != PX_OK) return fail("start epoch");
    const px_batch *b;
    for (;;) {
      if (px_loader_next(l, &b) != PX_OK) return fail("next");
      if (!b) break;
      checksum += ((const float *)b->x.data)[0];
      if (e > 0) samples += b->n;
    }
    double dt = px_time_now() - t0;
    if (e == 0) {
      warm = dt;
    } else {
      timed += dt;
      wait += px_loader_wait_seconds(l);
    }
  }
  printf("plexus %s workers=%d samples=%zu warmup_s=%.3f epoch_s=%.3f samples_per_s=%.1f wait_s=%.3f check=%g\n", name,
         workers, samples, warm, timed / epochs, (double)samples / timed, wait, checksum);
  fflush(stdout);
  px_loader_free(l);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "make-jpegs") == 0) return make_jpegs(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (argc == 5 && strcmp(argv[1], "fmnist") == 0) {
    // Fashion-MNIST's training-set mean and std.
    px_dataset *d;
    if (px_mnist_open(&d, argv[2], "train", 0.2860f, 0.3530f) != PX_OK) return fail("fmnist");
    int rc = run("fmnist", d, 256, atoi(argv[3]), atoi(argv[4]));
    px_dataset_free(d);
    return rc;
  }
  if (argc == 5 && strcmp(argv[1], "make-h5") == 0) return make_h5(argv[2], argv[3], atoi(argv[4]));
  if ((argc == 5 || argc == 6) && (strcmp(argv[1], "hdf5") == 0 || strcmp(argv[1], "hdf5z") == 0)) {
    px_hdf5_opts o = PX_HDF5_DEFAULTS;
    o.path = argv[2];
    // A 5th argument: the chunk cache in MiB, or "lib": every read through
    // libhdf5 (library_reads: per-sample H5Dread under plexus's HDF5 lock).
    if (argc == 6 && strcmp(argv[5], "lib") == 0) o.library_reads = true;
    else if (argc == 6) o.cache_bytes = (size_t)atoi(argv[5]) << 20;
    for (int c = 0; c < 3; c++) o.mean[c] = 0.2860f, o.std[c] = 0.3530f;
    px_dataset *d;
    if (px_hdf5_dataset_open(&d, &o) != PX_OK) return fail("hdf5");
    int rc = run(argv[1], d, 256, atoi(argv[3]), atoi(argv[4]));
    px_dataset_free(d);
    return rc;
  }
  if (argc == 6 && strcmp(argv[1], "jpeg") == 0) {
    px_image_opts o = PX_IMAGE_DEFAULTS;
    o.csv = argv[2];
    o.crop = atoi(argv[3]);
    o.random_crop = true;
    o.hflip = true;
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    memcpy(o.mean, mean, sizeof mean);
    memcpy(o.std, std, sizeof std);
    px_dataset *d;
    if (px_image_dataset_open(&d, &o) != PX_OK) return fail("open");
    int rc = run("jpeg", d, 64, atoi(argv[4]), atoi(argv[5]));
    px_dataset_free(d);
    return rc;
  }
  fprintf(stderr,
          "usage: %s make-jpegs DIR COUNT SIZE | fmnist DIR WORKERS EPOCHS | jpeg CSV CROP WORKERS EPOCHS | "
          "make-h5 DIR FILE CHUNK | hdf5 FILE WORKERS EPOCHS [CACHE_MIB|lib]\n",
          argv[0]);
  return 2;
}
