/* Claim: Conv2d, MaxPool2d, AvgPool2d, BatchNorm, LayerNorm, Softmax,
 * Dropout and Flatten compute the values PyTorch's layers compute on small
 * hand-worked cases and against direct (loop-by-definition) references:
 * conv as cross-correlation with zero padding, forward and backward, with
 * the same bits for 1 and 2 threads, also for a layer too wide for the
 * per-block gradient partials (the row-chunked path), through the direct
 * 3×3 kernels and through im2col + GEMM (PX_CONV_DIRECT=0);
 * maxpool's first-max tie rule and accumulation under overlapping windows;
 * batchnorm normalising with batch statistics and updating running
 * statistics by momentum with the UNBIASED variance; dropout keeping about
 * 1 - p of the elements with the documented Philox mask, the same mask for
 * the same (seed, step) and another for another step; eval-mode dropout and
 * flatten returning views.  If this fails, plexus trains a different
 * function than the PyTorch model it claims to match (gradient checks alone
 * cannot see a consistently wrong forward). */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include "px_test.h"

#include <string.h>

static void fill(float *x, size_t n, uint64_t seed, float lo, float hi) {
  px_rng r = px_rng_make(seed, 3);
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * px_rng_uniform(&r);
}

static void set_param(px_model *md, const char *name, const float *v) {
  px_param *p = px_model_find(md, name);
  CHECK(p != NULL, "parameter %s exists", name);
  if (p) memcpy(p->data, v, p->numel * sizeof *v);
}

// ---- Conv2d -------------------------------------------------------------

// 1 channel, 4x4 input 1..16, kernel [[1,2,0],[0,1,0],[0,0,-1]], bias 0.5.
// Valid 3x3 windows of an input that grows by 1 per column and 4 per row:
//   y(i, j) = y(0, 0) + Σw·(4i + j) = (1 + 4 + 6 - 11) + 3(4i + j) -> {0, 3, 12, 15}
// Stride 2, padding 1 (windows start at -1 and 1):
//   y(0,0) = 1·1 - 1·6 = -5        y(0,1) = 1·3 - 1·8 = -5
//   y(1,0) = 2·5 + 1·9 - 1·14 = 5  y(1,1) = 6 + 2·7 + 11 - 16 = 15
static void conv_by_hand(void) {
  float x[16], w[9] = {1, 2, 0, 0, 1, 0, 0, 0, -1}, b[1] = {0.5f};
  for (int i = 0; i < 16; i++) x[i] = (float)(i + 1);
  px_tensor t = px_tensor_f32(x, 4, 1, 1, 4, 4);
  const float want[2][4] = {{0.5f, 3.5f, 12.5f, 15.5f}, {-4.5f, -4.5f, 5.5f, 15.5f}};
  for (int cfg = 0; cfg < 2; cfg++) {
    px_model *md;
    CHECK_OK(px_model_create(&md, px_conv2d(1, 1, 3, cfg ? 2 : 1, cfg ? 1 : 0, true), 1));
    set_param(md, "weight", w);
    set_param(md, "bias", b);
    px_tensor y;
    CHECK_OK(px_model_forward(md, &t, &y));
    CHECK(y.ndim == 4 && y.shape[0] == 1 && y.shape[1] == 1 && y.shape[2] == 2 && y.shape[3] == 2,
          "conv cfg %d output is (1, 1, 2, 2)", cfg);
    for (int i = 0; i < 4; i++) CHECK_CLOSE(px_f32(&y)[i], want[cfg][i], 1e-6);
    px_model_free(md);
  }
}

// Direct definition, in double:
//   y[n,o,i,j] = b[o] + Σ_{c,a,e} W[o,c,a,e]·x[n,c,i·s-p+a, j·s-p+e]   (zero outside)
// and its adjoint for dy: dx, dW, db.
typedef struct conv_geom {
  int N, C, H, W, O, k, s, p, Ho, Wo;
} conv_geom;

