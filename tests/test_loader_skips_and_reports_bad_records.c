/* Claim: a record whose fetch fails stops the epoch with an error that
 * names the record (and the batch), whatever the number of workers; with
 * skip_bad the loader leaves that record out, counts it, keeps every good
 * record exactly once, and prints one report at the end of the epoch.
 * If it failed, a corrupt file would crash or hang training, feed garbage,
 * or be skipped silently. */
#include "loader_synthetic.h"
#include "px_test.h"

#include <string.h>
#include <unistd.h>

enum { N = 120, BS = 16, BAD_EVERY = 10 };

static void strict(int workers) {
  px_dataset *d = synth_open(N, 0, BAD_EVERY);
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = BS;
  o.workers = workers;
  o.shuffle = false;
  CHECK_OK(px_loader_create(&l, d, &o));
  CHECK_OK(px_loader_start_epoch(l, 0, 0));
  const px_batch *b;
  px_status st = px_loader_next(l, &b);
  CHECK(st == PX_ERR_FORMAT, "workers %d: got %s, expected PX_ERR_FORMAT", workers, px_status_name(st));
  CHECK(b == NULL, "a failed batch was handed out");
  CHECK(strstr(px_last_error(), "record 9 is corrupt") && strstr(px_last_error(), "batch 0"),
        "message does not name the record and batch: %s", px_last_error());
  px_loader_free(l);
  px_dataset_free(d);
}

static void skipping(int workers) {
  px_dataset *d = synth_open(N, 0, BAD_EVERY);
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = BS;
  o.workers = workers;
  o.skip_bad = true;
  CHECK_OK(px_loader_create(&l, d, &o));
  // Capture stderr to read the end-of-epoch report.
  fflush(stderr);
  int saved = dup(2);
  FILE *cap = tmpfile();
  dup2(fileno(cap), 2);
  int seen[N] = {0};
  for (int e = 0; e < 2; e++) {
    CHECK_OK(px_loader_start_epoch(l, (uint64_t)e, 0));
    const px_batch *b;
    size_t rows = 0;
    for (;;) {
      CHECK_OK(px_loader_next(l, &b));
      if (!b) break;
      for (size_t j = 0; j < b->n; j++) {
        int32_t i = ((const int32_t *)b->y.data)[j];
        CHECK(i % BAD_EVERY != BAD_EVERY - 1, "bad record %d was handed out", i);
        CHECK(((const float *)b->x.data)[3 * j] == (float)i, "row %zu holds the wrong sample", j);
        if (e == 0) seen[i]++;
      }
      rows += b->n;
    }
    CHECK(px_loader_skipped(l) == N / BAD_EVERY, "skipped %zu, expected %d", px_loader_skipped(l), N / BAD_EVERY);
    CHECK(rows == N - N / BAD_EVERY, "epoch %d: %zu good rows, expected %d", e, rows, N - N / BAD_EVERY);
  }
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  for (int i = 0; i < N; i++)
    CHECK(seen[i] == (i % BAD_EVERY == BAD_EVERY - 1 ? 0 : 1), "sample %d seen %d times", i, seen[i]);
  char text[4096] = {0};
  rewind(cap);
  size_t got = fread(text, 1, sizeof text - 1, cap);
  fclose(cap);
  CHECK(got > 0 && strstr(text, "loader: skipped 12 bad records in epoch 0") &&
          strstr(text, "loader: skipped 12 bad records in epoch 1") && strstr(text, "is corrupt"),
        "end-of-epoch report missing or wrong: %s", text);
  px_loader_free(l);
  px_dataset_free(d);
}

int main(void) {
  for (int w = 0; w <= 3; w += 3) {
    strict(w);
    skipping(w);
  }
  return px_test_finish("test_loader_skips_and_reports_bad_records");
}
