// Direct 3×3 convolution, stride 1, padding 1, with register blocking.
//
// Why: ResNet-20's layers (16–64 channels at 32×32 … 8×8) make im2col +
// GEMM GEMMs with M = 16..64 where OpenBLAS's packing, the im2col copy (9×
// the input), col2im and their memsets cost a third of the step (the perf
// profile: docs/PERFORMANCE.md, "Figures behind code comments").  These
// kernels read the input once per tap from a padded copy that stays in
// cache.
//
// Layout (conv2d_3x3.h): every plane padded by one zero pixel and stored flat
// with rows of Wp = W + 2, so tap (i, j) of output position q = h·Wp + w is
// the padded plane at q + i·Wp + j: a 1-D convolution over the flat plane,
// vectorized along q with no row edges.  The two extra columns per row (and
// the round-up of Q to the chunk) are computed and discarded.
//
//   forward:  y[o]  = b[o] + Σ_c Σ_t W[o, c, t] · xp[c][q + off t]
//   dx:       dx[c] = Σ_o Σ_t W[o, c, 8 - t] · dyp[o][q + off t]        (the same kernel, weights flipped)
//   dW:       dW[o, c, t] += Σ_q dyp[o][Wp + 1 + q] · xp[c][q + off t]  (dyp's padding zeroes the discarded q)
//
// Register blocks (AVX2's 16 registers): forward and dx keep 4 output
// channels × 24 positions (12 accumulators of 8) across the whole sum over
// input channels and taps; dW keeps 4 output channels × the 3 taps of one
// kernel row, summed over q and over the samples of the block.  Every sum
// has a fixed order that depends on the shapes only, never on threads.
#include "nn/conv2d_3x3.h"
#include "plexus/nn.h"

#include <stdlib.h>
#include <string.h>

// The kernels for the compiler's default target (and VL, round_up).
#define PX_C3_NAME(n) n##_base
#include "nn/conv2d_3x3_body.inc"

void px_c3_geom(int H, int W, px_c3 *g) {
  g->H = H;
  g->W = W;
  g->Wp = W + 2;
  g->Q = (size_t)H * g->Wp;
  // Chunks of 3 vectors (12 accumulators), or of 2 (8, slower per position:
  // docs/PERFORMANCE.md, "Figures behind code comments") where 3 would
  // compute ≥ 1/8 more positions (8×8: Q = 80
  // is 5 chunks of 16 but 4 of 24, 96 positions).
  const size_t r2 = round_up(g->Q, 2 * VL), r3 = round_up(g->Q, 3 * VL);
  g->nv = r3 - r2 >= r2 / 8 ? 2 : 3;
  g->Qr = round_up(g->Q, (size_t)g->nv * VL);
  size_t need = g->Qr + 2 * (size_t)g->Wp + 2, img = (size_t)(H + 2) * g->Wp;
  g->PS = round_up(need > img ? need : img, VL);
}

void px_c3_pad(const px_c3 *g, const float *x, int C, float *xp) {
  const int H = g->H, W = g->W, Wp = g->Wp;
  for (int c = 0; c < C; c++) {
    float *p = xp + (size_t)c * g->PS;
    const float *s = x + (size_t)c * H * W;
    memset(p, 0, (size_t)(Wp + 1) * sizeof *p);  // top border row and the first left border
    for (int h = 0; h < H; h++) {
      float *row = p + (size_t)(h + 1) * Wp + 1;
      memcpy(row, s + (size_t)h * W, (size_t)W * sizeof *row);
      row[W] = 0.0f;      // right border
      row[W + 1] = 0.0f;  // next row's left border
    }
    const size_t done = (size_t)(H + 1) * Wp + 1;
    memset(p + done, 0, (g->PS - done) * sizeof *p);
  }
}

size_t px_c3_wr_floats(int out_c, int in_c) { return (size_t)((out_c + OB - 1) / OB) * in_c * 9 * OB; }

void px_c3_weights_fwd(const float *Wt, int O, int C, float *wr) {
  const int blocks = (O + OB - 1) / OB;
  for (int b = 0; b < blocks; b++)
    for (int c = 0; c < C; c++)
      for (int t = 0; t < 9; t++)
        for (int r = 0; r < OB; r++) {
          const int o = b * OB + r;
          wr[(((size_t)b * C + c) * 9 + t) * OB + r] = o < O ? Wt[((size_t)o * C + c) * 9 + t] : 0.0f;
        }
}

void px_c3_weights_dx(const float *Wt, int O, int C, float *wr) {
  const int blocks = (C + OB - 1) / OB;
  for (int b = 0; b < blocks; b++)
    for (int o = 0; o < O; o++)
      for (int t = 0; t < 9; t++)
        for (int r = 0; r < OB; r++) {
          const int c = b * OB + r;
          wr[(((size_t)b * O + o) * 9 + t) * OB + r] = c < C ? Wt[((size_t)o * C + c) * 9 + (8 - t)] : 0.0f;
        }
}

// The kernels for this CPU, chosen once from cpuid: the -mavx2 -mfma copy
// (conv2d_3x3_avx2.c) where the CPU has AVX2 and FMA, else the copy for the
// compiler's default target.  Each copy computes the same bits on every
// call, for any thread count; the two copies differ (FMA against separate
// multiply and add), as CPUs do.
#ifdef PX_C3_AVX2_VARIANT
static bool c3_avx2(void) {
  static _Atomic int have = -1;
  int h = have;
  if (h < 0) {
    __builtin_cpu_init();
    h = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char *e = getenv("PX_CONV_ISA");  // "base": the default target's copy (tests, measurements)
    if (e && strcmp(e, "base") == 0) h = 0;
    have = h;
  }
  return h;
}
#endif

bool px_c3_fast(void) {
#if defined(PX_C3_AVX2_VARIANT)
  return c3_avx2();
#elif defined(__x86_64__) && !defined(__AVX2__)
  return false;  // x86-64 without the AVX2 copy: only the baseline one
#else
  return true;  // PX_NATIVE, or the compiler's own target elsewhere
#endif
}

#define C3_NONE "im2col + GEMM (cpuid: no avx2+fma; direct 3x3 only with PX_CONV_DIRECT=1)"
const char *px_conv_kernel_info(void) {
#if defined(PX_C3_AVX2_VARIANT)
  return c3_avx2() ? "direct 3x3 avx2+fma (cpuid)" : C3_NONE;
#elif defined(PX_NATIVE_BUILD)
  return "direct 3x3 native (-march=native)";
#elif defined(__x86_64__) && !defined(__AVX2__)
  return C3_NONE;
#else
  return "direct 3x3 (compiler default target)";
#endif
}

void px_c3_conv(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk, const float *bias,
                float *out, float *tile) {
#ifdef PX_C3_AVX2_VARIANT
  if (c3_avx2()) {
    px_c3_conv_avx2(g, in_p, in_c, wr, out_c, blk, bias, out, tile);
    return;
  }
#endif
  px_c3_conv_base(g, in_p, in_c, wr, out_c, blk, bias, out, tile);
}

void px_c3_dw(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples, float *dW) {
#ifdef PX_C3_AVX2_VARIANT
  if (c3_avx2()) {
    px_c3_dw_avx2(g, x_p, C, dy_p, O, blk, n_samples, dW);
    return;
  }
#endif
  px_c3_dw_base(g, x_p, C, dy_p, O, blk, n_samples, dW);
}