static void conv_reference(const conv_geom *g, const float *x, const float *w, const float *b, const float *dy,
                           double *y, double *dx, double *dw, double *db) {
  memset(dx, 0, sizeof *dx * (size_t)g->N * g->C * g->H * g->W);
  memset(dw, 0, sizeof *dw * (size_t)g->O * g->C * g->k * g->k);
  memset(db, 0, sizeof *db * (size_t)g->O);
  for (int n = 0; n < g->N; n++)
    for (int o = 0; o < g->O; o++)
      for (int i = 0; i < g->Ho; i++)
        for (int j = 0; j < g->Wo; j++) {
          size_t yi = (((size_t)n * g->O + o) * g->Ho + i) * g->Wo + j;
          double acc = b ? b[o] : 0.0;
          for (int c = 0; c < g->C; c++)
            for (int a = 0; a < g->k; a++)
              for (int e = 0; e < g->k; e++) {
                int ih = i * g->s - g->p + a, iw = j * g->s - g->p + e;
                if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) continue;
                size_t xi = (((size_t)n * g->C + c) * g->H + ih) * g->W + iw;
                size_t wi = (((size_t)o * g->C + c) * g->k + a) * g->k + e;
                acc += (double)w[wi] * x[xi];
                dx[xi] += (double)w[wi] * dy[yi];
                dw[wi] += (double)x[xi] * dy[yi];
              }
          y[yi] = acc;
          db[o] += dy[yi];
        }
}

static double max_abs_diff(const float *a, const double *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
  return m;
}

static void conv_matches_definition(void) {
  const conv_geom cfgs[] = {
    {2, 3, 7, 6, 4, 3, 1, 0, 0, 0},
    {2, 3, 7, 6, 4, 3, 2, 1, 0, 0},
    {3, 2, 5, 5, 5, 1, 1, 0, 0, 0},
    {1, 4, 9, 8, 2, 5, 3, 2, 0, 0},
    {2, 2, 3, 3, 3, 5, 1, 1, 0, 0},
    // "same" convolutions (s = 1, k = 2p + 1), including planes narrower than p
    {2, 3, 6, 5, 4, 3, 1, 1, 0, 0},
    {2, 2, 4, 7, 3, 5, 1, 2, 0, 0},
    {1, 2, 1, 1, 2, 3, 1, 1, 0, 0},
    {2, 1, 2, 9, 2, 5, 1, 2, 0, 0},
  };
  for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++)
    for (int bias = 0; bias < 2; bias++) {
      conv_geom g = cfgs[ci];
      g.Ho = (g.H + 2 * g.p - g.k) / g.s + 1;
      g.Wo = (g.W + 2 * g.p - g.k) / g.s + 1;
      const size_t nx = (size_t)g.N * g.C * g.H * g.W, ny = (size_t)g.N * g.O * g.Ho * g.Wo;
      const size_t nw = (size_t)g.O * g.C * g.k * g.k;
      float *x = malloc(nx * sizeof *x), *dyv = malloc(ny * sizeof *dyv);
      double *y = malloc(ny * sizeof *y), *dx = malloc(nx * sizeof *dx), *dw = malloc(nw * sizeof *dw), db[8];
      fill(x, nx, 100 + ci, -1, 1);
      fill(dyv, ny, 200 + ci, -1, 1);
      px_model *md;
      CHECK_OK(px_model_create(&md, px_conv2d(g.C, g.O, g.k, g.s, g.p, bias), 11));
      const float *w = px_model_find(md, "weight")->data;
      const float *b = bias ? px_model_find(md, "bias")->data : NULL;
      conv_reference(&g, x, w, b, dyv, y, dx, dw, db);
      px_tensor t = px_tensor_f32(x, 4, g.N, g.C, g.H, g.W), out, din;
      CHECK_OK(px_model_forward(md, &t, &out));
      CHECK(out.shape[2] == g.Ho && out.shape[3] == g.Wo, "conv cfg %zu output size", ci);
      CHECK(max_abs_diff(px_f32(&out), y, ny) < 1e-5, "conv cfg %zu bias %d forward: %g", ci, bias,
            max_abs_diff(px_f32(&out), y, ny));
      px_tensor dyt = out;
      dyt.data = px_model_scratch(md, ny);
      memcpy(dyt.data, dyv, ny * sizeof *dyv);
      px_model_zero_grad(md);
      CHECK_OK(px_model_backward(md, &dyt, &din));
      CHECK(max_abs_diff(px_f32(&din), dx, nx) < 1e-5, "conv cfg %zu dx: %g", ci, max_abs_diff(px_f32(&din), dx, nx));
      CHECK(max_abs_diff(px_model_find(md, "weight")->grad, dw, nw) < 1e-4, "conv cfg %zu dW: %g", ci,
            max_abs_diff(px_model_find(md, "weight")->grad, dw, nw));
      if (bias) CHECK(max_abs_diff(px_model_find(md, "bias")->grad, db, (size_t)g.O) < 1e-4, "conv cfg %zu db", ci);
      // A second backward without forward recomputes the columns that the
      // first consumed, and accumulates: grads double.
      CHECK_OK(px_model_backward(md, &dyt, &din));
      CHECK(max_abs_diff(px_f32(&din), dx, nx) < 1e-5, "conv cfg %zu dx (second backward)", ci);
      for (size_t i = 0; i < nw; i++) dw[i] *= 2;
      CHECK(max_abs_diff(px_model_find(md, "weight")->grad, dw, nw) < 2e-4, "conv cfg %zu dW accumulates", ci);
      px_model_free(md);
      free(x);
      free(dyv);
      free(y);
      free(dx);
      free(dw);
    }
}

