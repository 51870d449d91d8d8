/* Claim: pieces format version 2 describes a tensor split into boxes along
 * any dimension (a tensor-parallel weight cut along dim 1 into q|k|v-like
 * column blocks, or along dim 0 into row blocks), each box further cut into
 * ZeRO flat ranges of the box; and px_checkpoint_load_boxes loads a
 * checkpoint written in any such layout into any other and into the whole
 * tensors (px_checkpoint_assemble), bitwise.
 *
 * Layouts: split dimension 0, 1 or 2 (the last) × 1, 2 or 3 tensor-parallel
 * parts × 1, 2 or 3 flat (ZeRO) parts of each box = 27, every one saved and
 * loaded into each of the 27 and into whole tensors.  Sizes divide by
 * neither 2 nor 3 ((5, 7), (3, 4, 5)), a tensor has fewer elements than
 * parts ((2,): a part holds none of it), and a 1-D tensor cut along "dim 1"
 * is cut along its only dimension.  A version-1 file (no boxes, as plexus
 * wrote before version 2) loads into box pieces too (the migration path).
 *
 * Every layout is saved twice: with the index (px_checkpoint_write_all,
 * metadata.json: loads open only the files and read only the pieces they
 * need) and without (loads read every file whole).
 *
 * If it failed, a tensor-parallel checkpoint could load only into the split
 * that wrote it, or load rows and columns transposed, shifted or doubled. */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_test_util.h"
#include "px_test.h"

#include <string.h>

