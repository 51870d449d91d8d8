/* Claim: a BatchNorm followed by a ReLU in a Chain, which runs fused (the
 * normalising pass applies the ReLU, the ReLU passes values through, and
 * BatchNorm's backward masks dy with [y > 0]), computes the same bits as the
 * two modules run apart: output, input gradient, every parameter gradient
 * and the running statistics, in training and in eval, on (N, C, H, W) and
 * (N, C), at 1 and 2 threads, also where the BatchNorm's output is exactly
 * 0 (a constant channel in training, inputs equal to the running mean in
 * eval, β = 0), which the ReLU's mask must leave out.
 * And the fused path really ran.  If this fails, the fusion changed what a
 * CNN or ResNet computes (a mask taken from the wrong tensor, dy not masked
 * in one of the backward passes, the ReLU applied twice to dy).
 *
 * "Apart": the same modules with each BatchNorm wrapped in a Chain of its
 * own, so that no Chain sees a BatchNorm right before a ReLU. */
#include "plexus/plexus.h"
#include "nn/internal.h"
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

static px_module *bn_alone(px_module *bn, bool apart) { return apart ? px_chain_of(1, bn) : bn; }

// conv 3x3 (3 -> 8) - BN - ReLU - maxpool 2 - conv 3x3 (8 -> 6) - BN - ReLU - flatten - linear
static px_module *cnn(bool apart) {
  return px_chain_of(9, px_conv2d(3, 8, 3, 1, 1, true), bn_alone(px_batchnorm(8, 1e-5f, 0.1f), apart), px_relu(),
                     px_maxpool2d(2, 2), px_conv2d(8, 6, 3, 1, 1, true), bn_alone(px_batchnorm(6, 1e-5f, 0.1f), apart),
                     px_relu(), px_flatten(), px_linear(6 * 4 * 3, 4, true));
}

// linear (5 -> 7) - BN (N, C) - ReLU - linear (7 -> 3)
static px_module *mlp(bool apart) {
  return px_chain_of(4, px_linear(5, 7, true), bn_alone(px_batchnorm(7, 1e-5f, 0.1f), apart), px_relu(),
                     px_linear(7, 3, true));
}

// BN (N, C) - ReLU - linear (4 -> 3): the input goes straight into the
// BatchNorm, so the test can place exact zeros in its output.
static px_module *bn_first(bool apart) {
  return px_chain_of(3, bn_alone(px_batchnorm(4, 1e-5f, 0.1f), apart), px_relu(), px_linear(4, 3, true));
}

static void fill(float *v, size_t n, uint64_t seed, float lo, float hi) {
  px_rng r = px_rng_make(seed, 7);
  for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * px_rng_uniform(&r);
}

typedef struct run {
  float *y, *dx, *grad, *buf;
  size_t ny;
  bool fused;  // the first BatchNorm reported the ReLU applied
} run;

static px_module *first_bn(px_module *m) {
  if (px_is_batchnorm(m)) return m;
  for (int i = 0; i < m->n_children; i++) {
    px_module *b = first_bn(m->children[i]);
    if (b) return b;
  }
  return NULL;
}

static void step(px_model *md, const px_tensor *x, const float *dyv, bool train, int threads, run *out) {
  px_set_num_threads(threads);
  px_model_train(md, train);
  px_model_zero_grad(md);
  px_tensor y, dx;
  CHECK_OK(px_model_forward(md, x, &y));
  out->fused = px_batchnorm_relu_applied(first_bn(md->root));
  out->ny = (size_t)px_tensor_numel(&y);
  px_tensor dy = y;
  dy.data = (void *)dyv;
  CHECK_OK(px_model_backward(md, &dy, &dx));
  const size_t nx = (size_t)px_tensor_numel(x);
  out->y = malloc(out->ny * sizeof(float));
  out->dx = malloc(nx * sizeof(float));
  out->grad = malloc(md->n_param_elems * sizeof(float));
  out->buf = malloc((md->n_buffer_elems ? md->n_buffer_elems : 1) * sizeof(float));
  memcpy(out->y, px_f32(&y), out->ny * sizeof(float));
  memcpy(out->dx, px_f32(&dx), nx * sizeof(float));
  memcpy(out->grad, md->grad_data, md->n_param_elems * sizeof(float));
  memcpy(out->buf, md->buffer_data, md->n_buffer_elems * sizeof(float));
}

static void run_free(run *r) {
  free(r->y);
  free(r->dx);
  free(r->grad);
  free(r->buf);
}

