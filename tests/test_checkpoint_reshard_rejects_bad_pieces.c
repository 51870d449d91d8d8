/* Claim: loading by intersection (px_checkpoint_load_boxes) refuses a bad
 * checkpoint with one message naming the file and the tensor, and loads
 * nothing: a missing rank's file, saved pieces that overlap or leave a
 * hole (flat ranges, and boxes along dimension 1), a file of pieces of a
 * newer format version, an index (metadata.json) of a newer version, a
 * flipped byte in a piece (caught by the index's per-piece CRC-32C when the
 * loader reads only that piece, by SHA-256 without an index), and an index
 * that disagrees with a file that SHA256SUMS still vouches for.  A good
 * checkpoint loads a range that spans three saved files exactly; through
 * the index, a load opens only the files it needs (a file it does not need
 * may be missing: px_checkpoint_verify is what checks the whole).
 *
 * If it failed, a resharded resume could train on a model with holes or
 * doubled ranges, or on bytes that changed on disk, or half-load and leave
 * the run in a state no checkpoint describes. */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_test_util.h"
#include "io/sha256.h"
#include "px_test.h"

#include <string.h>
#include <unistd.h>

// Whole tensors a (3, 5) and b (7,): a[i] = i, b[i] = 100 + i.
static float A[15], B[7];
static char root[64];

// Writes step `step` as 3 files of pieces (a cut 6 | 6 | 3, b 4 | 3 | 0),
// as 3 ranks would: `shift` moves file 1's range of a back by one (an
// overlap with file 0, a hole after), `skip` leaves file `skip` out (a
// hole), `version` is the pieces version written, `indexed` whether the
// checkpoint gets its index (px_checkpoint_write_all) or not.
static px_status write_step(int64_t step, int shift, int skip, const char *version, bool indexed) {
  static const size_t a_off[3] = {0, 6, 12}, a_cnt[3] = {6, 6, 3}, b_off[3] = {0, 4, 7}, b_cnt[3] = {4, 3, 0};
  px_tensor_piece p[3][2];
  px_state_dict sd[3];
  char *json[3] = {0}, name[3][64];
  px_kv meta[3][3];
  px_ckpt_item items[3];
  memset(items, 0, sizeof items);
  int n_items = 0;
  for (int r = 0; r < 3; r++) {
    int n = 0;
    size_t ao = a_off[r] - (r == 1 ? (size_t)shift : 0);
    p[r][n++] =
      (px_tensor_piece){.key = "a", .ndim = 2, .shape = {3, 5}, .offset = ao, .count = a_cnt[r], .data = A + ao};
    if (b_cnt[r])
      p[r][n++] = (px_tensor_piece){.key = "b",
                                    .ndim = 1,
                                    .shape = {7},
                                    .offset = b_off[r],
                                    .count = b_cnt[r],
                                    .data = B + b_off[r]};
    CHECK_OK(px_pieces_state_dict(p[r], n, &sd[r], &json[r]));
    if (r == skip) continue;
    snprintf(name[r], sizeof name[r], "p.rank%05d-of-00003.safetensors", r);
    meta[r][0] = (px_kv){"format", PX_PIECES_FORMAT};
    meta[r][1] = (px_kv){"version", version};
    meta[r][2] = (px_kv){"pieces", json[r]};
    items[n_items++] = (px_ckpt_item){.name = name[r], .tensors = &sd[r], .metadata = meta[r], .n_metadata = 3};
  }
  char path[256];
  px_status st = indexed ? px_checkpoint_write_all(NULL, root, step, items, n_items, 0, path, sizeof path)
                         : px_checkpoint_write(root, step, items, n_items, 0, path, sizeof path);
  for (int r = 0; r < 3; r++) {
    px_state_dict_free(&sd[r]);
    free(json[r]);
  }
  return st;
}

