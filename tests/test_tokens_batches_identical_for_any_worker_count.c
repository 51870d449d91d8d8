/* Claim: the token dataset with random window offsets gives byte-identical
 * batches for the same seed with 0, 1 and 4 loader workers, over several
 * epochs; every sample is a window of T+1 consecutive tokens of one shard
 * starting at j·T + o with o in [0, T); and the offsets change from epoch to
 * epoch and from sample to sample.  If it failed, a run's result would
 * depend on the number of workers, windows would straddle two shards or
 * skip tokens, or every epoch would show the model the same windows. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

enum { T = 16, BS = 8, EPOCHS = 3, MAXB = 64 };

static char dir[64];
static const size_t shard_len[3] = {300, 77, 513};

// Shard k's token t is 10000·k + t: a token says where it came from.
static void write_shards(void) {
  uint32_t toks[600];
  for (int k = 0; k < 3; k++) {
    for (size_t t = 0; t < shard_len[k]; t++) toks[t] = (uint32_t)(10000 * k) + (uint32_t)t;
    char path[128];
    snprintf(path, sizeof path, "%s/train_%06d.bin", dir, k);
    CHECK_OK(px_shard_write(path, toks, shard_len[k], 2));
  }
}

typedef struct record {
  size_t n_batches;
  size_t idx[EPOCHS][MAXB][BS];
  int32_t x[EPOCHS][MAXB][BS * T], y[EPOCHS][MAXB][BS * T];
} record;

static void run(record *r, int workers) {
  char pattern[128];
  snprintf(pattern, sizeof pattern, "%s/train_*.bin", dir);
  px_dataset *d;
  CHECK_OK(px_token_dataset_open(&d, pattern, T, true, 30000));
  // Windows per shard with offsets: floor((n - T) / T) = 17, 3, 31.
  CHECK(d->length == 17 + 3 + 31, "%zu samples, expected 51", d->length);
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = BS;
  o.workers = workers;
  o.seed = 2024;
  CHECK_OK(px_loader_create(&l, d, &o));
  memset(r, 0, sizeof *r);
  r->n_batches = px_loader_num_batches(l);
  for (int e = 0; e < EPOCHS; e++) {
    CHECK_OK(px_loader_start_epoch(l, (uint64_t)e, 0));
    const px_batch *b;
    for (size_t k = 0;; k++) {
      CHECK_OK(px_loader_next(l, &b));
      if (!b) break;
      memcpy(r->idx[e][k], b->indices, b->n * sizeof(size_t));
      memcpy(r->x[e][k], b->x.data, b->n * T * sizeof(int32_t));
      memcpy(r->y[e][k], b->y.data, b->n * T * sizeof(int32_t));
    }
  }
  px_loader_free(l);
  px_dataset_free(d);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_tokdet_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  write_shards();
  static record ref, other;
  run(&ref, 1);
  const int counts[2] = {0, 4};
  for (int w = 0; w < 2; w++) {
    run(&other, counts[w]);
    CHECK(memcmp(&ref, &other, sizeof ref) == 0, "batches with %d workers differ from 1 worker", counts[w]);
  }

  // Every row is a window of one shard at j·T + o, o in [0, T).
  const size_t first[3] = {0, 17, 20};
  int offsets_seen[T] = {0};
  size_t changed = 0, rows = 0;
  for (int e = 0; e < EPOCHS; e++)
    for (size_t k = 0; k < ref.n_batches; k++)
      for (size_t r = 0; r < BS && (k * BS + r) < 51; r++) {
        size_t i = ref.idx[e][k][r];
        int shard = i < 17 ? 0 : i < 20 ? 1 : 2;
        size_t j = i - first[shard];
        const int32_t *x = &ref.x[e][k][r * T], *y = &ref.y[e][k][r * T];
        int32_t s = x[0] - 10000 * shard;
        int32_t off = s - (int32_t)(j * T);
        CHECK(off >= 0 && off < T, "epoch %d sample %zu: window starts at %d, outside [%zu, %zu)", e, i, s, j * T,
              j * T + T);
        if (off >= 0 && off < T) offsets_seen[off]++;
        for (int t = 0; t < T; t++)
          CHECK(x[t] == x[0] + t && y[t] == x[0] + t + 1, "epoch %d sample %zu: not T+1 consecutive tokens", e, i);
        CHECK(y[T - 1] - 10000 * shard < (int32_t)shard_len[shard], "sample %zu reads past its shard", i);
        // The same sample in epoch 0: a different offset most of the time.
        if (e == 1) {
          for (size_t k0 = 0; k0 < ref.n_batches; k0++)
            for (size_t r0 = 0; r0 < BS && (k0 * BS + r0) < 51; r0++)
              if (ref.idx[0][k0][r0] == i) changed += ref.x[0][k0][r0 * T] != x[0];
        }
        rows++;
      }
  CHECK(rows == 3 * 51, "%zu rows in 3 epochs", rows);
  int distinct = 0;
  for (int o = 0; o < T; o++) distinct += offsets_seen[o] > 0;
  CHECK(distinct >= T / 2, "only %d distinct offsets in %zu windows", distinct, rows);
  CHECK(changed >= 51 * 3 / 4, "only %zu of 51 samples moved between epochs 0 and 1", changed);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_tokens_batches_identical_for_any_worker_count");
}
