/* Claim: a corrupt record in a token shard — a token outside the
 * vocabulary, or windows past the end of a shard cut short after the
 * dataset was opened — stops the loader's epoch with an error naming the
 * shard file, the token position, the sample and the batch, with 0 or 3
 * workers; with skip_bad exactly those samples are left out and counted,
 * every other sample arrives once, and the end-of-epoch report names the
 * file.  (IDX files are checked whole at open — see
 * test_idx_reads_every_type_and_rejects_corrupt_files — so no IDX record
 * can fail later.)  If it failed, a corrupt shard found hours into a run
 * would crash it, feed the model out-of-range token ids, or be skipped with
 * no way to find the bad file. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { T = 10, BS = 8, LEN = 200, BAD_POS = 77, VOCAB = 1000 };

static char dir[64], shard0[128], shard1[128], pattern[128];

// Shard 0: 19 windows (samples 0..18); shard 1: samples 19..37, its window
// 7 (sample 26, tokens 70..80) holds the bad token at position 77.
static void write_shards(void) {
  uint32_t toks[LEN];
  for (int i = 0; i < LEN; i++) toks[i] = (uint32_t)(i * 7 % 900);
  CHECK_OK(px_shard_write(shard0, toks, LEN, 4));
  toks[BAD_POS] = 5000;
  CHECK_OK(px_shard_write(shard1, toks, LEN, 4));
}

// One epoch; returns the number of rows seen per sample in seen[].
static px_status epoch(px_dataset *d, int workers, bool skip_bad, int seen[64], size_t *skipped) {
  px_loader *l;
  px_loader_opts o = PX_LOADER_DEFAULTS;
  o.batch_size = BS;
  o.workers = workers;
  o.shuffle = false;
  o.skip_bad = skip_bad;
  CHECK_OK(px_loader_create(&l, d, &o));
  CHECK_OK(px_loader_start_epoch(l, 0, 0));
  memset(seen, 0, 64 * sizeof *seen);
  px_status st;
  const px_batch *b;
  for (;;) {
    st = px_loader_next(l, &b);
    if (st != PX_OK || !b) break;
    for (size_t r = 0; r < b->n; r++) seen[b->indices[r]]++;
  }
  *skipped = px_loader_skipped(l);
  px_loader_free(l);
  return st;
}

static void bad_token(int workers) {
  px_dataset *d;
  CHECK_OK(px_token_dataset_open(&d, pattern, T, false, VOCAB));
  CHECK(d->length == 38, "%zu samples", d->length);
  int seen[64];
  size_t skipped;
  px_status st = epoch(d, workers, false, seen, &skipped);
  CHECK(st == PX_ERR_FORMAT, "workers %d: %s, expected PX_ERR_FORMAT", workers, px_status_name(st));
  CHECK(strstr(px_last_error(), shard1) && strstr(px_last_error(), "position 77 (sample 26) is 5000") &&
          strstr(px_last_error(), "vocabulary of 1000") && strstr(px_last_error(), "batch 3"),
        "message does not name file, position, sample and batch: %s", px_last_error());

  // skip_bad: only sample 26 is left out.  Capture the end-of-epoch report.
  fflush(stderr);
  int saved = dup(2);
  FILE *cap = tmpfile();
  dup2(fileno(cap), 2);
  st = epoch(d, workers, true, seen, &skipped);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  CHECK(st == PX_OK && skipped == 1, "workers %d: skip_bad gave %s, %zu skipped", workers, px_status_name(st), skipped);
  for (int i = 0; i < 38; i++) CHECK(seen[i] == (i == 26 ? 0 : 1), "sample %d seen %d times", i, seen[i]);
  char text[2048] = {0};
  rewind(cap);
  size_t got = fread(text, 1, sizeof text - 1, cap);
  fclose(cap);
  CHECK(got > 0 && strstr(text, "skipped 1 bad record") && strstr(text, shard1) && strstr(text, "position 77"),
        "report: %s", text);
  px_dataset_free(d);
}

// A shard cut short after open: the windows past its new end are I/O
// errors naming the file, skipped with skip_bad.
static void shard_cut_after_open(int workers) {
  write_shards();
  px_dataset *d;
  CHECK_OK(px_token_dataset_open(&d, pattern, T, false, 0));  // no vocabulary check: 5000 passes
  CHECK(truncate(shard1, 1024 + 4 * 100) == 0, "truncate %s", shard1);
  int seen[64];
  size_t skipped;
  px_status st = epoch(d, workers, false, seen, &skipped);
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), shard1) && strstr(px_last_error(), "sample 28") &&
          strstr(px_last_error(), "cut short"),
        "workers %d: %s: %s", workers, px_status_name(st), px_last_error());
  fflush(stderr);
  int saved = dup(2);
  FILE *cap = tmpfile();
  dup2(fileno(cap), 2);
  st = epoch(d, workers, true, seen, &skipped);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fclose(cap);
  // Shard 1 keeps tokens 0..99: windows 0..8 (samples 19..27) still read.
  CHECK(st == PX_OK && skipped == 10, "workers %d: %zu skipped, expected 10", workers, skipped);
  for (int i = 0; i < 38; i++) CHECK(seen[i] == (i >= 28 ? 0 : 1), "sample %d seen %d times", i, seen[i]);
  px_dataset_free(d);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_badshard_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  snprintf(shard0, sizeof shard0, "%s/data_000000.bin", dir);
  snprintf(shard1, sizeof shard1, "%s/data_000001.bin", dir);
  snprintf(pattern, sizeof pattern, "%s/data_*.bin", dir);
  write_shards();
  bad_token(0);
  bad_token(3);
  shard_cut_after_open(0);
  shard_cut_after_open(3);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_loader_reports_corrupt_shard_records");
}
