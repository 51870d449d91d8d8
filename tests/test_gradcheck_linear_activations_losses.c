/* Claim: Linear (also on the few-row kernels' shapes), ReLU, Tanh, Sigmoid,
 * GELU (exact and tanh) and the two losses compute gradients that agree
 * with central finite differences.
 * If this fails, backward of that layer is wrong and training with it
 * follows a wrong direction. */
#include "gradcheck.h"

static void check_pointwise(const char *label, px_module *m, bool away_from_zero) {
  float x[2 * 3 * 5];
  gc_fill_uniform(x, 30, 3, -2.0f, 2.0f);
  if (away_from_zero)  // ReLU has a kink at 0: keep probes off it.
    for (int i = 0; i < 30; i++) x[i] += x[i] >= 0 ? 0.1f : -0.1f;
  px_tensor t = px_tensor_f32(x, 3, 2, 3, 5, 0);
  gradcheck(label, m, &t, (gc_opts){0});
}

static void check_losses(void) {
  // MSE: compare dpred with differences of the loss itself.
  float p[12], t[12], d[12];
  gc_fill_uniform(p, 12, 1, -1, 1);
  gc_fill_uniform(t, 12, 2, -1, 1);
  px_tensor P = px_tensor_f32(p, 2, 3, 4, 0, 0), T = px_tensor_f32(t, 2, 3, 4, 0, 0);
  float L, Lp, Lm;
  CHECK_OK(px_mse_loss(&P, &T, &L, d));
  for (int i = 0; i < 12; i++) {
    float keep = p[i];
    p[i] = keep + 1e-2f;
    CHECK_OK(px_mse_loss(&P, &T, &Lp, NULL));
    p[i] = keep - 1e-2f;
    CHECK_OK(px_mse_loss(&P, &T, &Lm, NULL));
    p[i] = keep;
    CHECK_CLOSE(d[i], (Lp - Lm) / 2e-2f, 2e-2);
  }
  // Cross-entropy with ignore_index and label smoothing.
  float z[5 * 7], dz[5 * 7];
  int32_t y[5] = {3, -100, 0, 6, 2};
  gc_fill_uniform(z, 35, 4, -3, 3);
  px_tensor Z = px_tensor_f32(z, 2, 5, 7, 0, 0);
  for (int smooth = 0; smooth < 2; smooth++) {
    px_ce_opts o = PX_CE_DEFAULTS;
    o.label_smoothing = smooth ? 0.1f : 0.0f;
    CHECK_OK(px_cross_entropy_loss(&Z, y, &o, &L, dz));
    for (int i = 0; i < 35; i++) {
      float keep = z[i];
      z[i] = keep + 1e-2f;
      CHECK_OK(px_cross_entropy_loss(&Z, y, &o, &Lp, NULL));
      z[i] = keep - 1e-2f;
      CHECK_OK(px_cross_entropy_loss(&Z, y, &o, &Lm, NULL));
      z[i] = keep;
      CHECK(fabs(dz[i] - (Lp - Lm) / 2e-2f) < 2e-3, "ce smooth=%d dz[%d] %g vs %g", smooth, i, (double)dz[i],
            (double)((Lp - Lm) / 2e-2f));
    }
    CHECK(dz[7] == 0.0f && dz[13] == 0.0f, "ignored row has zero gradient");
  }
  // A known value: uniform logits give log(C).
  float u[4] = {0, 0, 0, 0};
  int32_t t1[1] = {2};
  px_tensor U = px_tensor_f32(u, 2, 1, 4, 0, 0);
  CHECK_OK(px_cross_entropy_loss(&U, t1, NULL, &L, NULL));
  CHECK_CLOSE(L, log(4.0), 1e-6);
  int32_t bad[1] = {9};
  CHECK(px_cross_entropy_loss(&U, bad, NULL, &L, NULL) == PX_ERR_INVALID, "out-of-range target rejected");
}

int main(void) {
  for (int bias = 0; bias < 2; bias++) {
    float x[4 * 2 * 6];
    gc_fill_uniform(x, 48, 11, -1, 1);
    px_tensor t = px_tensor_f32(x, 3, 4, 2, 6, 0);  // leading dims fold into rows
    gradcheck(bias ? "linear+bias" : "linear", px_linear(6, 5, bias), &t, (gc_opts){0});
    // 16 → 32 over 3 rows: the shape the few-row kernels take on an AVX-512
    // CPU (px_sgemm_rows: K a multiple of 16 forward, N backward), a row
    // count off their blocks.
    float x16[3 * 16];
    gc_fill_uniform(x16, 48, 12, -1, 1);
    px_tensor t16 = px_tensor_f32(x16, 2, 3, 16, 0, 0);
    gradcheck(bias ? "linear 16->32 +bias" : "linear 16->32", px_linear(16, 32, bias), &t16, (gc_opts){0});
  }
  check_pointwise("relu", px_relu(), true);
  check_pointwise("tanh", px_tanh(), false);
  check_pointwise("sigmoid", px_sigmoid(), false);
  check_pointwise("gelu", px_gelu(false), false);
  check_pointwise("gelu_tanh", px_gelu(true), false);
  // A chain with a residual: containers route gradients correctly.
  float x[3 * 4];
  gc_fill_uniform(x, 12, 5, -1, 1);
  px_tensor t = px_tensor_f32(x, 2, 3, 4, 0, 0);
  gradcheck("chain+residual",
            px_chain_of(3, px_linear(4, 4, true), px_residual(px_chain_of(2, px_tanh(), px_linear(4, 4, true))),
                        px_linear(4, 2, false)),
            &t, (gc_opts){0});
  // Linear-Tanh-Linear-Tanh over 80 rows: more than the few-row kernels
  // take, so on an AVX-512 CPU the packed GEMM runs with the Tanh fused into
  // the Linear's forward and the Tanh's backward into the next one's dx.
  float x80[80 * 3];
  gc_fill_uniform(x80, 240, 6, -2, 2);
  px_tensor t80 = px_tensor_f32(x80, 2, 80, 3, 0, 0);
  gradcheck("linear-tanh fused, 80 rows",
            px_chain_of(4, px_linear(3, 20, true), px_tanh(), px_linear(20, 17, true), px_tanh()), &t80, (gc_opts){0});
  check_losses();
  return px_test_finish("test_gradcheck_linear_activations_losses");
}
