/* Claim: the direct 3×3 padding-1 convolution kernels, stride 1 and 2
 * (src/nn/conv2d_3x3.c) compute the convolution's definition, forward and
 * backward (y, dx, dW, db), to float32 rounding (within 1e-5 of the scale of
 * each result, against a float64 loop-by-definition reference), as the
 * im2col + GEMM path does (PX_CONV_DIRECT=0, checked on the same cases
 * against the same reference); they give the same bits for 1, 2 and 3
 * threads; a second backward without a forward accumulates the same
 * gradients again.  Shapes cover the register blocks' remainders (channels
 * not a multiple of 4 or 8, planes whose flat length leaves 0, 1 or 2
 * vectors after the chunks of 3, for vectors of 8 and of 16 floats), ResNet-20's 16-channel 32×32 layer, more samples than dW blocks
 * (uneven blocks), a 1×1 plane, one sample, a layer whose weights take the
 * forward and dx in parts of 64 input channels (80 → 200, 7×7), and a layer
 * too wide for two dW partials (512 → 512, through the kernels with PX_CONV_DIRECT=1: by
 * default layers past 64 channels take im2col + GEMM where the kernels
 * have 8-float vectors), and at stride 2 ResNet-20's 16 → 32 downsampling
 * layer, odd plane sizes, a 2×1 plane and uneven dW blocks.  If this fails, a convolution in ResNet-style
 * networks computes something other than PyTorch's Conv2d(k=3, padding=1, stride=1 or 2),
 * or its gradients depend on the thread count.
 *
 * Run with PX_CONV_WINOGRAD=1 (the tests
 * test_conv3x3_winograd_f4x4_{default,base,avx2}_copy_matches_definition_any_threads),
 * the stride-1 cases take Winograd F(4×4, 3×3) for the forward, dx and
 * dW: y, dx and dW within 1e-4 of the scale, as F(4×4)'s transforms round
 * (their entries up to 8 and 1/24; up to 6.6e-5 measured here, on 512
 * channels), db within 1e-5, the same bits for 1, 2 and 3 threads (other
 * groupings of samples into tall planes), and groups whose last has fewer
 * samples (19 samples; dW's blocks of 1 or 2 samples, groups of 2), and
 * one case by conv2d.c's own rule (Winograd's dW beside the direct dx).
 * Otherwise the direct runs set PX_CONV_WINOGRAD=0: this checks the direct
 * kernels themselves. */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include "px_test.h"

#include <string.h>

typedef struct geom {
  int N, C, O, H, W;
  bool bias;
  int stride;
  bool by_rule; /* with PX_CONV_WINOGRAD=1 in the environment: this case runs conv2d.c's own rule instead */
} geom;

static int stride_of(const geom *g) { return g->stride; }
static int out_h(const geom *g) { return (g->H - 1) / stride_of(g) + 1; }
static int out_w(const geom *g) { return (g->W - 1) / stride_of(g) + 1; }

static void fill(float *x, size_t n, uint64_t seed) {
  px_rng r = px_rng_make(seed, 7);
  for (size_t i = 0; i < n; i++) x[i] = 2.0f * px_rng_uniform(&r) - 1.0f;
}

// y = b + W ⋆ x (3×3, padding 1, the case's stride), and the adjoint for
// dy, in double.
static void reference(const geom *g, const float *x, const float *w, const float *b, const float *dy, double *y,
                      double *dx, double *dw, double *db) {
  const int H = g->H, W = g->W, s = stride_of(g), Ho = out_h(g), Wo = out_w(g);
  memset(dx, 0, sizeof *dx * (size_t)g->N * g->C * H * W);
  memset(dw, 0, sizeof *dw * (size_t)g->O * g->C * 9);
  memset(db, 0, sizeof *db * (size_t)g->O);
  for (int n = 0; n < g->N; n++)
    for (int o = 0; o < g->O; o++)
      for (int i = 0; i < Ho; i++)
        for (int j = 0; j < Wo; j++) {
          const size_t yi = (((size_t)n * g->O + o) * Ho + i) * Wo + j;
          double acc = b ? b[o] : 0.0;
          for (int c = 0; c < g->C; c++)
            for (int a = 0; a < 3; a++)
              for (int e = 0; e < 3; e++) {
                const int ih = i * s - 1 + a, iw = j * s - 1 + e;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const size_t xi = (((size_t)n * g->C + c) * H + ih) * W + iw;
                const size_t wi = ((size_t)o * g->C + c) * 9 + a * 3 + e;
                acc += (double)w[wi] * x[xi];
                dx[xi] += (double)w[wi] * dy[yi];
                dw[wi] += (double)x[xi] * dy[yi];
              }
          y[yi] = acc;
          db[o] += dy[yi];
        }
}

