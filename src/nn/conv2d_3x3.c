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
// Register blocks: forward and dx keep OB output channels × NV vectors of
// positions across the whole sum over input channels and taps; dW keeps OB
// output channels × the 3 taps of one kernel row, summed over q and over
// the samples of the block.  AVX2 (16 registers of 8 floats): OB = 4, 12
// accumulators; AVX-512 (32 registers of 16): OB = 8, 24 accumulators.
// Every sum has a fixed order that depends on the shapes only, never on
// threads; the forward and dx sums of each position also do not depend on
// the vector width (each lane sums its own position in the same order).
#include "nn/conv2d_3x3.h"
#include "plexus/nn.h"

#include <stdlib.h>
#include <string.h>

// The kernels for the compiler's default target: 16-float vectors where it
// has AVX-512F (a PX_NATIVE build on such a CPU), else 8.
#if defined(__AVX512F__)
#define BASE_VL 16
#define BASE_OB 8
#else
#define BASE_VL 8
#define BASE_OB 4
#endif
#define PX_C3_NAME(n) n##_base
#define PX_C3_VL BASE_VL
#define PX_C3_OB_ BASE_OB
#include "nn/conv2d_3x3_body.inc"

// The copy this CPU runs, chosen once from cpuid: AVX-512F + FMA
// (conv2d_3x3_avx512.c), else AVX2 + FMA (conv2d_3x3_avx2.c), else the copy
// for the compiler's default target.  Each copy computes the same bits on
// every call, for any thread count; the copies differ in dW's sums (their
// vector widths) and the baseline one in its rounding (separate multiply
// and add), as CPUs do.  PX_CONV_ISA=base | avx2 | avx512 asks for one
// (tests, measurements); a copy the CPU cannot run is never taken.
static int c3_isa(void) {
  static _Atomic int isa = -1;
  int h = isa;
  if (h < 0) {
    h = PX_C3_BASE;
#ifdef PX_C3_AVX2_VARIANT
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
    h = avx512 ? PX_C3_AVX512 : avx2 ? PX_C3_AVX2 : PX_C3_BASE;
    const char *e = getenv("PX_CONV_ISA");
    if (e && strcmp(e, "base") == 0) h = PX_C3_BASE;
    if (e && strcmp(e, "avx2") == 0 && avx2) h = PX_C3_AVX2;
#endif
    isa = h;
  }
  return h;
}

void px_c3_geom(int H, int W, px_c3 *g) {
  g->isa = c3_isa();
  g->vl = g->isa == PX_C3_AVX512 ? 16 : g->isa == PX_C3_AVX2 ? 8 : BASE_VL;
  g->ob = g->isa == PX_C3_AVX512 ? 8 : g->isa == PX_C3_AVX2 ? 4 : BASE_OB;
  g->H = H;
  g->W = W;
  g->Wp = W + 2;
  g->Q = (size_t)H * g->Wp;
  // The forward/dx kernel's chunks: 3 vectors, then the 1 or 2 left.
  const size_t vl = (size_t)g->vl;
  g->Qr = round_up(g->Q, vl);
  g->dy_lead = (vl - (size_t)(g->Wp + 1) % vl) % vl;
  size_t need = g->Qr + 2 * (size_t)g->Wp + 2, img = (size_t)(H + 2) * g->Wp;
  g->PS = round_up(need > img ? need : img, vl);
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

size_t px_c3_wr_floats(const px_c3 *g, int out_c, int in_c) {
  return (size_t)((out_c + g->ob - 1) / g->ob) * in_c * 9 * g->ob;
}

void px_c3_weights_fwd(const px_c3 *g, const float *Wt, int O, int C, float *wr) {
  const int ob = g->ob, blocks = (O + ob - 1) / ob;
  for (int b = 0; b < blocks; b++)
    for (int c = 0; c < C; c++)
      for (int t = 0; t < 9; t++)
        for (int r = 0; r < ob; r++) {
          const int o = b * ob + r;
          wr[(((size_t)b * C + c) * 9 + t) * ob + r] = o < O ? Wt[((size_t)o * C + c) * 9 + t] : 0.0f;
        }
}

void px_c3_weights_dx(const px_c3 *g, const float *Wt, int O, int C, float *wr) {
  const int ob = g->ob, blocks = (C + ob - 1) / ob;
  for (int b = 0; b < blocks; b++)
    for (int o = 0; o < O; o++)
      for (int t = 0; t < 9; t++)
        for (int r = 0; r < ob; r++) {
          const int c = b * ob + r;
          wr[(((size_t)b * O + o) * 9 + t) * ob + r] = c < C ? Wt[((size_t)o * C + c) * 9 + (8 - t)] : 0.0f;
        }
}

bool px_c3_fast(void) {
#if defined(PX_C3_AVX2_VARIANT)
  return c3_isa() != PX_C3_BASE;
#elif defined(__x86_64__) && !defined(__AVX2__)
  return false;  // x86-64 without the AVX2 copy: only the baseline one
#else
  return true;  // PX_NATIVE, or the compiler's own target elsewhere
#endif
}

bool px_c3_wide(void) {
  px_c3 g;
  px_c3_geom(1, 1, &g);
  return g.vl == 16;
}

#define C3_NONE "im2col + GEMM (cpuid: no avx2+fma; direct 3x3 only with PX_CONV_DIRECT=1)"
const char *px_conv_kernel_info(void) {
#if defined(PX_C3_AVX2_VARIANT)
  const int isa = c3_isa();
  return isa == PX_C3_AVX512 ? "direct 3x3 avx512f+fma (cpuid)"
    : isa == PX_C3_AVX2      ? "direct 3x3 avx2+fma (cpuid)"
                             : C3_NONE;
#elif defined(PX_NATIVE_BUILD)
  return BASE_VL == 16 ? "direct 3x3 native avx512 (-march=native)" : "direct 3x3 native (-march=native)";
#elif defined(__x86_64__) && !defined(__AVX2__)
  return C3_NONE;
#else
  return "direct 3x3 (compiler default target)";
#endif
}

void px_c3_conv(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk, const float *bias,
                float *out, float *tile) {
#ifdef PX_C3_AVX2_VARIANT
  if (g->isa == PX_C3_AVX512) {
    px_c3_conv_avx512(g, in_p, in_c, wr, out_c, blk, bias, out, tile);
    return;
  }
  if (g->isa == PX_C3_AVX2) {
    px_c3_conv_avx2(g, in_p, in_c, wr, out_c, blk, bias, out, tile);
    return;
  }
#endif
  px_c3_conv_base(g, in_p, in_c, wr, out_c, blk, bias, out, tile);
}

void px_c3_dw(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples, float *dW) {
#ifdef PX_C3_AVX2_VARIANT
  if (g->isa == PX_C3_AVX512) {
    px_c3_dw_avx512(g, x_p, C, dy_p, O, blk, n_samples, dW);
    return;
  }
  if (g->isa == PX_C3_AVX2) {
    px_c3_dw_avx2(g, x_p, C, dy_p, O, blk, n_samples, dW);
    return;
  }
#endif
  px_c3_dw_base(g, x_p, C, dy_p, O, blk, n_samples, dW);
}