// Step `step` holding a (3, 5) as column blocks [0:3, c0:c1) and
// [0:3, c2:c3), and b whole, with the index.
static px_status write_columns(int64_t step, int c0, int c1, int c2, int c3) {
  static float blk[2][15];
  px_tensor_piece p[3];
  const int lo[2] = {c0, c2}, hi[2] = {c1, c3};
  for (int k = 0; k < 2; k++) {
    p[k] = (px_tensor_piece){.key = "a",
                             .ndim = 2,
                             .shape = {3, 5},
                             .box_offset = {0, lo[k]},
                             .box_size = {3, hi[k] - lo[k]},
                             .offset = 0,
                             .count = (size_t)(3 * (hi[k] - lo[k])),
                             .data = blk[k]};
    for (int i = 0; i < 3; i++)
      for (int j = lo[k]; j < hi[k]; j++) blk[k][i * (hi[k] - lo[k]) + (j - lo[k])] = A[i * 5 + j];
  }
  p[2] = (px_tensor_piece){.key = "b", .ndim = 1, .shape = {7}, .offset = 0, .count = 7, .data = B};
  px_state_dict sd[2];
  char *json[2];
  CHECK_OK(px_pieces_state_dict(p, 1, &sd[0], &json[0]));      // file 0: a's first block
  CHECK_OK(px_pieces_state_dict(p + 1, 2, &sd[1], &json[1]));  // file 1: the second, and b
  px_kv meta[2][3];
  px_ckpt_item items[2];
  memset(items, 0, sizeof items);
  char name[2][64];
  for (int f = 0; f < 2; f++) {
    snprintf(name[f], sizeof name[f], "p.rank%05d-of-00002.safetensors", f);
    meta[f][0] = (px_kv){"format", PX_PIECES_FORMAT};
    meta[f][1] = (px_kv){"version", PX_PIECES_VERSION};
    meta[f][2] = (px_kv){"pieces", json[f]};
    items[f] = (px_ckpt_item){.name = name[f], .tensors = &sd[f], .metadata = meta[f], .n_metadata = 3};
  }
  char path[256];
  px_status st = px_checkpoint_write_all(NULL, root, step, items, 2, 0, path, sizeof path);
  for (int f = 0; f < 2; f++) {
    px_state_dict_free(&sd[f]);
    free(json[f]);
  }
  return st;
}

// SHA256SUMS rewritten for the files as they are now: what a forger (or a
// newer plexus) would leave, so that only the index can tell.
static void resum(const char *ck) {
  char path[400], *sums = NULL;
  snprintf(path, sizeof path, "%s/SHA256SUMS", ck);
  char *text = ckpt_read_text(path);
  CHECK(text != NULL, "read %s", path);
  size_t cap = strlen(text) + 1, used = 0;
  sums = malloc(cap);
  for (char *line = text; line && *line;) {
    char *nl = strchr(line, '\n');
    *nl = '\0';
    const char *name = line + 66;
    char file[400], hex[PX_SHA256_HEX];
    unsigned char digest[PX_SHA256_BYTES];
    uint64_t size;
    snprintf(file, sizeof file, "%s/%s", ck, name);
    CHECK_OK(px_sha256_file(file, digest, &size));
    px_sha256_hex(digest, hex);
    used += (size_t)snprintf(sums + used, cap - used, "%s  %s\n", hex, name);
    line = nl + 1;
  }
  CHECK(ckpt_write_text(path, sums), "write %s", path);
  free(sums);
  free(text);
}

// What one rank of another layout needs: a [4, 13) (across all three
// files) and b whole.
static float got_a[9], got_b[7];
static px_tensor_piece want[2];

static void reset(void) {
  for (int i = 0; i < 9; i++) got_a[i] = -1.0f;
  for (int i = 0; i < 7; i++) got_b[i] = -1.0f;
  want[0] = (px_tensor_piece){.key = "a", .ndim = 2, .shape = {3, 5}, .offset = 4, .count = 9, .data = got_a};
  want[1] = (px_tensor_piece){.key = "b", .ndim = 1, .shape = {7}, .offset = 0, .count = 7, .data = got_b};
}

static bool untouched(void) {
  for (int i = 0; i < 9; i++)
    if (got_a[i] != -1.0f) return false;
  for (int i = 0; i < 7; i++)
    if (got_b[i] != -1.0f) return false;
  return true;
}

static void step_path(int64_t step, char *ck, size_t cap) {
  snprintf(ck, cap, "%s/step_%08lld", root, (long long)step);
}