// Backward splits the batch into fixed blocks of samples whose dW partials
// are added in block order, so gradients are the same bits whatever the
// thread count (cfg 0, cfg 1).  A layer for which not even two partials fit
// the budget (2^22 floats; cfg 2: 1024 × 2304 weights) runs samples one after
// another with each GEMM cut into fixed row chunks (the wide path): the same
// bits for 1 and 2 threads too, and the definition's values (cfg 1, 2).
static void conv_threads_and_wide_layers(void) {
  const conv_geom cfgs[3] = {{64, 8, 12, 12, 16, 3, 1, 1, 0, 0},
                             {64, 64, 4, 4, 128, 3, 1, 1, 0, 0},
                             {2, 256, 4, 4, 1024, 3, 1, 1, 0, 0}};
  for (int ci = 0; ci < 3; ci++) {
    conv_geom g = cfgs[ci];
    g.Ho = (g.H + 2 * g.p - g.k) / g.s + 1;
    g.Wo = (g.W + 2 * g.p - g.k) / g.s + 1;
    const size_t nx = (size_t)g.N * g.C * g.H * g.W, ny = (size_t)g.N * g.O * g.Ho * g.Wo;
    const size_t nw = (size_t)g.O * g.C * g.k * g.k;
    float *x = malloc(nx * sizeof *x), *dyv = malloc(ny * sizeof *dyv);
    float *y1 = malloc(ny * sizeof *y1), *dx1 = malloc(nx * sizeof *dx1), *dw1 = malloc(nw * sizeof *dw1);
    fill(x, nx, 310 + ci, -1, 1);
    fill(dyv, ny, 320 + ci, -1, 1);
    px_model *md;
    CHECK_OK(px_model_create(&md, px_conv2d(g.C, g.O, g.k, g.s, g.p, true), 5));
    const int threads0 = px_get_num_threads();
    for (int threads = 1; threads <= 2; threads++) {
      px_set_num_threads(threads);
      px_tensor t = px_tensor_f32(x, 4, g.N, g.C, g.H, g.W), y, dx;
      CHECK_OK(px_model_forward(md, &t, &y));
      px_tensor dyt = y;
      dyt.data = px_model_scratch(md, ny);
      memcpy(dyt.data, dyv, ny * sizeof *dyv);
      px_model_zero_grad(md);
      CHECK_OK(px_model_backward(md, &dyt, &dx));
      const float *dw = px_model_find(md, "weight")->grad;
      if (threads == 1) {
        memcpy(y1, y.data, ny * sizeof *y1);
        memcpy(dx1, dx.data, nx * sizeof *dx1);
        memcpy(dw1, dw, nw * sizeof *dw1);
        if (ci >= 1) {  // the wide layers against the definition
          double *ry = malloc(ny * sizeof *ry), *rdx = malloc(nx * sizeof *rdx), *rdw = malloc(nw * sizeof *rdw);
          double rdb[1024];
          conv_reference(&g, x, px_model_find(md, "weight")->data, px_model_find(md, "bias")->data, dyv, ry, rdx, rdw,
                         rdb);
          CHECK(max_abs_diff(y1, ry, ny) < 1e-4, "wide conv forward: %g", max_abs_diff(y1, ry, ny));
          CHECK(max_abs_diff(dx1, rdx, nx) < 1e-4, "wide conv dx: %g", max_abs_diff(dx1, rdx, nx));
          CHECK(max_abs_diff(dw1, rdw, nw) < 1e-3, "wide conv dW: %g", max_abs_diff(dw1, rdw, nw));
          CHECK(max_abs_diff(px_model_find(md, "bias")->grad, rdb, (size_t)g.O) < 1e-3, "wide conv db");
          free(ry);
          free(rdx);
          free(rdw);
        }
      } else {
        CHECK(memcmp(y1, y.data, ny * sizeof *y1) == 0, "conv cfg %d forward: same bits with 1 and 2 threads", ci);
        CHECK(memcmp(dx1, dx.data, nx * sizeof *dx1) == 0, "conv cfg %d dx: same bits with 1 and 2 threads", ci);
        CHECK(memcmp(dw1, dw, nw * sizeof *dw1) == 0, "conv cfg %d dW: same bits with 1 and 2 threads", ci);
      }
    }
    px_set_num_threads(threads0);
    px_model_free(md);
    free(x);
    free(dyv);
    free(y1);
    free(dx1);
    free(dw1);
  }
}

