/* Claim: px_mnist_open reads the real Fashion-MNIST (Debian's
 * dataset-fashion-mnist, gzip IDX files in /usr/share/datasets/fashion-mnist):
 * 60,000 training images of 1×28×28 with exactly 6,000 of each of the 10
 * classes, 10,000 test images with exactly 1,000 each, pixels in [0, 1]
 * (mean 0, std 1) whose mean and standard deviation are the published
 * 0.2860 / 0.3530 (train), and that normalising with those gives mean 0 and
 * std 1.  If it failed, the training command's Fashion-MNIST runs would
 * train on misread images or labels. */
#include "px_test.h"

#include <string.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

// Mean and std of all pixels of the split, and images per class, read
// through the loader (3 workers) as a training run reads them.
static void stats(px_dataset *d, double *mean, double *std, size_t per_class[10]) {
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = 1000;
  o.workers = 3;
  CHECK_OK(px_loader_create(&l, d, &o));
  CHECK_OK(px_loader_start_epoch(l, 0, 0));
  double s = 0, s2 = 0;
  size_t count = 0;
  memset(per_class, 0, 10 * sizeof *per_class);
  const px_batch *b;
  for (;;) {
    CHECK_OK(px_loader_next(l, &b));
    if (!b) break;
    const float *x = b->x.data;
    for (size_t k = 0; k < b->n * 784; k++) {
      s += x[k];
      s2 += (double)x[k] * x[k];
    }
    for (size_t r = 0; r < b->n; r++) {
      int32_t y = ((const int32_t *)b->y.data)[r];
      if (y >= 0 && y < 10) per_class[y]++;
    }
    count += b->n * 784;
  }
  *mean = s / (double)count;
  *std = sqrt(s2 / (double)count - *mean * *mean);
  px_loader_free(l);
}

int main(void) {
  size_t per_class[10];
  double mean, std;
  px_dataset *d;
  CHECK_OK(px_mnist_open(&d, FMNIST_DIR, "train", 0.0f, 1.0f));
  CHECK(d->length == 60000 && d->num_classes == 10 && d->x_ndim == 3 && d->x_shape[0] == 1 && d->x_shape[1] == 28 &&
          d->x_shape[2] == 28,
        "train: %zu samples, %zu classes, %lld×%lld×%lld", d->length, d->num_classes, (long long)d->x_shape[0],
        (long long)d->x_shape[1], (long long)d->x_shape[2]);
  stats(d, &mean, &std, per_class);
  for (int c = 0; c < 10; c++) CHECK(per_class[c] == 6000, "train class %d has %zu images", c, per_class[c]);
  CHECK(fabs(mean - 0.2860) < 5e-4 && fabs(std - 0.3530) < 5e-4, "train pixels: mean %.4f std %.4f", mean, std);
  px_dataset_free(d);

  CHECK_OK(px_mnist_open(&d, FMNIST_DIR, "train", 0.2860f, 0.3530f));
  stats(d, &mean, &std, per_class);
  CHECK(fabs(mean) < 2e-3 && fabs(std - 1) < 2e-3, "normalised train pixels: mean %.4f std %.4f", mean, std);
  px_dataset_free(d);

  CHECK_OK(px_mnist_open(&d, FMNIST_DIR, "test", 0.0f, 1.0f));
  CHECK(d->length == 10000 && d->num_classes == 10, "test: %zu samples, %zu classes", d->length, d->num_classes);
  stats(d, &mean, &std, per_class);
  for (int c = 0; c < 10; c++) CHECK(per_class[c] == 1000, "test class %d has %zu images", c, per_class[c]);
  CHECK(fabs(mean - 0.2868) < 5e-4 && fabs(std - 0.3524) < 5e-4, "test pixels: mean %.4f std %.4f", mean, std);
  px_dataset_free(d);
  return px_test_finish("test_idx_fashion_mnist_has_60000_train_10000_test");
}
