/* Claim: a Residual followed by a ReLU in a Chain (ResNet's block output),
 * which runs fused (the Residual's add applies the ReLU; the ReLU passes
 * its input through and keeps it for its backward's mask), computes the
 * same bits as the two modules run apart: output, input gradient and every
 * parameter gradient, in training and in eval, at 1 and 2 threads, with the
 * identity shortcut and with a projection (conv 1×1 + BatchNorm, as
 * torchvision's downsample), also where the sum is exactly 0 (the inner
 * branch gives -x on some features), which the ReLU's mask must leave out.
 * And the fused path really ran.  If this fails, the fusion changed what a
 * ResNet computes (a mask from the wrong tensor, the ReLU applied twice, a
 * flag left set for a later forward).
 *
 * "Apart": the same modules with the Residual wrapped in a Chain of its own,
 * so that no Chain sees a Residual right before a ReLU. */
#include "plexus/plexus.h"
#include "nn/internal.h"
#include "px_test.h"

#include <stdlib.h>
#include <string.h>

static px_module *alone(px_module *m, bool apart) { return apart ? px_chain_of(1, m) : m; }

// ResNet's basic block: [conv3x3-bn-relu-conv3x3-bn] + shortcut, relu, then
// a global pool and a linear head.  proj: the shortcut is conv1x1-bn.
static px_module *block(bool apart, bool proj) {
  const int o = proj ? 6 : 4; /* the identity keeps the 4 channels */
  px_module *inner = px_chain_of(5, px_conv2d(4, o, 3, 1, 1, false), px_batchnorm(o, 1e-5f, 0.1f), px_relu(),
                                 px_conv2d(o, o, 3, 1, 1, false), px_batchnorm(o, 1e-5f, 0.1f));
  px_module *res = proj
    ? px_residual_shortcut(inner, px_chain_of(2, px_conv2d(4, o, 1, 1, 0, false), px_batchnorm(o, 1e-5f, 0.1f)),
                           "downsample")
    : px_residual(inner);
  return px_chain_of(4, alone(res, apart), px_relu(), px_global_avgpool2d(), px_linear(o, 3, true));
}
static px_module *block_identity(bool apart) { return block(apart, false); }
static px_module *block_projection(bool apart) { return block(apart, true); }

// linear (5 -> 5) + x, relu, linear (5 -> 2): the test sets rows 0 and 1 of
// the inner linear to -I (bias 0), so features 0 and 1 sum to exactly 0.
static px_module *ties(bool apart) {
  return px_chain_of(3, alone(px_residual(px_linear(5, 5, true)), apart), px_relu(), px_linear(5, 2, true));
}

static void fill(float *v, size_t n, uint64_t seed, float lo, float hi) {
  px_rng r = px_rng_make(seed, 9);
  for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * px_rng_uniform(&r);
}

static px_module *first_residual(px_module *m) {
  if (px_is_residual(m)) return m;
  for (int i = 0; i < m->n_children; i++) {
    px_module *r = first_residual(m->children[i]);
    if (r) return r;
  }
  return NULL;
}

typedef struct run {
  float *y, *dx, *grad;
  size_t ny;
  bool fused;
} run;

static void step(px_model *md, const px_tensor *x, const float *dyv, bool train, int threads, run *out) {
  px_set_num_threads(threads);
  px_model_train(md, train);
  px_model_zero_grad(md);
  px_tensor y, dx;
  CHECK_OK(px_model_forward(md, x, &y));
  out->fused = px_residual_relu_applied(first_residual(md->root));
  out->ny = (size_t)px_tensor_numel(&y);
  px_tensor dy = y;
  dy.data = (void *)dyv;
  CHECK_OK(px_model_backward(md, &dy, &dx));
  const size_t nx = (size_t)px_tensor_numel(x);
  out->y = malloc(out->ny * sizeof(float));
  out->dx = malloc(nx * sizeof(float));
  out->grad = malloc(md->n_param_elems * sizeof(float));
  memcpy(out->y, px_f32(&y), out->ny * sizeof(float));
  memcpy(out->dx, px_f32(&dx), nx * sizeof(float));
  memcpy(out->grad, md->grad_data, md->n_param_elems * sizeof(float));
}