// PyTorch's init: W, b ~ U(±1/√(C·k·k)).
static void conv_init_bounds(void) {
  px_model *md;
  CHECK_OK(px_model_create(&md, px_conv2d(8, 16, 3, 1, 0, true), 3));
  const double bound = 1.0 / sqrt(8.0 * 9.0);
  px_param *w = px_model_find(md, "weight"), *b = px_model_find(md, "bias");
  float mw = px_max_abs(w->data, w->numel), mb = px_max_abs(b->data, b->numel);
  CHECK(mw <= bound && mw > 0.9 * bound, "conv weight spans U(±%g): max |w| = %g", bound, (double)mw);
  CHECK(mb <= bound && mb > 0.5 * bound, "conv bias within U(±%g): max |b| = %g", bound, (double)mb);
  px_model_free(md);
}

// ---- Pools ------------------------------------------------------------------

//   x = [ 1  5  2  0 ]   maxpool 2: [5 8]   avgpool 2: [3.25 4.25]
//       [ 3  4  8  7 ]              [9 6]              [2.50 4.75]
//       [ 0 -1  6  6 ]   (ties in the last window: the FIRST 6, at (2,2))
//       [ 2  9  6  1 ]
//   maxpool k=3 s=1: [8 8; 9 9]; the shared maxima collect both gradients.
static void pools_by_hand(void) {
  float x[16] = {1, 5, 2, 0, 3, 4, 8, 7, 0, -1, 6, 6, 2, 9, 6, 1};
  float dyv[4] = {1, 2, 3, 4};
  px_tensor t = px_tensor_f32(x, 4, 1, 1, 4, 4);
  struct {
    px_module *m;
    float y[4];
    float dx[16];
  } cases[3] = {
    {px_maxpool2d(2, 0), {5, 8, 9, 6}, {0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 3, 0, 0}},
    {px_avgpool2d(2, 0),
     {3.25f, 4.25f, 2.5f, 4.75f},
     {.25f, .25f, .5f, .5f, .25f, .25f, .5f, .5f, .75f, .75f, 1, 1, .75f, .75f, 1, 1}},
    {px_maxpool2d(3, 1), {8, 8, 9, 9}, {0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 7, 0, 0}},
  };
  for (int c = 0; c < 3; c++) {
    px_model *md;
    CHECK_OK(px_model_create(&md, cases[c].m, 1));
    px_tensor y, dx;
    CHECK_OK(px_model_forward(md, &t, &y));
    CHECK(y.shape[2] == 2 && y.shape[3] == 2, "pool case %d output 2x2", c);
    for (int i = 0; i < 4; i++) CHECK_CLOSE(px_f32(&y)[i], cases[c].y[i], 1e-7);
    px_tensor dyt = y;
    dyt.data = px_model_scratch(md, 4);
    memcpy(dyt.data, dyv, sizeof dyv);
    CHECK_OK(px_model_backward(md, &dyt, &dx));
    for (int i = 0; i < 16; i++)
      CHECK(px_f32(&dx)[i] == cases[c].dx[i], "pool case %d dx[%d] = %g, expected %g", c, i, (double)px_f32(&dx)[i],
            (double)cases[c].dx[i]);
    px_model_free(md);
  }
  // NaN propagates through maxpool, as in PyTorch (a NaN replaces the maximum).
  {
    float xn[16] = {1, 2, 9, 9, 3, NAN, 9, 9, 0, 0, 0, 0, 0, 0, 0, NAN};
    px_tensor tn = px_tensor_f32(xn, 4, 1, 1, 4, 4);
    px_model *mn;
    CHECK_OK(px_model_create(&mn, px_maxpool2d(2, 0), 1));
    px_tensor yn;
    CHECK_OK(px_model_forward(mn, &tn, &yn));
    const float *v = px_f32(&yn);
    CHECK(isnan(v[0]) && v[1] == 9.0f && v[2] == 0.0f && isnan(v[3]), "maxpool NaN: %g %g %g %g", (double)v[0],
          (double)v[1], (double)v[2], (double)v[3]);
    px_model_free(mn);
  }
  // Floor mode: 5x5 with k=2 gives 2x2 (the last row and column are dropped).
  float x5[25] = {0};
  px_tensor t5 = px_tensor_f32(x5, 4, 1, 1, 5, 5);
  px_model *md;
  CHECK_OK(px_model_create(&md, px_maxpool2d(2, 0), 1));
  px_tensor y;
  CHECK_OK(px_model_forward(md, &t5, &y));
  CHECK(y.shape[2] == 2 && y.shape[3] == 2, "floor mode: 5x5 / 2 -> 2x2, got %lldx%lld", (long long)y.shape[2],
        (long long)y.shape[3]);
  px_model_free(md);
}