// ties: bn_first's parameters and buffers set for exact zeros in the
// BatchNorm's output: β = 0, and running_mean[c] = x[0, c] (eval: row 0 gives
// x·α + (0 - x·α) = 0); channel 0 of x is constant (training: μ = x exactly).
static void check_model(const char *label, px_module *(*build)(bool), px_tensor x, uint64_t seed, bool ties) {
  px_model *fused, *apart;
  CHECK_OK(px_model_create(&fused, build(false), 1));
  CHECK_OK(px_model_create(&apart, build(true), 1));
  CHECK(fused->n_param_elems == apart->n_param_elems && fused->n_buffer_elems == apart->n_buffer_elems,
        "%s: the two builds have the same parameters", label);
  // Random weights (γ of either sign, β shifting part of each channel below
  // 0) and running statistics, the same in both.
  fill(fused->param_data, fused->n_param_elems, seed, -1.0f, 1.0f);
  memcpy(apart->param_data, fused->param_data, fused->n_param_elems * sizeof(float));
  fill(fused->buffer_data, fused->n_buffer_elems, seed + 1, 0.2f, 1.5f);  // running var > 0 (mean too)
  if (ties) {  // bn_first: params weight (4), bias (4), ...; buffers running_mean (4), running_var (4)
    for (int c = 0; c < 4; c++) fused->param_data[4 + c] = 0.0f;
    memcpy(apart->param_data, fused->param_data, fused->n_param_elems * sizeof(float));
    for (int c = 0; c < 4; c++) fused->buffer_data[c] = px_f32(&x)[c];
  }
  const size_t nx = (size_t)px_tensor_numel(&x);
  float *dyv;
  // The loss gradient, sized from a first forward.
  {
    px_tensor y;
    CHECK_OK(px_model_forward(fused, &x, &y));
    const size_t ny = (size_t)px_tensor_numel(&y);
    dyv = malloc(ny * sizeof(float));
    fill(dyv, ny, seed + 2, -1.0f, 1.0f);
  }
  fill(fused->buffer_data, fused->n_buffer_elems, seed + 1, 0.2f, 1.5f);
  if (ties)
    for (int c = 0; c < 4; c++) fused->buffer_data[c] = px_f32(&x)[c];
  for (int train = 1; train >= 0; train--)
    for (int threads = 1; threads <= 2; threads++) {
      const char *mode = train ? "train" : "eval";
      memcpy(apart->buffer_data, fused->buffer_data, fused->n_buffer_elems * sizeof(float));
      run a, b;
      step(fused, &x, dyv, train, threads, &a);
      step(apart, &x, dyv, train, threads, &b);
      CHECK(a.fused, "%s %s, %d threads: the chain ran BatchNorm and ReLU fused", label, mode, threads);
      CHECK(!b.fused, "%s %s, %d threads: the BatchNorm in a chain of its own ran alone", label, mode, threads);
      CHECK(memcmp(a.y, b.y, a.ny * sizeof(float)) == 0, "%s %s, %d threads: output, same bits", label, mode, threads);
      CHECK(memcmp(a.dx, b.dx, nx * sizeof(float)) == 0, "%s %s, %d threads: dx, same bits", label, mode, threads);
      CHECK(memcmp(a.grad, b.grad, fused->n_param_elems * sizeof(float)) == 0,
            "%s %s, %d threads: every parameter gradient, same bits", label, mode, threads);
      CHECK(memcmp(a.buf, b.buf, fused->n_buffer_elems * sizeof(float)) == 0,
            "%s %s, %d threads: running statistics, same bits", label, mode, threads);
      // Not vacuous: some gradient is non-zero and some output is masked.
      bool nonzero = false;
      for (size_t i = 0; i < fused->n_param_elems && !nonzero; i++) nonzero = a.grad[i] != 0.0f;
      CHECK(nonzero, "%s %s: the gradients are not all zero", label, mode);
      run_free(&a);
      run_free(&b);
    }
  free(dyv);
  px_model_free(fused);
  px_model_free(apart);
}

int main(void) {
  const int threads0 = px_get_num_threads();
  // 5 samples (not a multiple of the 4 rows the sums take at once), 9x7
  // planes (rows of 63: a vector tail).
  float x4[5 * 3 * 9 * 7];
  fill(x4, sizeof x4 / sizeof *x4, 11, -2.0f, 2.0f);
  check_model("conv-bn-relu (N, C, H, W)", cnn, px_tensor_f32(x4, 4, 5, 3, 9, 7), 21, false);
  float x2[6 * 5];
  fill(x2, sizeof x2 / sizeof *x2, 12, -2.0f, 2.0f);
  check_model("linear-bn-relu (N, C)", mlp, px_tensor_f32(x2, 2, 6, 5, 0, 0), 31, false);
  float x3[7 * 4];
  fill(x3, sizeof x3 / sizeof *x3, 13, -2.0f, 2.0f);
  for (int i = 0; i < 7; i++) x3[i * 4] = 0.375f;  // channel 0 constant
  check_model("bn-relu (N, C) with outputs of exactly 0", bn_first, px_tensor_f32(x3, 2, 7, 4, 0, 0), 41, true);
  px_set_num_threads(threads0);
  return px_test_finish("test_batchnorm_relu_fused_in_chain_equals_separate_bitwise");
}
