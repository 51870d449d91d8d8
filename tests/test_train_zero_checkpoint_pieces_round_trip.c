/* Claim: a sharded checkpoint written by every rank (px_checkpoint_write_all,
 * threads backend, 3 ranks) is one complete checkpoint with one SHA256SUMS
 * listing every rank's file and, last, the index (metadata.json) that rank
 * 0 wrote; each rank's pieces of named tensors load back
 * exactly at the same layout (px_checkpoint_load_pieces) and are refused
 * with another layout; the whole tensors assemble in one process
 * (px_checkpoint_assemble) from uneven pieces (a rank with none of a
 * tensor, a tensor cut inside a row); a gap or an overlap between pieces is
 * an error naming the tensor and the elements; and a rank whose write fails
 * makes every rank fail with its message, leaving no checkpoint.
 *
 * If it failed, a ZeRO checkpoint could miss a rank's slice and still look
 * complete, load another rank's slice, or assemble a model with holes. */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_test_util.h"
#include "px_test.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

// The whole tensors: a (3, 5) and b (7,), a[i] = i, b[i] = 100 + i.
static float A[15], B[7];
static const int64_t SHAPE_A[2] = {3, 5}, SHAPE_B[1] = {7};
static char root[64];

// Rank r's pieces of a and b for a layout of 3 ranks: a cut in 3 uneven
// ranges (6, 6, 3 elements: the first cut inside row 1), b in (4, 3, 0):
// rank 2 has none of b.  `shift` moves rank 1's range of a by one element
// (an overlap with rank 0's, a gap after it).
static int pieces_of(int r, int shift, px_tensor_piece p[2], float *own) {
  static const size_t a_off[3] = {0, 6, 12}, a_cnt[3] = {6, 6, 3}, b_off[3] = {0, 4, 7}, b_cnt[3] = {4, 3, 0};
  int n = 0;
  size_t ao = a_off[r] - (r == 1 ? (size_t)shift : 0);
  p[n] = (px_tensor_piece){.key = "a", .ndim = 2, .shape = {3, 5}, .offset = ao, .count = a_cnt[r], .data = own};
  memcpy(own, A + ao, a_cnt[r] * sizeof(float));
  n++;
  if (b_cnt[r]) {
    p[n] =
      (px_tensor_piece){.key = "b", .ndim = 1, .shape = {7}, .offset = b_off[r], .count = b_cnt[r], .data = own + 8};
    memcpy(own + 8, B + b_off[r], b_cnt[r] * sizeof(float));
    n++;
  }
  return n;
}

static px_status write_step(px_comm *comm, int64_t step, int shift, const char *rank1_name) {
  const int r = px_comm_rank(comm);
  float own[16];
  px_tensor_piece p[2];
  int n = pieces_of(r, shift, p, own);
  px_state_dict sd;
  char *json;
  CHECK_OK(px_pieces_state_dict(p, n, &sd, &json));
  const px_kv meta[3] = {{"format", PX_PIECES_FORMAT}, {"version", PX_PIECES_VERSION}, {"pieces", json}};
  char name[64];
  if (r == 1 && rank1_name) snprintf(name, sizeof name, "%s", rank1_name);
  else snprintf(name, sizeof name, "t.rank%05d-of-00003.safetensors", r);
  const char *state = "{\"step\": 1}";
  px_ckpt_item items[2] = {{.name = name, .tensors = &sd, .metadata = meta, .n_metadata = 3},
                           {.name = "state.json", .bytes = state, .n_bytes = strlen(state)}};
  char path[256];
  px_status st = px_checkpoint_write_all(comm, root, step, items, r == 0 ? 2 : 1, 0, path, sizeof path);
  if (st == PX_OK) {
    char want[256];
    snprintf(want, sizeof want, "%s/step_%08lld", root, (long long)step);
    CHECK(strcmp(path, want) == 0, "rank %d: path %s, expected %s", r, path, want);
  }
  px_state_dict_free(&sd);
  free(json);
  return st;
}