// ---- BatchNorm ---------------------------------------------------------------

// x = [1 2 3 4] as (4, 1): μ = 2.5, σ² = 1.25 (biased), 5/3 (unbiased).
// After one training step with momentum 0.1:
//   running_mean = 0.9·0 + 0.1·2.5 = 0.25
//   running_var  = 0.9·1 + 0.1·5/3 = 1.0666667
static void batchnorm_by_hand(void) {
  float x[4] = {1, 2, 3, 4};
  px_tensor t = px_tensor_f32(x, 2, 4, 1, 0, 0);
  px_model *md;
  CHECK_OK(px_model_create(&md, px_batchnorm(1, 1e-5f, 0.1f), 1));
  px_tensor y;
  CHECK_OK(px_model_forward(md, &t, &y));
  for (int i = 0; i < 4; i++) CHECK_CLOSE(px_f32(&y)[i], (x[i] - 2.5) / sqrt(1.25 + 1e-5), 1e-6);
  CHECK_CLOSE(px_model_find(md, "running_mean")->data[0], 0.25, 1e-7);
  CHECK_CLOSE(px_model_find(md, "running_var")->data[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-7);
  // Eval: normalise with the running statistics, leave them unchanged.
  px_model_train(md, false);
  CHECK_OK(px_model_forward(md, &t, &y));
  for (int i = 0; i < 4; i++) CHECK_CLOSE(px_f32(&y)[i], (x[i] - 0.25) / sqrt(0.9 + 0.1 * 5.0 / 3.0 + 1e-5), 1e-6);
  CHECK_CLOSE(px_model_find(md, "running_mean")->data[0], 0.25, 1e-7);
  px_model_free(md);
}

// (N, C, H, W) with per-channel offsets and scales: after training-mode
// batchnorm (γ = 1, β = 0) every channel has mean 0 and variance σ²/(σ²+ε) ≈ 1;
// the running statistics move by momentum towards (μ, unbiased σ²), step after step.
static void batchnorm_normalises_batches(void) {
  enum { N = 8, C = 3, HW = 25 };
  static float x[N * C * HW];
  fill(x, sizeof x / sizeof *x, 401, -1, 1);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int q = 0; q < HW; q++)
        x[(n * C + c) * HW + q] = x[(n * C + c) * HW + q] * (float)(c + 1) * 3.0f + 5.0f * (float)c - 2.0f;
  px_tensor t = px_tensor_f32(x, 4, N, C, 5, 5);
  px_model *md;
  const float momentum = 0.3f;
  CHECK_OK(px_model_create(&md, px_chain_of(1, px_batchnorm(C, 1e-5f, momentum)), 1));
  double rm[C] = {0, 0, 0}, rv[C] = {1, 1, 1};
  for (int step = 0; step < 3; step++) {
    px_tensor y;
    CHECK_OK(px_model_forward(md, &t, &y));
    for (int c = 0; c < C; c++) {
      double s = 0, ss = 0, ys = 0, yss = 0;
      for (int n = 0; n < N; n++)
        for (int q = 0; q < HW; q++) {
          double v = x[(n * C + c) * HW + q];
          s += v;
          ss += v * v;
        }
      const double cnt = N * HW, mu = s / cnt, var = ss / cnt - mu * mu;
      for (int n = 0; n < N; n++)
        for (int q = 0; q < HW; q++) {
          double v = px_f32(&y)[(n * C + c) * HW + q];
          ys += v;
          yss += v * v;
        }
      CHECK(fabs(ys / cnt) < 1e-5, "channel %d mean after batchnorm: %g", c, ys / cnt);
      CHECK_CLOSE(yss / cnt, var / (var + 1e-5), 1e-5);
      rm[c] = (1 - momentum) * rm[c] + momentum * mu;
      rv[c] = (1 - momentum) * rv[c] + momentum * var * cnt / (cnt - 1);
      CHECK_CLOSE(px_model_find(md, "0.running_mean")->data[c], rm[c], 1e-5);
      CHECK_CLOSE(px_model_find(md, "0.running_var")->data[c], rv[c], 1e-5);
    }
  }
  px_model_free(md);
}

