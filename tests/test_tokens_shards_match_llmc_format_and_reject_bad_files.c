/* Claim: px_shard_write writes llm.c's token shard byte for byte (a 256
 * little-endian int32 header: magic, version, count, zeros; then
 * little-endian uint16 tokens, or uint32 with magic 20240801 / version 7),
 * atomically; the token dataset over a glob takes the matching shards in
 * sorted order and makes sample i the window x = tokens[s..s+T),
 * y = tokens[s+1..s+T] with windows that never cross a shard boundary; and
 * a bad shard — bad magic, wrong version, header or body cut short, a body
 * longer than the count says, a pattern matching nothing, shards too small
 * for one window, a uint16 shard asked to hold 65,536 — is an error that
 * names the file and says what was expected.  If it failed, llm.c's shards
 * would be misread (or ours unreadable by llm.c), a model would train on
 * windows spanning two documents or out of order, or a damaged shard would
 * be read as garbage. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "test_dir.h"

static size_t slurp(const char *path, unsigned char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  size_t n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

static void spit(const char *path, const unsigned char *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  fwrite(buf, 1, n, f);
  fclose(f);
}

static int32_t word(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static void bytes_are_llmc_format(void) {
  const uint32_t toks[5] = {0, 1, 258, 50256, 65535};
  unsigned char b[4096];
  CHECK_OK(px_shard_write(in_dir("a16.bin"), toks, 5, 2));
  size_t n = slurp(in_dir("a16.bin"), b, sizeof b);
  CHECK(n == 1024 + 10, "uint16 shard of 5 tokens is %zu bytes", n);
  CHECK(word(b) == 20240520 && word(b + 4) == 1 && word(b + 8) == 5, "uint16 header %d %d %d", word(b), word(b + 4),
        word(b + 8));
  bool zeros = true;
  for (int k = 12; k < 1024; k++) zeros = zeros && b[k] == 0;
  CHECK(zeros, "header words 3..255 are not zero");
  const unsigned char want16[10] = {0, 0, 1, 0, 2, 1, 0x50, 0xC4, 0xFF, 0xFF};
  CHECK(memcmp(b + 1024, want16, 10) == 0, "uint16 tokens are not little-endian");

  const uint32_t big[3] = {65536, 128255, 7};
  CHECK_OK(px_shard_write(in_dir("a32.bin"), big, 3, 4));
  n = slurp(in_dir("a32.bin"), b, sizeof b);
  CHECK(n == 1024 + 12 && word(b) == 20240801 && word(b + 4) == 7 && word(b + 8) == 3, "uint32 shard header");
  CHECK(word(b + 1024) == 65536 && word(b + 1028) == 128255 && word(b + 1032) == 7, "uint32 tokens");

  px_shard_info info;
  CHECK_OK(px_shard_parse_header(b, n, n, "a32.bin", &info));
  CHECK(info.token_bytes == 4 && info.num_tokens == 3, "parsed %d-byte tokens, %llu of them", info.token_bytes,
        (unsigned long long)info.num_tokens);

  px_status st = px_shard_write(in_dir("no.bin"), big, 3, 2);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "token 65536 at position 0") &&
          strstr(px_last_error(), "token_bytes 4"),
        "uint16 shard took 65536: %s", px_last_error());
  st = px_shard_write(in_dir("no.bin"), big, 3, 3);
  CHECK(st == PX_ERR_INVALID, "token_bytes 3 accepted");
  // Atomic: no temporary file left beside the shards.
  DIR *dd = opendir(dir);
  struct dirent *e;
  while ((e = readdir(dd)))
    CHECK(!strstr(e->d_name, ".tmp") && strcmp(e->d_name, "no.bin") != 0, "left behind: %s", e->d_name);
  closedir(dd);
}

static void expect_open_error(const char *pattern, px_status want, const char *a, const char *b) {
  px_dataset *d = (px_dataset *)1;
  px_status st = px_token_dataset_open(&d, pattern, 4, false, 0);
  CHECK(st == want && d == NULL, "open %s: %s, expected %s (%s)", pattern, px_status_name(st), px_status_name(want),
        px_last_error());
  CHECK(strstr(px_last_error(), a) && (!b || strstr(px_last_error(), b)), "message lacks \"%s\"/\"%s\": %s", a,
        b ? b : "", px_last_error());
}

static void bad_shards_are_named_errors(void) {
  uint32_t toks[40];
  for (int i = 0; i < 40; i++) toks[i] = (uint32_t)i;
  CHECK_OK(px_shard_write(in_dir("good.bin"), toks, 40, 2));
  unsigned char b[4096];
  size_t n = slurp(in_dir("good.bin"), b, sizeof b);

  b[0] ^= 1;
  spit(in_dir("bad_magic.bin"), b, n);
  expect_open_error(in_dir("bad_magic.bin"), PX_ERR_FORMAT, "bad magic 20240521", "20240520 (uint16 tokens)");
  CHECK(strstr(px_last_error(), in_dir("bad_magic.bin")), "no file name: %s", px_last_error());
  b[0] ^= 1;
  b[4] = 2;
  spit(in_dir("bad_version.bin"), b, n);
  expect_open_error(in_dir("bad_version.bin"), PX_ERR_FORMAT, "version 2 with magic 20240520", "expected version 1");
  b[4] = 1;
  spit(in_dir("cut_head.bin"), b, 700);
  expect_open_error(in_dir("cut_head.bin"), PX_ERR_FORMAT, "truncated header", "has 700 bytes");
  spit(in_dir("cut_body.bin"), b, n - 3);
  expect_open_error(in_dir("cut_body.bin"), PX_ERR_FORMAT, "truncated body", "2 tokens missing");
  b[n] = 9;
  b[n + 1] = 9;
  spit(in_dir("long_body.bin"), b, n + 2);
  expect_open_error(in_dir("long_body.bin"), PX_ERR_FORMAT, "count mismatch", "2 bytes extra");
  b[8] = 0xFF;
  b[9] = b[10] = b[11] = 0xFF;
  spit(in_dir("neg_count.bin"), b, n);
  expect_open_error(in_dir("neg_count.bin"), PX_ERR_FORMAT, "negative token count", NULL);
  expect_open_error(in_dir("nothing_*.bin"), PX_ERR_NOT_FOUND, "no file matches", "nothing_*.bin");
  CHECK_OK(px_shard_write(in_dir("tiny_1.bin"), toks, 4, 2));
  expect_open_error(in_dir("tiny_*.bin"), PX_ERR_INVALID, "give no sample", "4 + 1 tokens");
  // One bad shard among good ones fails the open, naming that shard.
  CHECK_OK(px_shard_write(in_dir("mix_0.bin"), toks, 40, 2));
  spit(in_dir("mix_1.bin"), b, 100);
  expect_open_error(in_dir("mix_*.bin"), PX_ERR_FORMAT, in_dir("mix_1.bin"), "truncated header");
}

// Three shards written out of order; shard k holds tokens 1000·k + t.
static void windows_in_sorted_shards(void) {
  const size_t len[3] = {24, 9, 41};  // T = 4: 5, 2 and 10 windows (24: the last token has no successor)
  for (int k = 2; k >= 0; k--) {
    uint32_t toks[64];
    for (size_t t = 0; t < len[k]; t++) toks[t] = (uint32_t)(1000 * k + (int)t);
    char name[64];
    snprintf(name, sizeof name, "seq_%06d.bin", k);
    CHECK_OK(px_shard_write(in_dir(name), toks, len[k], k == 1 ? 4 : 2));
  }
  spit(in_dir("seq_notes.txt"), (const unsigned char *)"not a shard", 11);  // not matched by the glob
  px_dataset *d;
  CHECK_OK(px_token_dataset_open(&d, in_dir("seq_*.bin"), 4, false, 3100));
  CHECK(d->length == 5 + 2 + 10, "%zu samples, expected 17", d->length);
  CHECK(d->x_dtype == PX_I32 && d->y_dtype == PX_I32 && d->x_ndim == 1 && d->x_shape[0] == 4 && d->y_ndim == 1 &&
          d->y_shape[0] == 4 && d->num_classes == 3100 && strcmp(d->kind, "tokens") == 0,
        "dataset shape or kind");
  px_batch b;
  CHECK_OK(px_batch_alloc(&b, d, 2));
  for (size_t i = 0; i < d->length; i++) {
    int k = i < 5 ? 0 : i < 7 ? 1 : 2;
    size_t j = i - (k == 0 ? 0 : k == 1 ? 5 : 7);
    px_rng rng = px_rng_make(1, i);
    CHECK_OK(px_dataset_get(d, i, &b, i % 2, &rng));
    const int32_t *x = (const int32_t *)b.x.data + (i % 2) * 4, *y = (const int32_t *)b.y.data + (i % 2) * 4;
    for (int t = 0; t < 4; t++) {
      int32_t want = 1000 * k + (int32_t)(j * 4) + t;
      CHECK(x[t] == want && y[t] == want + 1, "sample %zu t %d: x %d y %d, expected %d %d", i, t, x[t], y[t], want,
            want + 1);
    }
  }
  px_batch_free(&b);
  px_dataset_free(d);

  // With random offsets shard k holds floor((n_k - T) / T) windows.
  CHECK_OK(px_token_dataset_open(&d, in_dir("seq_*.bin"), 4, true, 0));
  CHECK(d->length == 5 + 1 + 9 && d->num_classes == 0, "%zu samples with offsets, expected 15", d->length);
  px_dataset_free(d);

  // vocab_size bounds every token: shard 2's tokens 2000.. are outside 2010.
  CHECK_OK(px_token_dataset_open(&d, in_dir("seq_*.bin"), 4, false, 2010));
  CHECK_OK(px_batch_alloc(&b, d, 1));
  px_rng rng = px_rng_make(1, 0);
  CHECK_OK(px_dataset_get(d, 7, &b, 0, &rng));       // tokens 2000..2004
  px_status st = px_dataset_get(d, 9, &b, 0, &rng);  // tokens 2008..2012
  CHECK(st == PX_ERR_FORMAT && strstr(px_last_error(), in_dir("seq_000002.bin")) &&
          strstr(px_last_error(), "position 10 (sample 9) is 2010") && strstr(px_last_error(), "vocabulary of 2010"),
        "token outside the vocabulary: %s", px_last_error());
  px_batch_free(&b);
  px_dataset_free(d);
  st = px_token_dataset_open(&d, in_dir("seq_*.bin"), 0, false, 0);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "T = 0"), "T = 0: %s", px_last_error());
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_tokens_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  bytes_are_llmc_format();
  bad_shards_are_named_errors();
  windows_in_sorted_shards();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_tokens_shards_match_llmc_format_and_reject_bad_files");
}