// max |a - b| / max(rms(b), 1e-30): the error at the result's own scale.
static double rel_err(const float *a, const double *b, size_t n) {
  double ss = 0, m = 0;
  for (size_t i = 0; i < n; i++) ss += b[i] * b[i];
  const double rms = fmax(sqrt(ss / (double)n), 1e-30);
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
  return m / rms;
}

static bool winograd; /* PX_CONV_WINOGRAD=1 in the environment: the stride-1 runs take Winograd */

typedef struct run {
  float *y, *dx, *dw, *db;
} run;

// Forward, zero_grad, backward with the given threads; results copied out.
static void run_layer(px_model *md, const geom *g, const float *x, const float *dyv, int threads, run *out) {
  const size_t nx = (size_t)g->N * g->C * g->H * g->W, ny = (size_t)g->N * g->O * out_h(g) * out_w(g);
  const size_t nw = (size_t)g->O * g->C * 9;
  px_set_num_threads(threads);
  px_tensor t = px_tensor_f32((float *)x, 4, g->N, g->C, g->H, g->W), y, dx;
  CHECK_OK(px_model_forward(md, &t, &y));
  px_tensor dyt = y;
  dyt.data = px_model_scratch(md, ny);
  memcpy(dyt.data, dyv, ny * sizeof *dyv);
  px_model_zero_grad(md);
  CHECK_OK(px_model_backward(md, &dyt, &dx));
  memcpy(out->y, y.data, ny * sizeof(float));
  memcpy(out->dx, dx.data, nx * sizeof(float));
  memcpy(out->dw, px_model_find(md, "weight")->grad, nw * sizeof(float));
  if (g->bias) memcpy(out->db, px_model_find(md, "bias")->grad, (size_t)g->O * sizeof(float));
  // Backward again without forward: the gradients accumulate (twice the first).
  CHECK_OK(px_model_backward(md, &dyt, &dx));
  const float *dw2 = px_model_find(md, "weight")->grad;
  double worst = 0;
  for (size_t i = 0; i < nw; i++) worst = fmax(worst, fabs((double)dw2[i] - 2.0 * out->dw[i]));
  double scale = 0;
  for (size_t i = 0; i < nw; i++) scale = fmax(scale, fabs((double)out->dw[i]));
  CHECK(worst <= 1e-6 * scale, "second backward accumulates dW: off by %g (scale %g)", worst, scale);
  CHECK(memcmp(out->dx, dx.data, nx * sizeof(float)) == 0, "second backward gives the same dx");
}

static void check_case(const geom *g, int ci) {
  const size_t nx = (size_t)g->N * g->C * g->H * g->W, ny = (size_t)g->N * g->O * out_h(g) * out_w(g);
  const size_t nw = (size_t)g->O * g->C * 9;
  float *x = malloc(nx * sizeof *x), *dyv = malloc(ny * sizeof *dyv);
  double *ry = malloc(ny * sizeof *ry), *rdx = malloc(nx * sizeof *rdx), *rdw = malloc(nw * sizeof *rdw);
  double *rdb = malloc((size_t)g->O * sizeof *rdb);
  run r[4];
  for (int k = 0; k < 4; k++) {
    r[k].y = malloc(ny * sizeof(float));
    r[k].dx = malloc(nx * sizeof(float));
    r[k].dw = malloc(nw * sizeof(float));
    r[k].db = malloc((size_t)g->O * sizeof(float));
  }
  fill(x, nx, 100 + ci);
  fill(dyv, ny, 200 + ci);
  px_model *md;
  CHECK_OK(px_model_create(&md, px_conv2d(g->C, g->O, 3, stride_of(g), 1, g->bias), 11 + ci));
  reference(g, x, px_model_find(md, "weight")->data, g->bias ? px_model_find(md, "bias")->data : NULL, dyv, ry, rdx,
            rdw, rdb);
  const int threads0 = px_get_num_threads();
  // r[0..2]: direct with 1, 2, 3 threads; r[3]: im2col + GEMM, 1 thread.
  // PX_CONV_DIRECT=1: the direct kernels even past 64 channels with 8-float vectors (case 5).
  for (int k = 0; k < 4; k++) {
    setenv("PX_CONV_DIRECT", k < 3 ? "1" : "0", 1);
    if (winograd && g->by_rule) unsetenv("PX_CONV_WINOGRAD");
    else setenv("PX_CONV_WINOGRAD", winograd ? "1" : "0", 1);
    run_layer(md, g, x, dyv, k < 3 ? k + 1 : 1, &r[k]);
    unsetenv("PX_CONV_DIRECT");
    unsetenv("PX_CONV_WINOGRAD");
  }
  px_set_num_threads(threads0);
  const bool w4 = winograd && g->stride == 1;
  const char *path[4] = {w4 ? "winograd" : "direct", "", "", "im2col"};
  for (int k = 0; k < 4; k += 3) {
    const double ey = rel_err(r[k].y, ry, ny), edx = rel_err(r[k].dx, rdx, nx), edw = rel_err(r[k].dw, rdw, nw);
    const double tol = w4 && k == 0 ? 1e-4 : 1e-5;
    CHECK(ey < tol, "case %d (%s) forward: %g of the scale from float64", ci, path[k], ey);
    CHECK(edx < tol, "case %d (%s) dx: %g of the scale from float64", ci, path[k], edx);
    CHECK(edw < tol, "case %d (%s) dW: %g of the scale from float64", ci, path[k], edw);
    if (g->bias) {
      const double edb = rel_err(r[k].db, rdb, (size_t)g->O);
      CHECK(edb < 1e-5, "case %d (%s) db: %g of the scale from float64", ci, path[k], edb);
    }
  }
  for (int k = 1; k < 3; k++) {
    CHECK(memcmp(r[0].y, r[k].y, ny * sizeof(float)) == 0, "case %d forward: same bits, 1 and %d threads", ci, k + 1);
    CHECK(memcmp(r[0].dx, r[k].dx, nx * sizeof(float)) == 0, "case %d dx: same bits, 1 and %d threads", ci, k + 1);
    CHECK(memcmp(r[0].dw, r[k].dw, nw * sizeof(float)) == 0, "case %d dW: same bits, 1 and %d threads", ci, k + 1);
    if (g->bias)
      CHECK(memcmp(r[0].db, r[k].db, (size_t)g->O * sizeof(float)) == 0, "case %d db: same bits, 1 and %d threads", ci,
            k + 1);
  }
  px_model_free(md);
  for (int k = 0; k < 4; k++) {
    free(r[k].y);
    free(r[k].dx);
    free(r[k].dw);
    free(r[k].db);
  }
  free(x);
  free(dyv);
  free(ry);
  free(rdx);
  free(rdw);
  free(rdb);
}