// ---- LayerNorm and Softmax -------------------------------------------------

static void layernorm_softmax_by_hand(void) {
  // Each row [1 2 3 4] + offset normalises to (x - μ)/√(1.25 + ε).
  float x[8] = {1, 2, 3, 4, 11, 12, 13, 14};
  px_tensor t = px_tensor_f32(x, 2, 2, 4, 0, 0);
  px_model *md;
  CHECK_OK(px_model_create(&md, px_layernorm(4, 1e-5f), 1));
  px_tensor y;
  CHECK_OK(px_model_forward(md, &t, &y));
  for (int i = 0; i < 8; i++) CHECK_CLOSE(px_f32(&y)[i], ((i % 4) + 1 - 2.5) / sqrt(1.25 + 1e-5), 1e-6);
  px_model_free(md);
  // softmax([0, ln 2, ln 3]) = [1/6, 2/6, 3/6]; shifting the row by 1000 changes nothing.
  float z[6] = {0, (float)log(2.0), (float)log(3.0), 1000, 1000 + (float)log(2.0), 1000 + (float)log(3.0)};
  px_tensor tz = px_tensor_f32(z, 2, 2, 3, 0, 0);
  CHECK_OK(px_model_create(&md, px_softmax(), 1));
  CHECK_OK(px_model_forward(md, &tz, &y));
  for (int i = 0; i < 3; i++) CHECK_CLOSE(px_f32(&y)[i], (i + 1) / 6.0, 1e-6);
  for (int i = 3; i < 6; i++) CHECK_CLOSE(px_f32(&y)[i], (i - 2) / 6.0, 1e-4);  // z rounds near 1000
  px_model_free(md);
}

// ---- Dropout and Flatten -----------------------------------------------------