static void check_model(const char *label, px_module *(*build)(bool), px_tensor x, uint64_t seed, bool set_ties) {
  px_model *fused, *apart;
  CHECK_OK(px_model_create(&fused, build(false), 1));
  CHECK_OK(px_model_create(&apart, build(true), 1));
  CHECK(fused->n_param_elems == apart->n_param_elems, "%s: the two builds have the same parameters", label);
  fill(fused->param_data, fused->n_param_elems, seed, -1.0f, 1.0f);
  if (set_ties) {  // params: 0.weight (5, 5), 0.bias (5), ...: rows 0 and 1 give -x
    for (int r = 0; r < 2; r++) {
      for (int c = 0; c < 5; c++) fused->param_data[r * 5 + c] = r == c ? -1.0f : 0.0f;
      fused->param_data[25 + r] = 0.0f;
    }
  }
  memcpy(apart->param_data, fused->param_data, fused->n_param_elems * sizeof(float));
  fill(fused->buffer_data, fused->n_buffer_elems, seed + 1, 0.2f, 1.5f);
  float *dyv;
  {
    px_tensor y;
    CHECK_OK(px_model_forward(fused, &x, &y));
    const size_t ny = (size_t)px_tensor_numel(&y);
    dyv = malloc(ny * sizeof(float));
    fill(dyv, ny, seed + 2, -1.0f, 1.0f);
  }
  fill(fused->buffer_data, fused->n_buffer_elems, seed + 1, 0.2f, 1.5f);
  const size_t nx = (size_t)px_tensor_numel(&x);
  for (int train = 1; train >= 0; train--)
    for (int threads = 1; threads <= 2; threads++) {
      const char *mode = train ? "train" : "eval";
      memcpy(apart->buffer_data, fused->buffer_data, fused->n_buffer_elems * sizeof(float));
      run a, b;
      step(fused, &x, dyv, train, threads, &a);
      step(apart, &x, dyv, train, threads, &b);
      CHECK(a.fused, "%s %s, %d threads: the chain ran Residual and ReLU fused", label, mode, threads);
      CHECK(!b.fused, "%s %s, %d threads: the Residual in a chain of its own ran alone", label, mode, threads);
      CHECK(memcmp(a.y, b.y, a.ny * sizeof(float)) == 0, "%s %s, %d threads: output, same bits", label, mode, threads);
      CHECK(memcmp(a.dx, b.dx, nx * sizeof(float)) == 0, "%s %s, %d threads: dx, same bits", label, mode, threads);
      CHECK(memcmp(a.grad, b.grad, fused->n_param_elems * sizeof(float)) == 0,
            "%s %s, %d threads: every parameter gradient, same bits", label, mode, threads);
      bool nonzero = false;
      for (size_t i = 0; i < fused->n_param_elems && !nonzero; i++) nonzero = a.grad[i] != 0.0f;
      CHECK(nonzero, "%s %s: the gradients are not all zero", label, mode);
      free(a.y);
      free(a.dx);
      free(a.grad);
      free(b.y);
      free(b.dx);
      free(b.grad);
    }
  free(dyv);
  px_model_free(fused);
  px_model_free(apart);
}

int main(void) {
  const int threads0 = px_get_num_threads();
  float x4[3 * 4 * 9 * 7];  // 3 samples of 4 channels, 9x7 planes
  fill(x4, sizeof x4 / sizeof *x4, 11, -2.0f, 2.0f);
  check_model("basic block, identity shortcut", block_identity, px_tensor_f32(x4, 4, 3, 4, 9, 7), 21, false);
  check_model("basic block, conv1x1-bn shortcut", block_projection, px_tensor_f32(x4, 4, 3, 4, 9, 7), 31, false);
  float x2[6 * 5];
  fill(x2, sizeof x2 / sizeof *x2, 12, -2.0f, 2.0f);
  check_model("linear + x with sums of exactly 0", ties, px_tensor_f32(x2, 2, 6, 5, 0, 0), 41, true);
  px_set_num_threads(threads0);
  return px_test_finish("test_residual_relu_fused_in_chain_equals_separate_bitwise");
}
