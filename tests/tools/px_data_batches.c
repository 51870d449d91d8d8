// px_data_batches: the first batches a loader makes of a data path, as raw
// bytes, for tests/test_s3_*.py (the same batches from a local copy and
// from s3://).
//
//   px_data_batches KIND PATH OUT BATCHES [T]
//
// KIND: mnist (PATH a directory or s3:// prefix: its train split), tokens
// (PATH a shard pattern or s3:// prefix, windows of T), images (PATH a
// "path,label" CSV, 1 channel, no crop).  The loader: batch 32, 2 workers
// (PX_BATCHES_WORKERS: another count),
// shuffled with seed 7 (the epoch's random token offsets too).  OUT gets
// each batch's x then y bytes.  Prints "samples N retries R" (R: S3
// requests retried, data/s3.h); an error goes to stderr, exit 1.
#include "data/s3.h"
#include "plexus/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(void) {
  fprintf(stderr, "px_data_batches: %s\n", px_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s mnist|tokens|images PATH OUT BATCHES [T]\n", argv[0]);
    return 2;
  }
  const char *kind = argv[1], *path = argv[2];
  size_t batches = strtoull(argv[4], NULL, 10);
  px_dataset *d = NULL;
  px_status st;
  if (strcmp(kind, "mnist") == 0) {
    st = px_mnist_open(&d, path, "train", 0.2860f, 0.3530f);
  } else if (strcmp(kind, "tokens") == 0) {
    st = px_token_dataset_open(&d, path, argc > 5 ? atoll(argv[5]) : 64, true, 0);
  } else if (strcmp(kind, "images") == 0) {
    px_image_opts io = PX_IMAGE_DEFAULTS;
    io.csv = path;
    io.channels = 1;
    st = px_image_dataset_open(&d, &io);
  } else {
    fprintf(stderr, "px_data_batches: unknown kind %s\n", kind);
    return 2;
  }
  if (st != PX_OK) return fail();
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = 32;
  o.workers = 2;
  const char *w = getenv("PX_BATCHES_WORKERS");
  if (w && *w) o.workers = atoi(w);
  o.seed = 7;
  px_loader *l = NULL;
  FILE *f = fopen(argv[3], "wb");
  if (!f) {
    perror(argv[3]);
    return 1;
  }
  st = px_loader_create(&l, d, &o);
  if (st == PX_OK) st = px_loader_start_epoch(l, 0, 0);
  size_t samples = 0;
  for (size_t k = 0; st == PX_OK && k < batches && k < px_loader_num_batches(l); k++) {
    const px_batch *b;
    st = px_loader_next(l, &b);
    if (st != PX_OK) break;
    fwrite(b->x.data, 1, px_tensor_nbytes(&b->x), f);
    fwrite(b->y.data, 1, px_tensor_nbytes(&b->y), f);
    samples += b->n;
  }
  fclose(f);
  if (st != PX_OK) return fail();
  px_loader_free(l);
  px_dataset_free(d);
  printf("samples %zu retries %llu\n", samples, (unsigned long long)px_s3_retries());
  return 0;
}
