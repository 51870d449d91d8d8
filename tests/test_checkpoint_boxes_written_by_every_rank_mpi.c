/* Claim: under MPI with 1, 2 and 4 processes (ctest runs _np1, _np2, _np4),
 * every rank writes its tensor-parallel boxes into one checkpoint
 * (px_checkpoint_write_all): rank r holds the column block r of world of a
 * (5, 7) weight, the part r of a (2,) bias (empty on ranks >= 2) and the
 * block r along dim 1 of a (3, 4, 5) tensor, each box cut into two flat
 * (ZeRO) pieces held by the same rank.  Rank 0 gathers every rank's piece
 * list and writes the index, listed last in SHA256SUMS; the checkpoint
 * verifies; and every rank loads its row block (another split, along dim
 * 0) and the whole tensors back, bitwise, through the index.
 *
 * If it failed, a tensor-parallel job's checkpoint could lack a rank's
 * pieces in the index, or load into another split shifted or transposed. */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_test_util.h"
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

enum { N_T = 3, MAX_EL = 60 };
static const char *const KEYS[N_T] = {"attn.c_attn.weight", "attn.c_attn.bias", "t3"};
static const int NDIM[N_T] = {2, 1, 3};
static const int64_t SHAPE[N_T][3] = {{5, 7, 0}, {2, 0, 0}, {3, 4, 5}};

static float value(int t, size_t i) { return (float)(1000 * (t + 1)) + (float)i * 0.5f; }

// Part r of `parts` of tensor t along dim d (the last one if t has fewer),
// flat piece z of 2 of that box, filled from the whole tensor when fill.
static void piece(int t, int d, int r, int parts, int z, int zparts, px_tensor_piece *p, float *own, bool fill) {
  memset(p, 0, sizeof *p);
  snprintf(p->key, sizeof p->key, "%s", KEYS[t]);
  p->ndim = NDIM[t];
  if (d >= NDIM[t]) d = NDIM[t] - 1;
  for (int k = 0; k < NDIM[t]; k++) {
    p->shape[k] = SHAPE[t][k];
    p->box_size[k] = SHAPE[t][k];
  }
  p->box_offset[d] = r * SHAPE[t][d] / parts;
  p->box_size[d] = (r + 1) * SHAPE[t][d] / parts - p->box_offset[d];
  size_t m = 1;
  for (int k = 0; k < NDIM[t]; k++) m *= (size_t)p->box_size[k];
  p->offset = (size_t)z * m / (size_t)zparts;
  p->count = (size_t)(z + 1) * m / (size_t)zparts - p->offset;
  p->data = own;
  for (size_t i = 0; fill && i < p->count; i++) {
    size_t rem = p->offset + i, g = 0, stride = 1, idx[3];
    for (int k = NDIM[t] - 1; k >= 0; k--) {
      idx[k] = rem % (size_t)p->box_size[k];
      rem /= (size_t)p->box_size[k];
    }
    for (int k = NDIM[t] - 1; k >= 0; k--) {
      g += (idx[k] + (size_t)p->box_offset[k]) * stride;
      stride *= (size_t)SHAPE[t][k];
    }
    own[i] = value(t, g);
  }
}

static int rank_main(px_comm *comm, void *arg) {
  (void)arg;
  const int r = px_comm_rank(comm), world = px_comm_size(comm);
  char root[64] = "";
  if (r == 0) {
    snprintf(root, sizeof root, "/tmp/px_boxes_mpi_XXXXXX");
    CHECK(mkdtemp(root) != NULL, "mkdtemp");
  }
  CHECK_OK(px_comm_broadcast(comm, root, sizeof root, PX_U8, 0));

  // This rank's column blocks, two flat pieces each.
  static float own[2 * N_T][MAX_EL];
  px_tensor_piece mine[2 * N_T];
  for (int t = 0; t < N_T; t++)
    for (int z = 0; z < 2; z++) piece(t, 1, r, world, z, 2, &mine[2 * t + z], own[2 * t + z], true);
  px_state_dict sd;
  char *json, name[64];
  CHECK_OK(px_pieces_state_dict(mine, 2 * N_T, &sd, &json));
  snprintf(name, sizeof name, "model.rank%05d-of-%05d.safetensors", r, world);
  const px_kv meta[3] = {{"format", PX_PIECES_FORMAT}, {"version", PX_PIECES_VERSION}, {"pieces", json}};
  const char *state = "{\"step\": 1}";
  px_ckpt_item items[2] = {{.name = name, .tensors = &sd, .metadata = meta, .n_metadata = 3},
                           {.name = "state.json", .bytes = state, .n_bytes = strlen(state)}};
  char ck[256];
  CHECK_OK(px_checkpoint_write_all(comm, root, 1, items, r == 0 ? 2 : 1, 0, ck, sizeof ck));
  px_state_dict_free(&sd);
  free(json);

  if (r == 0) {
    CHECK_OK(px_checkpoint_verify(ck));
    char p[300];
    snprintf(p, sizeof p, "%s/SHA256SUMS", ck);
    char *sums = ckpt_read_text(p);
    const char *ix = sums ? strstr(sums, "  metadata.json\n") : NULL;
    CHECK(ix && ix[strlen("  metadata.json\n")] == '\0', "metadata.json is not SHA256SUMS's last line:\n%s",
          sums ? sums : "");
    free(sums);
    snprintf(p, sizeof p, "%s/metadata.json", ck);
    char *index = ckpt_read_text(p);
    for (int k = 0; index && k < world; k++) {
      char f[64];
      snprintf(f, sizeof f, "\"model.rank%05d-of-%05d.safetensors\"", k, world);
      CHECK(strstr(index, f) != NULL, "the index does not list %s", f);
    }
    free(index);
  }

  // Every rank: its row block (dim 0 of world parts, one flat piece), then
  // the whole tensors.
  for (int whole = 0; whole < 2; whole++) {
    static float got[N_T][MAX_EL], ref[N_T][MAX_EL];
    px_tensor_piece want[N_T], expect[N_T];
    for (int t = 0; t < N_T; t++) {
      piece(t, 0, whole ? 0 : r, whole ? 1 : world, 0, 1, &expect[t], ref[t], true);
      want[t] = expect[t];
      want[t].data = got[t];
      for (int i = 0; i < MAX_EL; i++) got[t][i] = -1.0f;
    }
    px_status st = px_checkpoint_load_boxes(ck, "model", want, N_T);
    CHECK(st == PX_OK, "rank %d of %d, %s: %s", r, world, whole ? "whole" : "row block", px_last_error());
    for (int t = 0; st == PX_OK && t < N_T; t++)
      CHECK(memcmp(got[t], ref[t], want[t].count * sizeof(float)) == 0, "rank %d of %d, %s: %s differs", r, world,
            whole ? "whole" : "row block", KEYS[t]);
  }
  CHECK_OK(px_comm_barrier(comm));
  if (r == 0) ckpt_rm_rf(root);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, rank_main, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_checkpoint_boxes_written_by_every_rank_mpi");
}
