/* Claim: the layers and paths the ResNets of the model zoo use compute input
 * and parameter gradients that agree with central finite differences:
 * max-pool with padding (ResNet-18's 3×3/2 pad-1 stem pool, and others),
 * global average pooling, the residual with a projection shortcut (a whole
 * BasicBlock: conv 3×3/2 - bn - act - conv 3×3 - bn, plus downsample =
 * conv 1×1/2 - bn, summed), the residual with an identity shortcut, and the
 * convolutions ResNet adds to what test_gradcheck_conv_pool_norm covers:
 * the 7×7/2 pad-3 stem, the 1×1/2 projection, and a batch of one sample
 * with more than 64 output channels and taps (im2col + GEMM's "wide"
 * backward path, whose GEMMs are cut into chunks of 64 rows, forced with
 * PX_CONV_DIRECT=0; and the same layers by default, which on a CPU with
 * AVX-512 take the direct 3×3 kernels at stride 1 and 2), and a layer whose
 * weights pass 512 KiB (80 → 200 on 7×7 planes: there the direct kernels'
 * forward and dx run in parts of 64 input channels).
 * If this fails, that layer's backward is wrong (a padded window's argmax
 * pointing at the wrong pixel, a missing 1/(H·W), a shortcut whose gradient
 * is dropped or counted twice, a chunk of dW or dx left out) and a ResNet
 * trained with it descends in a wrong direction. */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include "gradcheck.h"

#include <stdlib.h>

static void check_padded_maxpool(void) {
  // 7×8: odd and even sides, so stride 2 ends on a padded column on one side only.
  float x[2 * 3 * 7 * 8];
  const size_t n = sizeof x / sizeof *x;
  px_tensor t = px_tensor_f32(x, 4, 2, 3, 7, 8);
  const struct { int k, s, p; } cases[] = {{3, 2, 1}, {3, 1, 1}, {2, 2, 1}, {5, 2, 2}, {4, 3, 2}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    fill_distinct(x, n, 70 + c);
    char label[64];
    snprintf(label, sizeof label, "maxpool k=%d s=%d p=%d", cases[c].k, cases[c].s, cases[c].p);
    gradcheck(label, px_maxpool2d_padded(cases[c].k, cases[c].s, cases[c].p), &t, (gc_opts){.max_checks = 128});
  }
}

static void check_global_avgpool(void) {
  float x[3 * 4 * 5 * 3];
  gc_fill_uniform(x, sizeof x / sizeof *x, 81, -1, 1);
  px_tensor t = px_tensor_f32(x, 4, 3, 4, 5, 3);
  gradcheck("global avgpool", px_global_avgpool2d(), &t, (gc_opts){.max_checks = 128});
  // As ResNet ends: conv, global pool, linear.
  gradcheck("conv-global avgpool-linear",
            px_chain_of(3, px_conv2d(4, 6, 3, 1, 1, false), px_global_avgpool2d(), px_linear(6, 3, true)), &t,
            (gc_opts){.max_checks = 96});
}

// γ = 1, β = 0 would hide a missing γ in dx: draw both from N(0, 1) instead.
static px_module *random_bn(int c) {
  px_module *m = px_batchnorm(c, 1e-5f, 0.1f);
  m->params[0].init = PX_INIT_NORMAL;
  m->params[0].init_a = 1.0f;
  m->params[1].init = PX_INIT_NORMAL;
  m->params[1].init_a = 1.0f;
  return m;
}

// torchvision's BasicBlock with tanh for ReLU (a smooth function keeps the
// finite differences away from kinks; ReLU has its own check).
static px_module *block(int in_c, int out_c, int stride, bool project) {
  px_module *inner = px_chain();
  px_chain_add_named(inner, "conv1", px_conv2d(in_c, out_c, 3, stride, 1, false));
  px_chain_add_named(inner, "bn1", random_bn(out_c));
  px_chain_add_named(inner, "act", px_tanh());
  px_chain_add_named(inner, "conv2", px_conv2d(out_c, out_c, 3, 1, 1, false));
  px_chain_add_named(inner, "bn2", random_bn(out_c));
  px_module *down = project ? px_chain_of(2, px_conv2d(in_c, out_c, 1, stride, 0, false), random_bn(out_c)) : NULL;
  px_module *b = px_chain();
  CHECK_OK(px_chain_add_named(b, "", px_residual_shortcut(inner, down, project ? "downsample" : NULL)));
  CHECK_OK(px_chain_add_named(b, "act", px_tanh()));
  CHECK(b->n_children == 2 && b->children[0]->n_children == (project ? 2 : 1), "the block is built");
  return b;
}