int main(void) {
  const char *e = getenv("PX_CONV_WINOGRAD");
  winograd = e && strcmp(e, "1") == 0;
  const geom cases[] = {
    {3, 5, 6, 7, 9, true, 1, false},      // channels and flat length off every block size
    {4, 16, 16, 32, 32, true, 1, false},  // ResNet-20's first stage
    {19, 3, 8, 8, 8, true, 1,
     false},  // 19 samples in uneven dW blocks; 8×8: chunks of 3 vectors and one of 2 (16 floats)
    {1, 4, 5, 1, 1, true, 1, false},      // a 1×1 plane: every tap but the centre reads padding
    {1, 2, 3, 2, 13, false, 1, false},    // one sample, no bias, a wide flat plane
    {2, 512, 512, 4, 4, true, 1, false},  // too wide for two dW partials (512·512·9 > 2^21 floats)
    // Weights past 512 KiB: the forward and dx in parts of 64 input
    // channels (80 = 64 + 16 forward, 200 = 3·64 + 8 for dx); 7×7 at 16
    // floats: 4 vectors, two chunks of 2; with Winograd, transformed inputs
    // past 512 KiB (80 channels at 16 floats, 200 at 8 and 16).
    {2, 80, 200, 7, 7, true, 1, false},
    {2, 32, 32, 16, 16, true, 1, false},  // ResNet-20's second stage: whole chunks of 3 vectors (8 and 16 floats)
    {3, 20, 12, 5, 8, true, 1, false},  // chunks of 3 and one of 1 vector (8 and 16 floats); 12 = 8 + 4 output channels
    {19, 16, 24, 14, 14, true, 1, false},  // Winograd: 14 = 3·4 + 2 (part tiles), 19 samples in groups, the last short
    {7, 17, 16, 9, 23, false, 1, false},   // Winograd: odd sizes, rows past 2·VL and a scalar tail
    // Winograd by conv2d.c's rule: the forward and dW through Winograd, dx
    // (the layer widens) on the direct kernels.
    {3, 16, 32, 28, 28, true, 1, true},
    // Stride 2 (the phase planes):
    {4, 16, 32, 32, 32, true, 2, false},  // ResNet-20's first downsampling layer
    {5, 3, 6, 7, 9, true, 2, false},      // odd plane sizes: the last phase row and column only half there
    {2, 5, 3, 2, 1, false, 2, false},     // a 2×1 plane: one output pixel
    {19, 12, 9, 10, 6, true, 2, false},   // uneven dW blocks, channels off every block size
  };
  for (int ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) check_case(&cases[ci], ci);
  return px_test_finish("test_conv3x3_direct_matches_definition_and_im2col_any_threads");
}
