/* Claim: the loader's batches depend on (seed, epoch, rank, world) only:
 * 0, 1, 2 and 4 workers with any prefetch depth give byte-identical
 * batches, in sampler order, over several epochs, even when workers finish
 * out of order; an epoch started at batch k (a resumed run) continues with
 * exactly the batches k, k+1, ... of the uninterrupted epoch; and with
 * enough workers the training loop does not wait for data.  If it failed,
 * a run's result would depend on the number of workers, resume would not
 * be exact, or the loop would stall on decoding. */
#include "loader_synthetic.h"
#include "px_test.h"

#include <string.h>

enum { N = 203, BS = 8, EPOCHS = 3 };

typedef struct record {
  size_t n_batches;
  size_t rows[EPOCHS][64];
  float x[EPOCHS][64][BS * 3];
  int32_t y[EPOCHS][64][BS];
} record;

static void run(record *r, int workers, int prefetch, long delay_us) {
  px_dataset *d = synth_open(N, delay_us, 0);
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = BS;
  o.workers = workers;
  o.prefetch = prefetch;
  o.seed = 1234;
  CHECK_OK(px_loader_create(&l, d, &o));
  memset(r, 0, sizeof *r);
  r->n_batches = px_loader_num_batches(l);
  for (int e = 0; e < EPOCHS; e++) {
    CHECK_OK(px_loader_start_epoch(l, (uint64_t)e, 0));
    const px_batch *b;
    size_t k = 0;
    for (;;) {
      CHECK_OK(px_loader_next(l, &b));
      if (!b) break;
      CHECK(b->number == k && b->epoch == (uint64_t)e, "batch %zu of epoch %d came as %zu/%llu", k, e, b->number,
            (unsigned long long)b->epoch);
      CHECK(b->x.shape[0] == (int64_t)b->n && b->y.shape[0] == (int64_t)b->n, "shape[0] != n");
      r->rows[e][k] = b->n;
      memcpy(r->x[e][k], b->x.data, b->n * 3 * sizeof(float));
      memcpy(r->y[e][k], b->y.data, b->n * sizeof(int32_t));
      k++;
    }
    CHECK(k == r->n_batches, "epoch %d gave %zu batches, expected %zu", e, k, r->n_batches);
  }
  px_loader_free(l);
  px_dataset_free(d);
}

static void check_resume(const record *full) {
  px_dataset *d = synth_open(N, 0, 0);
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = BS;
  o.workers = 2;
  o.seed = 1234;
  CHECK_OK(px_loader_create(&l, d, &o));
  // Half an epoch, then "restart" at batch 11 of epoch 1.
  CHECK_OK(px_loader_start_epoch(l, 1, 0));
  const px_batch *b;
  for (int i = 0; i < 5; i++) CHECK_OK(px_loader_next(l, &b));
  CHECK_OK(px_loader_start_epoch(l, 1, 11));
  size_t k = 11;
  for (;;) {
    CHECK_OK(px_loader_next(l, &b));
    if (!b) break;
    CHECK(b->number == k, "resumed batch %zu numbered %zu", k, b->number);
    CHECK(memcmp(b->x.data, full->x[1][k], b->n * 3 * sizeof(float)) == 0, "resumed batch %zu differs", k);
    k++;
  }
  CHECK(k == full->n_batches, "resumed epoch ended at %zu", k);
  px_loader_free(l);
  px_dataset_free(d);
}

// Decoding at 8 samples × ~2 ms = ~16 ms a batch; 4 workers keep up with a
// loop that spends 10 ms a step, so after the first batch it barely waits.
static void check_no_wait(void) {
  px_dataset *d = synth_open(160, 1000, 0);
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = BS;
  o.workers = 4;
  o.prefetch = 8;
  CHECK_OK(px_loader_create(&l, d, &o));
  CHECK_OK(px_loader_start_epoch(l, 0, 0));
  synth_sleep_us(100000);  // as a training loop would spend on its first step
  const px_batch *b;
  size_t n = 0;
  for (;;) {
    CHECK_OK(px_loader_next(l, &b));
    if (!b) break;
    synth_sleep_us(10000);
    n++;
  }
  double serial = (double)160 * 0.002;  // what decoding in the loop would cost
  double waited = px_loader_wait_seconds(l);
  printf("loop waited %.3f s for %zu batches (decoding in the loop: ~%.2f s)\n", waited, n, serial);
  CHECK(waited < 0.4 * serial, "the loop waited %.3f s, decoding alone would take %.3f s", waited, serial);
  px_loader_free(l);
  px_dataset_free(d);
}

int main(void) {
  static record ref, got;
  run(&ref, 0, 0, 0);
  CHECK(ref.n_batches == (N + BS - 1) / BS, "batches %zu", ref.n_batches);
  // The epochs differ from each other (shuffled) and the rng draws are used.
  CHECK(memcmp(ref.y[0], ref.y[1], sizeof ref.y[0]) != 0, "epochs 0 and 1 came in the same order");
  const int cfg[][2] = {{1, 0}, {2, 0}, {4, 0}, {4, 5}, {2, 16}};
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    run(&got, cfg[c][0], cfg[c][1], 200);
    CHECK(got.n_batches == ref.n_batches, "batch count");
    CHECK(memcmp(got.rows, ref.rows, sizeof ref.rows) == 0, "workers %d: batch sizes differ", cfg[c][0]);
    CHECK(memcmp(got.x, ref.x, sizeof ref.x) == 0, "workers %d prefetch %d: inputs differ from 0 workers", cfg[c][0],
          cfg[c][1]);
    CHECK(memcmp(got.y, ref.y, sizeof ref.y) == 0, "workers %d prefetch %d: labels differ", cfg[c][0], cfg[c][1]);
  }
  // Every sample once per epoch (world 1, no padding).
  for (int e = 0; e < EPOCHS; e++) {
    int seen[N] = {0};
    for (size_t k = 0; k < ref.n_batches; k++)
      for (size_t j = 0; j < ref.rows[e][k]; j++) seen[ref.y[e][k][j]]++;
    for (int i = 0; i < N; i++) CHECK(seen[i] == 1, "epoch %d: sample %d seen %d times", e, i, seen[i]);
  }
  check_resume(&ref);
  check_no_wait();
  return px_test_finish("test_loader_batches_identical_for_any_worker_count");
}