// A load of step's checkpoint fails, the message holds every string given,
// and nothing was written into the wanted pieces.
static void expect_refused(int64_t step, const char *what, const char *s1, const char *s2, const char *s3) {
  char ck[256];
  step_path(step, ck, sizeof ck);
  reset();
  px_status st = px_checkpoint_load_boxes(ck, "p.rank", want, 2);
  CHECK(st != PX_OK, "%s: loaded", what);
  const char *m = px_last_error();
  printf("%s: %s\n", what, m);
  const char *s[3] = {s1, s2, s3};
  for (int i = 0; i < 3; i++) CHECK(!s[i] || strstr(m, s[i]), "%s: message lacks \"%s\": %s", what, s[i], m);
  CHECK(untouched(), "%s: the failed load changed the wanted pieces", what);
}

int main(void) {
  for (int i = 0; i < 15; i++) A[i] = (float)i;
  for (int i = 0; i < 7; i++) B[i] = 100.0f + (float)i;
  snprintf(root, sizeof root, "/tmp/px_reshard_bad_XXXXXX");
  CHECK(mkdtemp(root) != NULL, "mkdtemp");
  char ck[256], victim[300];

  // Good, with and without the index: a [4, 13) from three files, b from two.
  for (int indexed = 0; indexed < 2; indexed++) {
    CHECK_OK(write_step(1 + indexed, 0, -1, PX_PIECES_VERSION, indexed));
    step_path(1 + indexed, ck, sizeof ck);
    reset();
    CHECK_OK(px_checkpoint_load_boxes(ck, "p.rank", want, 2));
    CHECK(memcmp(got_a, A + 4, sizeof got_a) == 0 && memcmp(got_b, B, sizeof got_b) == 0, "loaded values differ");
  }

  // A rank's file missing (SHA256SUMS and the index still list it): with
  // the index, a load that needs nothing of it does not notice (it opens
  // only what it needs), one that does is refused naming file and tensor.
  CHECK_OK(write_step(3, 0, -1, PX_PIECES_VERSION, true));
  step_path(3, ck, sizeof ck);
  snprintf(victim, sizeof victim, "%s/p.rank00002-of-00003.safetensors", ck);
  CHECK(unlink(victim) == 0, "unlink %s", victim);
  float b_head[4];
  px_tensor_piece head = {.key = "b", .ndim = 1, .shape = {7}, .offset = 0, .count = 4, .data = b_head};
  CHECK_OK(px_checkpoint_load_boxes(ck, "p.rank", &head, 1));
  CHECK(memcmp(b_head, B, sizeof b_head) == 0, "b [0, 4) from file 0 differs");
  CHECK(px_checkpoint_verify(ck) != PX_OK, "verify passed a checkpoint with a file missing");
  expect_refused(3, "a missing file", "p.rank00002-of-00003.safetensors", "tensor \"a\"", NULL);
  CHECK_OK(write_step(4, 0, -1, PX_PIECES_VERSION, false));
  step_path(4, ck, sizeof ck);
  snprintf(victim, sizeof victim, "%s/p.rank00001-of-00003.safetensors", ck);
  CHECK(unlink(victim) == 0, "unlink %s", victim);
  expect_refused(4, "a missing file (no index)", "p.rank00001-of-00003.safetensors", NULL, NULL);

  // Overlap: file 1's range of a starts one element early.
  CHECK_OK(write_step(5, 1, -1, PX_PIECES_VERSION, true));
  expect_refused(5, "overlapping pieces", "tensor \"a\"", "[5, 6) are in two saved pieces",
                 "p.rank00001-of-00003.safetensors");

  // Hole: no file 1 at all (and nothing lists it).
  CHECK_OK(write_step(6, 0, 1, PX_PIECES_VERSION, true));
  expect_refused(6, "a hole", "tensor \"a\"", "[6, 12) are in no saved piece", NULL);

  // Boxes along dimension 1 that overlap (column 2 twice) or leave a hole
  // (column 2 in neither): a [4, 13) meets column 2 first at (1, 2) = 7.
  CHECK_OK(write_columns(7, 0, 3, 2, 5));
  expect_refused(7, "overlapping column blocks", "tensor \"a\"", "[7, 8) are in two saved pieces",
                 "p.rank00001-of-00002.safetensors");
  CHECK_OK(write_columns(8, 0, 2, 3, 5));
  expect_refused(8, "column blocks with a hole", "tensor \"a\"", "[7, 8) are in no saved piece", NULL);
  CHECK_OK(write_columns(9, 0, 2, 2, 5));
  reset();
  step_path(9, ck, sizeof ck);
  CHECK_OK(px_checkpoint_load_boxes(ck, "p.rank", want, 2));
  CHECK(memcmp(got_a, A + 4, sizeof got_a) == 0, "a [4, 13) from two column blocks differs");

  // A newer pieces version (a checkpoint without an index: this plexus
  // refuses to index what it cannot read, so it cannot write one with).
  CHECK(write_step(10, 0, -1, "99", true) != PX_OK, "a version-99 file of pieces was indexed");
  CHECK_OK(write_step(10, 0, -1, "99", false));
  expect_refused(10, "a newer pieces version", "p.rank00000-of-00003.safetensors", "pieces version 99", NULL);

  // A newer index version (SHA256SUMS redone, as the newer plexus would).
  CHECK_OK(write_step(11, 0, -1, PX_PIECES_VERSION, true));
  step_path(11, ck, sizeof ck);
  snprintf(victim, sizeof victim, "%s/metadata.json", ck);
  char *ix = ckpt_read_text(victim);
  CHECK(ix != NULL, "read %s", victim);
  char *v = ix ? strstr(ix, "\"version\":\t1") : NULL;
  CHECK(v != NULL, "no version 1 in the index: %.200s", ix ? ix : "");
  if (v) v[strlen("\"version\":\t")] = '7';
  CHECK(ckpt_write_text(victim, ix), "rewrite %s", victim);
  free(ix);
  resum(ck);
  CHECK_OK(px_checkpoint_verify(ck));
  expect_refused(11, "a newer index version", "metadata.json", "version 7", NULL);

  // A flipped byte in the last file's piece of a: the index's CRC-32C of
  // that piece catches it (the loader reads only pieces, never the whole
  // file); without an index, the file's SHA-256.
  for (int indexed = 0; indexed < 2; indexed++) {
    CHECK_OK(write_step(12 + indexed, 0, -1, PX_PIECES_VERSION, indexed));
    step_path(12 + indexed, ck, sizeof ck);
    snprintf(victim, sizeof victim, "%s/p.rank00002-of-00003.safetensors", ck);
    CHECK(ckpt_flip_byte(victim, ckpt_file_size(victim) - 2), "flip a byte of %s", victim);
    if (indexed) expect_refused(13, "a flipped byte", "p.rank00002-of-00003.safetensors", "tensor \"a\"", "CRC-32C");
    else expect_refused(12, "a flipped byte (no index)", "p.rank00002-of-00003.safetensors", "SHA-256", NULL);
  }

  // An index that disagrees with a file SHA256SUMS vouches for: file 1
  // replaced by the shifted one of step 5 (a [5, 11)), sums redone.
  CHECK_OK(write_step(14, 0, -1, PX_PIECES_VERSION, true));
  step_path(14, ck, sizeof ck);
  {
    char src[300], cmd[800];
    snprintf(src, sizeof src, "%s/step_00000005/p.rank00001-of-00003.safetensors", root);
    snprintf(victim, sizeof victim, "%s/p.rank00001-of-00003.safetensors", ck);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, victim);
    CHECK(system(cmd) == 0, "%s", cmd);
  }
  resum(ck);
  CHECK_OK(px_checkpoint_verify(ck));
  expect_refused(14, "an index that disagrees with a file", "p.rank00001-of-00003.safetensors", "metadata.json",
                 "disagrees");

  // Another whole shape for a: refused naming the tensor and both shapes.
  step_path(2, ck, sizeof ck);
  reset();
  want[0].shape[0] = 5;
  want[0].shape[1] = 3;
  CHECK(px_checkpoint_load_boxes(ck, "p.rank", want, 2) == PX_ERR_SHAPE, "a (5, 3) load took (3, 5) pieces");
  CHECK(strstr(px_last_error(), "\"a\"") && strstr(px_last_error(), "(3, 5)"), "message: %s", px_last_error());
  CHECK(untouched(), "a refused shape changed the wanted pieces");

  ckpt_rm_rf(root);
  return px_test_finish("test_checkpoint_reshard_rejects_bad_pieces");
}