static void dropout_masks(void) {
  enum { n = 100000 };
  const float p = 0.3f;
  static float x[n], first[n];
  fill(x, n, 501, 0.5f, 1.5f);  // never zero, so y == 0 means dropped
  px_tensor t = px_tensor_f32(x, 2, 100, 1000, 0, 0);
  px_model *md;
  CHECK_OK(px_model_create(&md, px_dropout(p), 42));
  px_tensor y;
  CHECK_OK(px_model_forward(md, &t, &y));  // step 1
  size_t kept = 0, exact = 0, formula = 0;
  const float scale = 1.0f / (1.0f - p);
  for (size_t i = 0; i < n; i++) {
    const float v = px_f32(&y)[i];
    if (v != 0.0f) {
      kept++;
      exact += v == x[i] * scale;
    }
    // The documented mask: words of philox(seed, (uid << 40) ^ step, i / 4).
    uint32_t w[4];
    px_philox4x32(42, ((uint64_t)md->root->uid << 40) ^ 1u, i / 4, w);
    formula += (px_u32_to_unit(w[i % 4]) >= p) == (v != 0.0f);
  }
  memcpy(first, y.data, sizeof first);
  // Binomial(1e5, 0.7): σ = 0.0014 of the fraction; 0.01 is 7σ.
  CHECK(fabs((double)kept / n - (1 - p)) < 0.01, "dropout kept %.4f, expected %.2f", (double)kept / n, 1 - p);
  CHECK(exact == kept, "kept elements are x / (1 - p): %zu of %zu", exact, kept);
  CHECK(formula == n, "mask follows philox(seed, (uid << 40) ^ step, i / 4): %zu of %d", formula, n);
  // Same (seed, step): the same mask.  Another step: another mask.
  md->ctx.step = 0;
  CHECK_OK(px_model_forward(md, &t, &y));
  CHECK(memcmp(first, y.data, sizeof first) == 0, "same seed and step give the same mask");
  CHECK_OK(px_model_forward(md, &t, &y));  // step 2
  size_t differ = 0;
  for (size_t i = 0; i < n; i++) differ += (first[i] != 0.0f) != (px_f32(&y)[i] != 0.0f);
  // Independent masks differ in 2·0.3·0.7 = 42% of the positions.
  CHECK(fabs((double)differ / n - 0.42) < 0.02, "next step draws a new mask: %.3f differ", (double)differ / n);
  // Eval: identity, as a view of the input.
  px_model_train(md, false);
  CHECK_OK(px_model_forward(md, &t, &y));
  CHECK(y.data == (void *)x && px_tensor_same_shape(&y, &t), "eval-mode dropout returns x itself");
  px_model_free(md);
  // Two dropouts in one model draw independent masks (keyed by uid):
  // both keep an element with probability 0.49, not 0.7.
  CHECK_OK(px_model_create(&md, px_chain_of(2, px_dropout(p), px_dropout(p)), 42));
  CHECK_OK(px_model_forward(md, &t, &y));
  kept = 0;
  for (size_t i = 0; i < n; i++) kept += px_f32(&y)[i] != 0.0f;
  CHECK(fabs((double)kept / n - 0.49) < 0.01, "two dropouts keep %.4f, expected 0.49", (double)kept / n);
  px_model_free(md);
}

static void flatten_is_a_view(void) {
  float x[2 * 3 * 4 * 5];
  fill(x, 120, 601, -1, 1);
  px_tensor t = px_tensor_f32(x, 4, 2, 3, 4, 5);
  px_model *md;
  CHECK_OK(px_model_create(&md, px_flatten(), 1));
  px_tensor y, dx;
  CHECK_OK(px_model_forward(md, &t, &y));
  CHECK(y.ndim == 2 && y.shape[0] == 2 && y.shape[1] == 60, "flatten (2, 3, 4, 5) -> (2, 60)");
  CHECK(y.data == (void *)x, "flatten returns a view, not a copy");
  px_tensor dy = y;
  dy.data = px_model_scratch(md, 120);
  CHECK_OK(px_model_backward(md, &dy, &dx));
  CHECK(dx.data == dy.data && px_tensor_same_shape(&dx, &t), "flatten's dx is dy seen with x's shape");
  px_model_free(md);
}

int main(void) {
  conv_by_hand();
  conv_matches_definition();
  conv_threads_and_wide_layers();
  // The same through im2col + GEMM (3×3 stride-1 layers take direct kernels
  // otherwise): the wide row-chunked path is reached only this way.
  setenv("PX_CONV_DIRECT", "0", 1);
  conv_matches_definition();
  conv_threads_and_wide_layers();
  unsetenv("PX_CONV_DIRECT");
  conv_init_bounds();
  pools_by_hand();
  batchnorm_by_hand();
  batchnorm_normalises_batches();
  layernorm_softmax_by_hand();
  dropout_masks();
  flatten_is_a_view();
  return px_test_finish("test_layers_match_known_values");
}
