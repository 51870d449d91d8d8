/* Claim: Linear and Tanh neighbours in a Chain (the MLP's layers), which run
 * fused on a CPU where plexus's packed GEMM runs (the Linear applies the
 * Tanh after it in its forward GEMM's output pass and the Tanh before it in
 * its backward one; the Tanh modules pass values through), compute the
 * same bits as the modules run apart: output, input gradient and every
 * parameter gradient, at 1 and 2 threads, with and without bias, with
 * inputs that drive tanh into saturation and into its small-x branch, and
 * with 64 rows (the row kernels, unfused) as well as 100.  And the fused
 * path really ran where it can.  If this fails, the fusion changed what an
 * MLP computes (tanh applied twice or not at all, 1 - y² from the wrong
 * tensor, a flag left set for a later pass).
 *
 * "Apart": the same modules with every Linear wrapped in a Chain of its
 * own, so that no Chain sees a Linear next to a Tanh. */
#include "plexus/plexus.h"
#include "nn/internal.h"
#include "px_test.h"
#include "tensor/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static px_module *alone(px_module *m, bool apart) { return apart ? px_chain_of(1, m) : m; }

// 7 -> 40 -> 33 -> 5 with Tanh between, and a Tanh at the end too.
static px_module *mlp(bool apart, bool bias) {
  return px_chain_of(6, alone(px_linear(7, 40, bias), apart), px_tanh(), alone(px_linear(40, 33, bias), apart),
                     px_tanh(), alone(px_linear(33, 5, bias), apart), px_tanh());
}

static void fill(float *v, size_t n, uint64_t seed, float lo, float hi) {
  px_rng r = px_rng_make(seed, 9);
  for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * px_rng_uniform(&r);
}

typedef struct run {
  float *y, *dx, *grad;
  size_t ny;
  bool fwd_fused, bwd_fused;
} run;

static void step(px_model *md, const px_tensor *x, const float *dyv, int threads, run *out) {
  px_set_num_threads(threads);
  px_model_train(md, true);
  px_model_zero_grad(md);
  px_tensor y, dx;
  CHECK_OK(px_model_forward(md, x, &y));
  out->fwd_fused = px_is_linear(md->root->children[2]) && px_linear_tanh_applied(md->root->children[2]);
  out->ny = (size_t)px_tensor_numel(&y);
  px_tensor dy = y;
  dy.data = (void *)dyv;
  CHECK_OK(px_model_backward(md, &dy, &dx));
  out->bwd_fused = px_is_linear(md->root->children[2]) && px_linear_dtanh_applied(md->root->children[2]);
  const size_t nx = (size_t)px_tensor_numel(x);
  out->y = malloc(out->ny * sizeof(float));
  out->dx = malloc(nx * sizeof(float));
  out->grad = malloc(md->n_param_elems * sizeof(float));
  memcpy(out->y, px_f32(&y), out->ny * sizeof(float));
  memcpy(out->dx, px_f32(&dx), nx * sizeof(float));
  memcpy(out->grad, md->grad_data, md->n_param_elems * sizeof(float));
}

static void check_model(int rows, bool bias, uint64_t seed) {
  px_model *fused, *apart;
  CHECK_OK(px_model_create(&fused, mlp(false, bias), 1));
  CHECK_OK(px_model_create(&apart, mlp(true, bias), 1));
  CHECK(fused->n_param_elems == apart->n_param_elems, "the two builds have the same parameters");
  fill(fused->param_data, fused->n_param_elems, seed, -1.5f, 1.5f);
  memcpy(apart->param_data, fused->param_data, fused->n_param_elems * sizeof(float));
  float *xv = malloc(sizeof(float) * (size_t)rows * 7), *dyv = malloc(sizeof(float) * (size_t)rows * 5);
  fill(xv, (size_t)rows * 7, seed + 1, -4.0f, 4.0f);  // large enough to saturate tanh (|x·W| > 7.9)
  for (int i = 0; i < 7; i++) xv[i] = 0.0f;           // row 0: tanh(b) only; without bias tanh(0), the small-x branch
  fill(dyv, (size_t)rows * 5, seed + 2, -1.0f, 1.0f);
  const px_tensor x = px_tensor_f32(xv, 2, rows, 7, 0, 0);
  const bool can_fuse = px_sgemm_packed_on() && (rows > PX_SGEMM_ROWS_MAX || !px_sgemm_rows_on());
  run ref = {0};
  for (int threads = 1; threads <= 2; threads++) {
    run a, b;
    step(fused, &x, dyv, threads, &a);
    step(apart, &x, dyv, threads, &b);
    CHECK(a.fwd_fused == can_fuse && a.bwd_fused == can_fuse, "%d rows, bias %d, %d threads: fused exactly where %s",
          rows, bias, threads, can_fuse ? "the packed GEMM runs" : "(not here)");
    CHECK(!b.fwd_fused && !b.bwd_fused, "%d rows: Linear in a chain of its own ran alone", rows);
    CHECK(memcmp(a.y, b.y, a.ny * sizeof(float)) == 0, "%d rows, bias %d, %d threads: output, same bits", rows, bias,
          threads);
    CHECK(memcmp(a.dx, b.dx, (size_t)rows * 7 * sizeof(float)) == 0, "%d rows, bias %d, %d threads: dx, same bits",
          rows, bias, threads);
    CHECK(memcmp(a.grad, b.grad, fused->n_param_elems * sizeof(float)) == 0,
          "%d rows, bias %d, %d threads: every parameter gradient, same bits", rows, bias, threads);
    bool saturated = false, nonzero = false;
    for (size_t i = 0; i < a.ny; i++) saturated = saturated || fabsf(a.y[i]) > 0.99999f;
    for (size_t i = 0; i < fused->n_param_elems && !nonzero; i++) nonzero = a.grad[i] != 0.0f;
    CHECK(nonzero, "%d rows: the gradients are not all zero", rows);
    CHECK(saturated, "%d rows: some outputs are where tanh saturates", rows);
    if (threads == 1) {
      ref = a;
    } else {
      CHECK(memcmp(a.y, ref.y, a.ny * sizeof(float)) == 0 && memcmp(a.grad, ref.grad, fused->n_param_elems * 4) == 0,
            "%d rows, bias %d: 1 and 2 threads, same bits", rows, bias);
      free(ref.y);
      free(ref.dx);
      free(ref.grad);
      free(a.y);
      free(a.dx);
      free(a.grad);
    }
    free(b.y);
    free(b.dx);
    free(b.grad);
  }
  free(xv);
  free(dyv);
  px_model_free(fused);
  px_model_free(apart);
}

int main(void) {
  const int threads0 = px_get_num_threads();
  check_model(100, true, 21);
  check_model(100, false, 31);
  check_model(64, true, 41);
  px_set_num_threads(threads0);
  printf("fused: %s\n", px_sgemm_packed_on() ? "yes (packed GEMM on)" : "no (no packed GEMM on this CPU)");
  return px_test_finish("test_linear_tanh_fused_in_chain_equals_separate_bitwise");
}