static void check_residuals(void) {
  float x[2 * 3 * 6 * 5];
  gc_fill_uniform(x, sizeof x / sizeof *x, 91, -1, 1);
  px_tensor t = px_tensor_f32(x, 4, 2, 3, 6, 5);
  gradcheck("BasicBlock 3->4 stride 2, projection shortcut", block(3, 4, 2, true), &t, (gc_opts){.max_checks = 128});
  gradcheck("BasicBlock 3->3, identity shortcut", block(3, 3, 1, false), &t, (gc_opts){.max_checks = 128});
  // A shortcut that is a bare module (not a chain), named "".
  gradcheck("residual: linear + linear shortcut",
            px_chain_of(2, px_flatten(),
                        px_residual_shortcut(px_chain_of(2, px_linear(90, 7, true), px_tanh()), px_linear(90, 7, false),
                                             NULL)),
            &t, (gc_opts){.max_checks = 96});
}

static void check_resnet_convs(void) {
  // The ResNet-18 stem: 7×7, stride 2, padding 3 (11×10: odd and even sides).
  float x[2 * 3 * 11 * 10];
  gc_fill_uniform(x, sizeof x / sizeof *x, 101, -1, 1);
  px_tensor t = px_tensor_f32(x, 4, 2, 3, 11, 10);
  gradcheck("conv 7x7 s=2 p=3", px_conv2d(3, 4, 7, 2, 3, false), &t, (gc_opts){.max_checks = 96});
  gradcheck("conv 1x1 s=2 (projection)", px_conv2d(3, 5, 1, 2, 0, false), &t, (gc_opts){.max_checks = 96});
  // One sample: im2col + GEMM's wide path, with 80 output rows and K = 8·3·3
  // = 72 taps, so both of its GEMMs span two chunks of 64 rows.
  // PX_CONV_DIRECT=0: with 16-float vectors the direct kernels would take
  // these 3×3 layers (the cases above check those).
  setenv("PX_CONV_DIRECT", "0", 1);
  float x1[1 * 8 * 5 * 6];
  gc_fill_uniform(x1, sizeof x1 / sizeof *x1, 102, -1, 1);
  px_tensor t1 = px_tensor_f32(x1, 4, 1, 8, 5, 6);
  gradcheck("conv wide path (N=1, 8->80, 3x3 s=1 p=1)", px_conv2d(8, 80, 3, 1, 1, true), &t1,
            (gc_opts){.max_checks = 128});
  gradcheck("conv wide path (N=1, 8->80, 3x3 s=2 p=1)", px_conv2d(8, 80, 3, 2, 1, false), &t1,
            (gc_opts){.max_checks = 128});
  unsetenv("PX_CONV_DIRECT");
  // The same layers by default: the direct kernels where they have 16-float
  // vectors (any width, stride 1 and 2), im2col + GEMM elsewhere.
  gradcheck("conv default path (N=1, 8->80, 3x3 s=1 p=1)", px_conv2d(8, 80, 3, 1, 1, true), &t1,
            (gc_opts){.max_checks = 128});
  gradcheck("conv default path (N=1, 8->80, 3x3 s=2 p=1)", px_conv2d(8, 80, 3, 2, 1, false), &t1,
            (gc_opts){.max_checks = 128});
  // Weights past 512 KiB (80·200·9 floats): with 16-float vectors the
  // direct kernels' forward and dx in parts of 64 input channels (64 + 16,
  // 3·64 + 8), 7×7 planes in two chunks of 2 vectors; with
  // PX_CONV_WINOGRAD=1 Winograd's products element by element (80 and 200
  // channels in).
  float x2[2 * 80 * 7 * 7];
  gc_fill_uniform(x2, sizeof x2 / sizeof *x2, 103, -1, 1);
  px_tensor t2 = px_tensor_f32(x2, 4, 2, 80, 7, 7);
  gradcheck("conv in parts of 64 channels (N=2, 80->200, 3x3 s=1 p=1, 7x7)", px_conv2d(80, 200, 3, 1, 1, true), &t2,
            (gc_opts){.max_checks = 128});
}

int main(void) {
  check_padded_maxpool();
  check_global_avgpool();
  check_residuals();
  check_resnet_convs();
  return px_test_finish("test_gradcheck_resnet_layers");
}
