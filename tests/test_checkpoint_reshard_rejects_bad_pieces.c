/* Claim: loading by intersection (px_checkpoint_load_boxes) refuses a bad
 * checkpoint with one message naming the file or the tensor, and loads
 * nothing: a missing rank's file, saved pieces that overlap, pieces that
 * leave a hole, a file of pieces of a newer format version, a flipped byte.
 * And a good one loads a range that spans three saved files exactly.
 *
 * If it failed, a resharded resume could train on a model with holes or
 * doubled ranges, or on bytes that changed on disk, or half-load and leave
 * the run in a state no checkpoint describes. */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_test_util.h"
#include "px_test.h"

#include <string.h>
#include <unistd.h>

// Whole tensors a (3, 5) and b (7,): a[i] = i, b[i] = 100 + i.
static float A[15], B[7];
static char root[64];

// Writes step `step` as 3 files of pieces (a cut 6 | 6 | 3, b 4 | 3 | 0),
// as 3 ranks would: `shift` moves file 1's range of a back by one (an
// overlap with file 0, a hole after), `skip` leaves file `skip` out (a
// hole), `version` is the pieces version written.
static px_status write_step(int64_t step, int shift, int skip, const char *version) {
  static const size_t a_off[3] = {0, 6, 12}, a_cnt[3] = {6, 6, 3}, b_off[3] = {0, 4, 7}, b_cnt[3] = {4, 3, 0};
  px_tensor_piece p[3][2];
  px_state_dict sd[3];
  char *json[3] = {0}, name[3][64];
  px_kv meta[3][3];
  px_ckpt_item items[3];
  int n_items = 0;
  for (int r = 0; r < 3; r++) {
    int n = 0;
    size_t ao = a_off[r] - (r == 1 ? (size_t)shift : 0);
    p[r][n++] = (px_tensor_piece){.key = "a", .ndim = 2, .shape = {3, 5}, .offset = ao, .count = a_cnt[r],
                                  .data = A + ao};
    if (b_cnt[r])
      p[r][n++] = (px_tensor_piece){.key = "b", .ndim = 1, .shape = {7}, .offset = b_off[r], .count = b_cnt[r],
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
  px_status st = px_checkpoint_write_all(NULL, root, step, items, n_items, 0, path, sizeof path);
  for (int r = 0; r < 3; r++) {
    px_state_dict_free(&sd[r]);
    free(json[r]);
  }
  return st;
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

// A load of step's checkpoint fails, the message holds both strings, and
// nothing was written into the wanted pieces.
static void expect_refused(int64_t step, const char *what, const char *s1, const char *s2) {
  char ck[256];
  snprintf(ck, sizeof ck, "%s/step_%08lld", root, (long long)step);
  reset();
  px_status st = px_checkpoint_load_boxes(ck, "p.rank", want, 2);
  CHECK(st != PX_OK, "%s: loaded", what);
  const char *m = px_last_error();
  printf("%s: %s\n", what, m);
  CHECK(strstr(m, s1) && (!s2 || strstr(m, s2)), "%s: message lacks \"%s\"%s%s: %s", what, s1, s2 ? " or " : "",
        s2 ? s2 : "", m);
  CHECK(untouched(), "%s: the failed load changed the wanted pieces", what);
}

int main(void) {
  for (int i = 0; i < 15; i++) A[i] = (float)i;
  for (int i = 0; i < 7; i++) B[i] = 100.0f + (float)i;
  snprintf(root, sizeof root, "/tmp/px_reshard_bad_XXXXXX");
  CHECK(mkdtemp(root) != NULL, "mkdtemp");

  // Good: a [4, 13) from three files, b from two.
  CHECK_OK(write_step(1, 0, -1, PX_PIECES_VERSION));
  char ck[256];
  snprintf(ck, sizeof ck, "%s/step_00000001", root);
  reset();
  CHECK_OK(px_checkpoint_load_boxes(ck, "p.rank", want, 2));
  CHECK(memcmp(got_a, A + 4, sizeof got_a) == 0 && memcmp(got_b, B, sizeof got_b) == 0, "loaded values differ");

  // A rank's file missing (SHA256SUMS still lists it).
  CHECK_OK(write_step(2, 0, -1, PX_PIECES_VERSION));
  char victim[300];
  snprintf(victim, sizeof victim, "%s/step_00000002/p.rank00001-of-00003.safetensors", root);
  CHECK(unlink(victim) == 0, "unlink %s", victim);
  expect_refused(2, "a missing file", "p.rank00001-of-00003.safetensors", NULL);

  // Overlap: file 1's range of a starts one element early.
  CHECK_OK(write_step(3, 1, -1, PX_PIECES_VERSION));
  expect_refused(3, "overlapping pieces", "tensor \"a\"", "[5, 6) are in two saved pieces");

  // Hole: no file 1 at all (and nothing lists it).
  CHECK_OK(write_step(4, 0, 1, PX_PIECES_VERSION));
  expect_refused(4, "a hole", "tensor \"a\"", "[6, 12) are in no saved piece");

  // A newer format version.
  CHECK_OK(write_step(5, 0, -1, "99"));
  expect_refused(5, "a newer version", "p.rank00000-of-00003.safetensors", "pieces version 99");

  // A flipped byte in the last file.
  CHECK_OK(write_step(6, 0, -1, PX_PIECES_VERSION));
  snprintf(victim, sizeof victim, "%s/step_00000006/p.rank00002-of-00003.safetensors", root);
  CHECK(ckpt_flip_byte(victim, ckpt_file_size(victim) - 2), "flip a byte of %s", victim);
  expect_refused(6, "a flipped byte", "p.rank00002-of-00003.safetensors", "SHA-256");

  // Another whole shape for a: refused naming the tensor and both shapes.
  reset();
  want[0].shape[0] = 5;
  want[0].shape[1] = 3;
  CHECK(px_checkpoint_load_boxes(ck, "p.rank", want, 2) == PX_ERR_SHAPE, "a (5, 3) load took (3, 5) pieces");
  CHECK(strstr(px_last_error(), "\"a\"") && strstr(px_last_error(), "(3, 5)"), "message: %s", px_last_error());
  CHECK(untouched(), "a refused shape changed the wanted pieces");

  ckpt_rm_rf(root);
  return px_test_finish("test_checkpoint_reshard_rejects_bad_pieces");
}