enum { N_T = 3, MAX_EL = 60, MAX_FILES = 9 };
static const char *const KEYS[N_T] = {"h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "t3"};
static const int NDIM[N_T] = {2, 1, 3};
static const int64_t SHAPE[N_T][3] = {{5, 7, 0}, {2, 0, 0}, {3, 4, 5}};
static float WHOLE[N_T][MAX_EL];
static char root[64];

typedef struct layout {
  int dim, tp, zero;  // split dimension, tensor-parallel parts, flat parts per box
} layout;

static size_t numel(int t) {
  size_t n = 1;
  for (int d = 0; d < NDIM[t]; d++) n *= (size_t)SHAPE[t][d];
  return n;
}

// The piece of tensor t that file f (tp part f / zero, flat part f % zero)
// holds under layout l; data points into own, filled from WHOLE when fill.
static void piece_of(const layout *l, int f, int t, px_tensor_piece *p, float *own, bool fill) {
  const int tp = f / l->zero, z = f % l->zero;
  memset(p, 0, sizeof *p);
  snprintf(p->key, sizeof p->key, "%s", KEYS[t]);
  p->ndim = NDIM[t];
  const int d = l->dim < NDIM[t] ? l->dim : NDIM[t] - 1;
  for (int k = 0; k < NDIM[t]; k++) {
    p->shape[k] = SHAPE[t][k];
    p->box_offset[k] = 0;
    p->box_size[k] = SHAPE[t][k];
  }
  const int64_t n = SHAPE[t][d];
  p->box_offset[d] = tp * n / l->tp;
  p->box_size[d] = (tp + 1) * n / l->tp - p->box_offset[d];
  size_t m = 1;
  for (int k = 0; k < NDIM[t]; k++) m *= (size_t)p->box_size[k];
  p->offset = (size_t)z * m / (size_t)l->zero;
  p->count = (size_t)(z + 1) * m / (size_t)l->zero - p->offset;
  // A part with none of a 1-D tensor has box_size {0}, which reads as the
  // whole tensor: harmless, since its count is 0.
  p->data = own;
  if (!fill) return;
  for (size_t i = 0; i < p->count; i++) {
    size_t flat = p->offset + i, g = 0;
    // box coordinates -> global flat index
    size_t rem = flat, idx[3], stride = 1;
    for (int k = NDIM[t] - 1; k >= 0; k--) {
      idx[k] = rem % (size_t)p->box_size[k];
      rem /= (size_t)p->box_size[k];
    }
    for (int k = NDIM[t] - 1; k >= 0; k--) {
      g += (idx[k] + (size_t)p->box_offset[k]) * stride;
      stride *= (size_t)SHAPE[t][k];
    }
    own[i] = WHOLE[t][g];
  }
}

static int n_files(const layout *l) { return l->tp * l->zero; }

// Writes layout l as checkpoint `step`: one file of pieces per part, with
// the index (px_checkpoint_write_all: loads read only the pieces they
// need) or without (px_checkpoint_write, as version-1 checkpoints were:
// loads read every file whole).
static void save(const layout *l, int64_t step, const char *version, bool indexed) {
  static float own[MAX_FILES][N_T][MAX_EL];
  px_tensor_piece p[MAX_FILES][N_T];
  px_state_dict sd[MAX_FILES];
  char *json[MAX_FILES], name[MAX_FILES][64];
  px_kv meta[MAX_FILES][3];
  px_ckpt_item items[MAX_FILES];
  memset(items, 0, sizeof items);
  const int nf = n_files(l);
  for (int f = 0; f < nf; f++) {
    for (int t = 0; t < N_T; t++) piece_of(l, f, t, &p[f][t], own[f][t], true);
    CHECK_OK(px_pieces_state_dict(p[f], N_T, &sd[f], &json[f]));
    snprintf(name[f], sizeof name[f], "model.rank%05d-of-%05d.safetensors", f, nf);
    meta[f][0] = (px_kv){"format", PX_PIECES_FORMAT};
    meta[f][1] = (px_kv){"version", version};
    meta[f][2] = (px_kv){"pieces", json[f]};
    items[f] = (px_ckpt_item){.name = name[f], .tensors = &sd[f], .metadata = meta[f], .n_metadata = 3};
  }
  char path[256];
  if (indexed) CHECK_OK(px_checkpoint_write_all(NULL, root, step, items, nf, 0, path, sizeof path));
  else CHECK_OK(px_checkpoint_write(root, step, items, nf, 0, path, sizeof path));
  char index[300];
  snprintf(index, sizeof index,
           "%s/"
           "metadata.json",
           path);
  CHECK((access(index, F_OK) == 0) == indexed, "%s: index %s", path, indexed ? "missing" : "present");
  for (int f = 0; f < nf; f++) {
    px_state_dict_free(&sd[f]);
    free(json[f]);
  }
}

// Loads checkpoint `step` into layout l, file by file as its ranks would,
// and checks every element against WHOLE.
static void load_into(int64_t step, const layout *from, const layout *l) {
  char ck[256];
  snprintf(ck, sizeof ck, "%s/step_%08lld", root, (long long)step);
  for (int f = 0; f < n_files(l); f++) {
    static float got[N_T][MAX_EL], ref[N_T][MAX_EL];
    px_tensor_piece want[N_T], expect[N_T];
    for (int t = 0; t < N_T; t++) {
      piece_of(l, f, t, &expect[t], ref[t], true);
      piece_of(l, f, t, &want[t], got[t], false);
      for (int i = 0; i < MAX_EL; i++) got[t][i] = -1.0f;
    }
    px_status st = px_checkpoint_load_boxes(ck, "model", want, N_T);
    CHECK(st == PX_OK, "saved dim %d tp %d zero %d, loaded as dim %d tp %d zero %d part %d: %s", from->dim, from->tp,
          from->zero, l->dim, l->tp, l->zero, f, px_last_error());
    for (int t = 0; st == PX_OK && t < N_T; t++)
      CHECK(memcmp(got[t], ref[t], want[t].count * sizeof(float)) == 0,
            "saved dim %d tp %d zero %d, loaded as dim %d tp %d zero %d part %d: %s differs", from->dim, from->tp,
            from->zero, l->dim, l->tp, l->zero, f, KEYS[t]);
  }
}

static void assemble_whole(int64_t step, const layout *from) {
  char ck[256];
  snprintf(ck, sizeof ck, "%s/step_%08lld", root, (long long)step);
  static float got[N_T][MAX_EL];
  px_named_tensor items[N_T];
  for (int t = 0; t < N_T; t++) {
    memset(&items[t], 0, sizeof items[t]);
    snprintf(items[t].name, sizeof items[t].name, "%s", KEYS[t]);
    items[t].tensor = px_tensor_view(got[t], PX_F32, NDIM[t], SHAPE[t]);
    for (int i = 0; i < MAX_EL; i++) got[t][i] = -1.0f;
  }
  px_state_dict sd = {items, N_T};
  px_status st = px_checkpoint_assemble(ck, "model.rank", &sd, true);
  CHECK(st == PX_OK, "saved dim %d tp %d zero %d, assembled whole: %s", from->dim, from->tp, from->zero,
        px_last_error());
  for (int t = 0; st == PX_OK && t < N_T; t++)
    CHECK(memcmp(got[t], WHOLE[t], numel(t) * sizeof(float)) == 0, "saved dim %d tp %d zero %d: whole %s differs",
          from->dim, from->tp, from->zero, KEYS[t]);
}

int main(void) {
  for (int t = 0; t < N_T; t++)
    for (size_t i = 0; i < numel(t); i++) WHOLE[t][i] = (float)(1000 * (t + 1)) + (float)i;
  snprintf(root, sizeof root, "/tmp/px_boxes_XXXXXX");
  CHECK(mkdtemp(root) != NULL, "mkdtemp");

  layout all[27];
  int n = 0;
  for (int dim = 0; dim < 3; dim++)
    for (int tp = 1; tp <= 3; tp++)
      for (int zero = 1; zero <= 3; zero++) all[n++] = (layout){dim, tp, zero};

  // The split is described as boxes: a dim-1 cut of the (5, 7) weight in 3
  // is the column blocks [0:5, 0:2], [0:5, 2:4], [0:5, 4:7].
  {
    px_tensor_piece p;
    float own[MAX_EL];
    const layout cols = {1, 3, 1};
    piece_of(&cols, 2, 0, &p, own, true);
    CHECK(p.box_offset[0] == 0 && p.box_size[0] == 5 && p.box_offset[1] == 4 && p.box_size[1] == 3 && p.offset == 0 &&
            p.count == 15 && own[0] == WHOLE[0][4] && own[3] == WHOLE[0][7 + 4],
          "the third column block is not [0:5, 4:7]");
    px_state_dict sd;
    char *json;
    CHECK_OK(px_pieces_state_dict(&p, 1, &sd, &json));
    CHECK(strcmp(sd.items[0].name, "h.0.attn.c_attn.weight[0:5, 4:7]@0") == 0, "piece name %s", sd.items[0].name);
    CHECK(strstr(json, "\"box_offset\":[0,4]") && strstr(json, "\"box_size\":[5,3]"), "pieces JSON: %s", json);
    px_state_dict_free(&sd);
    free(json);
  }

  int loads = 0;
  for (int a = 0; a < n; a++)
    for (int indexed = 0; indexed < 2; indexed++) {
      const int64_t step = 1 + a + 100 * indexed;
      save(&all[a], step, PX_PIECES_VERSION, indexed);
      for (int b = 0; b < n; b++, loads++) load_into(step, &all[a], &all[b]);
      assemble_whole(step, &all[a]);
    }

  // Migration: a version-1 checkpoint (flat ranges of whole tensors, the
  // JSON px_pieces_state_dict writes for whole boxes, "version": "1") loads
  // into column blocks, row blocks and whole tensors.
  const layout v1 = {0, 1, 3};
  save(&v1, 1000, "1", false);
  for (int b = 0; b < n; b++, loads++) load_into(1000, &v1, &all[b]);
  assemble_whole(1000, &v1);
  // ... and a version-1 file that claims a box is refused: boxes are v2.
  {
    const layout cols = {1, 2, 1};
    save(&cols, 1001, "1", false);
    char ck[256];
    snprintf(ck, sizeof ck, "%s/step_00001001", root);
    float got[MAX_EL];
    px_tensor_piece want;
    piece_of(&cols, 0, 0, &want, got, false);
    CHECK(px_checkpoint_load_boxes(ck, "model", &want, 1) == PX_ERR_FORMAT, "a box in a version-1 file loaded");
    CHECK(strstr(px_last_error(), "version-1") && strstr(px_last_error(), "model.rank00000-of-00002.safetensors"),
          "message: %s", px_last_error());
  }
  printf("%d layouts (split dim 0/1/2 x tp 1-3 x flat 1-3), with and without the index: %d loads bitwise, and "
         "whole; version 1 loads\n",
         n, loads);
  ckpt_rm_rf(root);
  return px_test_finish("test_checkpoint_boxes_reshard_between_any_splits");
}