static int rank_main(px_comm *comm, void *arg) {
  (void)arg;
  const int r = px_comm_rank(comm);
  char ck[256];
  snprintf(ck, sizeof ck, "%s/step_00000001", root);

  // 1. Every rank writes; one checkpoint, every file listed and verified.
  CHECK_OK(write_step(comm, 1, 0, NULL));
  CHECK_OK(px_comm_barrier(comm));
  if (r == 0) {
    CHECK_OK(px_checkpoint_verify(ck));
    void *sums;
    size_t n;
    char p[300];
    snprintf(p, sizeof p, "%s/SHA256SUMS", ck);
    FILE *f = fopen(p, "rb");
    char text[2048] = "";
    n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = '\0';
    sums = text;
    // Rank 0's files first (in its item order), then rank 1's, rank 2's.
    const char *a0 = strstr(sums, "t.rank00000-of-00003"), *st = strstr(sums, "state.json"),
               *a1 = strstr(sums, "t.rank00001-of-00003"), *a2 = strstr(sums, "t.rank00002-of-00003");
    CHECK(a0 && st && a1 && a2 && a0 < st && st < a1 && a1 < a2, "SHA256SUMS order:\n%s", text);
    // The index, written by rank 0 after every rank's files: listed last.
    const char *ix = strstr(sums, "metadata.json");
    CHECK(ix && a2 < ix && strchr(ix, '\n')[1] == '\0', "metadata.json is not the last line:\n%s", text);
  }

  // 2. Each rank loads its own pieces back, exactly.
  float own[16], back[16];
  px_tensor_piece p[2];
  int n = pieces_of(r, 0, p, own);
  memset(back, 0, sizeof back);
  p[0].data = back;
  if (n > 1) p[1].data = back + 8;
  char mine[64], other[64];
  snprintf(mine, sizeof mine, "t.rank%05d-of-00003.safetensors", r);
  CHECK_OK(px_checkpoint_load_pieces(ck, mine, p, n));
  CHECK(memcmp(back, own, p[0].count * sizeof(float)) == 0, "rank %d: piece of a differs", r);
  if (n > 1) CHECK(memcmp(back + 8, own + 8, p[1].count * sizeof(float)) == 0, "rank %d: piece of b differs", r);
  // Another rank's file is another layout: refused, naming the piece.
  snprintf(other, sizeof other, "t.rank%05d-of-00003.safetensors", (r + 1) % 3);
  px_status st = px_checkpoint_load_pieces(ck, other, p, n);
  CHECK(st != PX_OK, "rank %d loaded rank %d's pieces as its own", r, (r + 1) % 3);
  CHECK(strstr(px_last_error(), other) != NULL, "message lacks the file: %s", px_last_error());

  // 3. One process assembles the whole tensors from every rank's file.
  if (r == 0) {
    float a[15], b[7];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    px_named_tensor items[2] = {{.name = "a", .tensor = px_tensor_view(a, PX_F32, 2, SHAPE_A)},
                                {.name = "b", .tensor = px_tensor_view(b, PX_F32, 1, SHAPE_B)}};
    px_state_dict sd = {items, 2};
    CHECK_OK(px_checkpoint_assemble(ck, "t.rank", &sd, true));
    CHECK(memcmp(a, A, sizeof a) == 0 && memcmp(b, B, sizeof b) == 0, "assembled tensors differ");
    // A tensor the model lacks: an error when strict, ignored when not.
    px_state_dict only_a = {items, 1};
    CHECK(px_checkpoint_assemble(ck, "t.rank", &only_a, true) != PX_OK, "strict assemble took a foreign tensor");
    CHECK(strstr(px_last_error(), "\"b\"") != NULL, "message: %s", px_last_error());
    CHECK_OK(px_checkpoint_assemble(ck, "t.rank", &only_a, false));
    // Another shape: refused with both shapes.
    const int64_t wrong[2] = {5, 3};
    items[0].tensor = px_tensor_view(a, PX_F32, 2, wrong);
    CHECK(px_checkpoint_assemble(ck, "t.rank", &sd, true) == PX_ERR_SHAPE, "a (5, 3) model took (3, 5) pieces");
    CHECK(strstr(px_last_error(), "(3, 5)") && strstr(px_last_error(), "(5, 3)"), "message: %s", px_last_error());
    items[0].tensor = px_tensor_view(a, PX_F32, 2, SHAPE_A);
    CHECK(px_checkpoint_assemble(ck, "nothing", &sd, true) == PX_ERR_NOT_FOUND, "no files, yet no error");
  }
  CHECK_OK(px_comm_barrier(comm));

  // 4. Rank 1's range of a shifted by one: overlaps rank 0's at element 5,
  //    leaves element 11 in no piece.  Assembling says so.
  CHECK_OK(write_step(comm, 2, 1, NULL));
  CHECK_OK(px_comm_barrier(comm));
  if (r == 0) {
    float a[15], b[7];
    px_named_tensor items[2] = {{.name = "a", .tensor = px_tensor_view(a, PX_F32, 2, SHAPE_A)},
                                {.name = "b", .tensor = px_tensor_view(b, PX_F32, 1, SHAPE_B)}};
    px_state_dict sd = {items, 2};
    char ck2[256];
    snprintf(ck2, sizeof ck2, "%s/step_00000002", root);
    CHECK(px_checkpoint_assemble(ck2, "t.rank", &sd, true) == PX_ERR_FORMAT, "overlapping pieces assembled");
    CHECK(strstr(px_last_error(), "tensor \"a\"") && strstr(px_last_error(), "[5, 6) are in two saved pieces"),
          "message: %s", px_last_error());
  }
  CHECK_OK(px_comm_barrier(comm));

  // 5. Rank 1 cannot write (a name with '/'): every rank fails with rank
  //    1's message, and no step_00000003 nor a .partial directory is left.
  st = write_step(comm, 3, 0, "../escape.safetensors");
  CHECK(st == PX_ERR_INVALID, "rank %d: status %d, expected PX_ERR_INVALID", r, (int)st);
  CHECK(strstr(px_last_error(), "rank 1") && strstr(px_last_error(), "escape"), "rank %d: message: %s", r,
        px_last_error());
  CHECK_OK(px_comm_barrier(comm));
  if (r == 0) {
    char p3[256];
    snprintf(p3, sizeof p3, "%s/step_00000003", root);
    struct stat sb;
    CHECK(stat(p3, &sb) != 0, "a failed write left %s", p3);
    DIR *d = opendir(root);
    for (struct dirent *e; d && (e = readdir(d));)
      CHECK(strstr(e->d_name, ".partial") == NULL, "a failed write left %s", e->d_name);
    if (d) closedir(d);
  }
  return px_test_failures ? 1 : 0;
}

int main(void) {
  for (int i = 0; i < 15; i++) A[i] = (float)i;
  for (int i = 0; i < 7; i++) B[i] = 100.0f + (float)i;
  snprintf(root, sizeof root, "/tmp/px_zero_pieces_XXXXXX");
  CHECK(mkdtemp(root) != NULL, "mkdtemp");
  int code = 0;
  CHECK_OK(px_comm_run(3, rank_main, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  ckpt_rm_rf(root);
  return px_test_finish("test_train_zero_checkpoint_pieces_round_trip");
}
