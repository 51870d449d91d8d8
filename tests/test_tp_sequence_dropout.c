/* Claim: dropout on a part of the sequence (px_dropout_part, for sequence
 * parallelism) keeps and drops exactly the elements the whole sequence's
 * dropout does at those positions (same uid, seed and step): with parts =
 * 2 and 4 and p = 0.3 on (N, T, C) = (3, 8, 5) (rows of 5, not a multiple
 * of the RNG's 4-word blocks), each part's output and input gradient equal
 * the whole's at its positions bit for bit, at two steps (masks differ
 * between them, so a step-blind mask fails); part 0 of 1 is px_dropout; a
 * part outside [0, parts) and a 1-d input are refused.
 * If this fails, the global element index of a local row is wrong (part
 * offset, row length or block boundary), or backward draws another mask. */
#include "px_test.h"

#include <string.h>

enum { N = 3, T = 8, C = 5 };

static void run_whole(px_model *m, const float *x, const float *dy, int64_t Tn, float *y, float *dx) {
  px_tensor xt = px_tensor_view((float *)x, PX_F32, 3, (int64_t[]){N, Tn, C}), yt, dxt;
  px_tensor dyt = px_tensor_view((float *)dy, PX_F32, 3, (int64_t[]){N, Tn, C});
  CHECK_OK(px_model_forward(m, &xt, &yt));
  memcpy(y, px_f32(&yt), sizeof(float) * (size_t)(N * Tn * C));
  CHECK_OK(px_model_backward(m, &dyt, &dxt));
  memcpy(dx, px_f32(&dxt), sizeof(float) * (size_t)(N * Tn * C));
}

int main(void) {
  float x[N * T * C], dy[N * T * C], yf[N * T * C], dxf[N * T * C];
  px_rng rng = px_rng_make(5, 0);
  for (int i = 0; i < N * T * C; i++) {
    x[i] = 1 + px_rng_uniform(&rng);
    dy[i] = 1 + px_rng_uniform(&rng);
  }
  for (uint64_t step = 0; step < 2; step++) {
    px_model *full;
    CHECK_OK(px_model_create(&full, px_dropout(0.3f), 42));
    px_model_train(full, true);
    for (uint64_t s = 0; s <= step; s++) run_whole(full, x, dy, T, yf, dxf);  // the last at model step `step`
    int zeros = 0;
    for (int i = 0; i < N * T * C; i++) zeros += yf[i] == 0.0f;
    CHECK(zeros > 0 && zeros < N * T * C, "step %llu: the whole dropped %d of %d", (unsigned long long)step, zeros,
          N * T * C);
    for (int parts = 1; parts <= 4; parts *= 2) {
      const int Tl = T / parts;
      int diff = 0;
      for (int part = 0; part < parts; part++) {
        px_model *pm;
        CHECK_OK(px_model_create(&pm, px_dropout_part(0.3f, part, parts), 42));
        px_model_train(pm, true);
        float xl[N * T * C], dyl[N * T * C], yl[N * T * C], dxl[N * T * C];
        for (int n = 0; n < N; n++) {
          memcpy(xl + (size_t)n * Tl * C, x + ((size_t)n * T + (size_t)part * Tl) * C, sizeof(float) * Tl * C);
          memcpy(dyl + (size_t)n * Tl * C, dy + ((size_t)n * T + (size_t)part * Tl) * C, sizeof(float) * Tl * C);
        }
        for (uint64_t s = 0; s <= step; s++) run_whole(pm, xl, dyl, Tl, yl, dxl);
        for (int n = 0; n < N; n++) {
          const size_t lo = (size_t)n * Tl * C, gl = ((size_t)n * T + (size_t)part * Tl) * C;
          diff += memcmp(yl + lo, yf + gl, sizeof(float) * Tl * C) != 0;
          diff += memcmp(dxl + lo, dxf + gl, sizeof(float) * Tl * C) != 0;
        }
        px_model_free(pm);
      }
      CHECK(diff == 0, "step %llu, parts %d: %d (sequence, part) outputs or gradients differ from the whole's",
            (unsigned long long)step, parts, diff);
      if (diff == 0)
        printf("  step %llu, parts %d: %d of %d dropped, every part's mask the whole's\n", (unsigned long long)step,
               parts, zeros, N * T * C);
    }
    px_model_free(full);
  }
  CHECK(px_dropout_part(0.3f, 4, 4) == NULL && strstr(px_last_error(), "part 4 of 4"), "part 4 of 4: \"%s\"",
        px_last_error());
  printf("  refused: %s\n", px_last_error());
  px_model *pm;
  CHECK_OK(px_model_create(&pm, px_dropout_part(0.3f, 0, 2), 1));
  px_model_train(pm, true);
  px_tensor x1 = px_tensor_view(x, PX_F32, 1, (int64_t[]){8}), y1;
  CHECK(px_model_forward(pm, &x1, &y1) == PX_ERR_SHAPE && strstr(px_last_error(), "split along T"), "1-d input: \"%s\"",
        px_last_error());
  printf("  refused: %s\n", px_last_error());
  px_model_free(pm);
  return px_test_finish("test_tp_sequence_dropout");
}
