/* Claim: a position embedding that knows its part of the sequence
 * (px_pos_embedding_part, for sequence parallelism) adds rows
 * [part·T, (part+1)·T) of the table: with parts = 2 and 4, each part's
 * output equals the whole sequence's output at its positions exactly, and
 * the parts' weight gradients, added, equal the whole one's exactly (each
 * part touches only its own rows); a sequence of parts·T beyond the context
 * and a part outside [0, parts) are refused with clear messages.
 * If this fails, the offset is not part·T, backward adds to rows 0.. instead
 * of the part's rows, or the context check ignores the other parts. */
#include "px_test.h"

#include <string.h>

enum { N = 3, T = 8, C = 5, CTX = 10 };

int main(void) {
  px_model *full;
  CHECK_OK(px_model_create(&full, px_pos_embedding(CTX, C), 7));
  float x[N * T * C], dy[N * T * C];
  px_rng rng = px_rng_make(11, 0);
  for (int i = 0; i < N * T * C; i++) {
    x[i] = 2 * px_rng_uniform(&rng) - 1;
    dy[i] = 2 * px_rng_uniform(&rng) - 1;
  }
  px_tensor xf = px_tensor_view(x, PX_F32, 3, (int64_t[]){N, T, C}), yf;
  px_tensor dyf = px_tensor_view(dy, PX_F32, 3, (int64_t[]){N, T, C});
  CHECK_OK(px_model_forward(full, &xf, &yf));
  px_model_zero_grad(full);
  CHECK_OK(px_model_backward(full, &dyf, NULL));
  const px_param *wf = full->params[0];
  for (int parts = 2; parts <= 4; parts *= 2) {
    const int Tl = T / parts;
    float gsum[CTX * C] = {0};
    int ydiff = 0;
    for (int part = 0; part < parts; part++) {
      px_model *pm;
      CHECK_OK(px_model_create(&pm, px_pos_embedding_part(CTX, C, part, parts), 99));
      memcpy(pm->params[0]->data, wf->data, sizeof(float) * CTX * C);
      float xl[N * T * C], dyl[N * T * C];
      for (int n = 0; n < N; n++) {
        memcpy(xl + (size_t)n * Tl * C, x + ((size_t)n * T + (size_t)part * Tl) * C, sizeof(float) * Tl * C);
        memcpy(dyl + (size_t)n * Tl * C, dy + ((size_t)n * T + (size_t)part * Tl) * C, sizeof(float) * Tl * C);
      }
      px_tensor xt = px_tensor_view(xl, PX_F32, 3, (int64_t[]){N, Tl, C}), yt;
      px_tensor dyt = px_tensor_view(dyl, PX_F32, 3, (int64_t[]){N, Tl, C});
      CHECK_OK(px_model_forward(pm, &xt, &yt));
      px_model_zero_grad(pm);
      CHECK_OK(px_model_backward(pm, &dyt, NULL));
      for (int n = 0; n < N; n++)
        ydiff += memcmp(px_f32(&yt) + (size_t)n * Tl * C, px_f32(&yf) + ((size_t)n * T + (size_t)part * Tl) * C,
                        sizeof(float) * Tl * C) != 0;
      for (int i = 0; i < CTX * C; i++) gsum[i] += pm->params[0]->grad[i];
      px_model_free(pm);
    }
    CHECK(ydiff == 0, "parts %d: %d (part, sequence) outputs differ from the whole sequence's", parts, ydiff);
    CHECK(memcmp(gsum, wf->grad, sizeof gsum) == 0,
          "parts %d: the parts' weight gradients do not add up to the "
          "whole one's",
          parts);
    if (ydiff == 0 && memcmp(gsum, wf->grad, sizeof gsum) == 0)
      printf("  parts %d: outputs and summed weight gradients equal the whole sequence's bit for bit\n", parts);
  }
  // T = 4 per part, 3 parts: 12 positions > 10.
  px_model *pm;
  CHECK_OK(px_model_create(&pm, px_pos_embedding_part(CTX, C, 1, 3), 1));
  px_tensor x4 = px_tensor_view(x, PX_F32, 3, (int64_t[]){N, 4, C}), y4;
  CHECK(px_model_forward(pm, &x4, &y4) == PX_ERR_SHAPE && strstr(px_last_error(), "sequence of 12"),
        "3 parts of 4 positions, context 10: \"%s\"", px_last_error());
  printf("  refused: %s\n", px_last_error());
  px_model_free(pm);
  CHECK(px_pos_embedding_part(CTX, C, 2, 2) == NULL && strstr(px_last_error(), "part 2 of 2"), "part 2 of 2: \"%s\"",
        px_last_error());
  printf("  refused: %s\n", px_last_error());
  px_model_free(full);
  return px_test_finish("test_tp_sequence_pos_embedding");
}
