/* Claim: Conv2d (stride 1 and 2, padding 0 and 1, with and without bias),
 * MaxPool2d, AvgPool2d (overlapping and not), BatchNorm (train and eval,
 * on (N, C) and (N, C, H, W)) and LayerNorm compute input and parameter
 * gradients that agree with central finite differences, alone and chained.
 * If this fails, that layer's backward is wrong (a transposed index in
 * im2col/col2im, a missing batch-statistics term, a dropped bias sum) and a
 * CNN trained with it descends in a wrong direction. */
#include "gradcheck.h"

static void check_conv(void) {
  const int strides[2] = {1, 2}, pads[2] = {0, 1};
  for (int si = 0; si < 2; si++)
    for (int pi = 0; pi < 2; pi++)
      for (int bias = 0; bias < 2; bias++) {
        // 7x6: odd and even sizes, so stride 2 drops a row and not a column.
        float x[2 * 3 * 7 * 6];
        gc_fill_uniform(x, sizeof x / sizeof *x, 21 + si * 4 + pi * 2 + bias, -1, 1);
        px_tensor t = px_tensor_f32(x, 4, 2, 3, 7, 6);
        char label[64];
        snprintf(label, sizeof label, "conv s=%d p=%d bias=%d", strides[si], pads[pi], bias);
        gradcheck(label, px_conv2d(3, 4, 3, strides[si], pads[pi], bias), &t, (gc_opts){.max_checks = 96});
      }
  // A 1x1 kernel and a kernel as large as the padded input.
  float x[2 * 2 * 4 * 4];
  gc_fill_uniform(x, sizeof x / sizeof *x, 31, -1, 1);
  px_tensor t = px_tensor_f32(x, 4, 2, 2, 4, 4);
  gradcheck("conv 1x1", px_conv2d(2, 3, 1, 1, 0, true), &t, (gc_opts){0});
  gradcheck("conv k=6 p=1", px_conv2d(2, 3, 6, 1, 1, true), &t, (gc_opts){0});
}

static void check_pool(void) {
  float x[2 * 3 * 7 * 8];
  const size_t n = sizeof x / sizeof *x;
  px_tensor t = px_tensor_f32(x, 4, 2, 3, 7, 8);
  fill_distinct(x, n, 41);
  gradcheck("maxpool k=2", px_maxpool2d(2, 0), &t, (gc_opts){.max_checks = 128});
  fill_distinct(x, n, 42);
  gradcheck("maxpool k=3 s=2 (overlapping)", px_maxpool2d(3, 2), &t, (gc_opts){.max_checks = 128});
  fill_distinct(x, n, 43);
  gradcheck("maxpool k=3 s=1", px_maxpool2d(3, 1), &t, (gc_opts){.max_checks = 128});
  gc_fill_uniform(x, n, 44, -1, 1);
  gradcheck("avgpool k=2", px_avgpool2d(2, 0), &t, (gc_opts){.max_checks = 128});
  gradcheck("avgpool k=3 s=2 (overlapping)", px_avgpool2d(3, 2), &t, (gc_opts){.max_checks = 128});
}

// γ = 1, β = 0 would hide a missing γ in dx: draw both from N(0, 1) instead.
static px_module *random_affine(px_module *m) {
  m->params[0].init = PX_INIT_NORMAL;
  m->params[0].init_a = 1.0f;
  m->params[1].init = PX_INIT_NORMAL;
  m->params[1].init_a = 1.0f;
  return m;
}

static void check_norms(void) {
  for (int train = 1; train >= 0; train--) {
    float x2[6 * 4];
    gc_fill_uniform(x2, 24, 51, -2, 2);
    px_tensor t2 = px_tensor_f32(x2, 2, 6, 4, 0, 0);
    gradcheck(train ? "batchnorm (N,C) train" : "batchnorm (N,C) eval", random_affine(px_batchnorm(4, 1e-5f, 0.1f)),
              &t2, (gc_opts){.train = train});
    float x4[3 * 2 * 3 * 4];
    gc_fill_uniform(x4, 72, 52, -2, 2);
    px_tensor t4 = px_tensor_f32(x4, 4, 3, 2, 3, 4);
    gradcheck(train ? "batchnorm (N,C,H,W) train" : "batchnorm (N,C,H,W) eval",
              random_affine(px_batchnorm(2, 1e-5f, 0.1f)), &t4, (gc_opts){.train = train});
  }
  // Eval mode with running statistics that are not (0, 1), so eval
  // normalises with non-trivial constants (running_mean ~ N(0, 1)).
  {
    float x[5 * 3 * 2 * 2];
    gc_fill_uniform(x, 60, 53, -1, 3);
    px_tensor t = px_tensor_f32(x, 4, 5, 3, 2, 2);
    px_module *bn = random_affine(px_batchnorm(3, 1e-5f, 0.5f));
    bn->params[2].init = PX_INIT_NORMAL;
    bn->params[2].init_a = 1.0f;  // running_mean
    bn->params[3].init = PX_INIT_ONES;
    gradcheck("batchnorm eval, random running mean", bn, &t, (gc_opts){.train = false});
  }
  float x[3 * 2 * 7];
  gc_fill_uniform(x, 42, 54, -2, 2);
  px_tensor t = px_tensor_f32(x, 3, 3, 2, 7, 0);
  gradcheck("layernorm", random_affine(px_layernorm(7, 1e-5f)), &t, (gc_opts){0});
}

// Conv -> BatchNorm -> Tanh -> AvgPool -> Flatten -> Linear: the layers
// hand each other gradients of the right shape and layout.
static void check_chain(void) {
  float x[2 * 2 * 6 * 6];
  gc_fill_uniform(x, sizeof x / sizeof *x, 61, -1, 1);
  px_tensor t = px_tensor_f32(x, 4, 2, 2, 6, 6);
  gradcheck("conv-bn-tanh-avgpool-flatten-linear",
            px_chain_of(6, px_conv2d(2, 3, 3, 1, 1, true), px_batchnorm(3, 1e-5f, 0.1f), px_tanh(), px_avgpool2d(2, 2),
                        px_flatten(), px_linear(3 * 3 * 3, 4, true)),
            &t, (gc_opts){.max_checks = 96});
}

int main(void) {
  check_conv();
  check_pool();
  check_norms();
  check_chain();
  return px_test_finish("test_gradcheck_conv_pool_norm");
}
