// Direct 3×3 convolution, stride 1 or 2, padding 1, with register blocking.
//
// Why: ResNet-20's layers (16–64 channels at 32×32 … 8×8) make im2col +
// GEMM GEMMs with M = 16..64 where OpenBLAS's packing, the im2col copy (9×
// the input), col2im and their memsets cost a third of the step (the perf
// profile: docs/PERFORMANCE.md, "Figures behind code comments").  These
// kernels read the input once per tap from a padded copy that stays in
// cache.
//
// Layout (conv2d_3x3.h): every plane padded by one zero pixel and stored flat
// with rows of Wr = W + 2, so tap (i, j) of output position q = h·Wr + w is
// the padded plane at q + i·Wr + j: a 1-D convolution over the flat plane,
// vectorized along q with no row edges.  The two extra columns per row (and
// the round-up of Q to a vector) are computed and discarded.  Stride 2
// splits the padded plane into its four phases (even/odd rows × even/odd
// columns), rows of Wr = Wo + 1: tap (i, j) then reads phase (i mod 2,
// j mod 2) at q + (i div 2)·Wr + (j div 2), and the same kernel runs with
// that offset table (off).
//
//   forward:  y[o]  = b[o] + Σ_c Σ_t W[o, c, t] · xp[c][q + off t]
//   dx:       dx[c] = Σ_o Σ_t W[o, c, 8 - t] · dyp[o][q + off t]        (stride 1: the same kernel, weights flipped)
//   dW:       dW[o, c, t] += Σ_q dyp[o][dy_at + q] · xp[c][q + off t]  (dy's zeros cancel the discarded q)
//
// dx at stride 2 is four convolutions of dy, one per phase (a, b) of the
// padded dx: a position of that phase, (2h' + a, 2w' + b), takes tap (i, j)
// exactly when i ≡ a and j ≡ b (mod 2), from dy[h' - i div 2][w' - j div 2];
// with dy laid out with a zero row above and a zero column on its left
// (px_c3_pad_dx2) those are offsets (1 - i div 2)·Wr + (1 - j div 2), so
// each phase is the same kernel with its 4, 2, 2 or 1 taps, and its planes
// are scattered back into dx.
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

// Floats per vector of a copy.
static int c3_vl(int isa) { return isa == PX_C3_AVX512 ? 16 : isa == PX_C3_AVX2 ? 8 : BASE_VL; }

// The shifted layout (conv2d_3x3.h) for a stride-1 H × W plane: where rows
// of W + 2 take at least SHIFT_GAIN_PCT % more vectors of vl floats than
// rows of W (8×8 at 16 floats: 5 against 4).  It holds three copies of the
// input, so it is taken only where it saves that much.  PX_CONV_SHIFTED=0
// or 1 turns it off or on for every stride-1 plane (tests, measurements).
#define SHIFT_GAIN_PCT 20
static bool c3_shifted(int H, int W, int vl) {
  const char *e = getenv("PX_CONV_SHIFTED");
  if (e && strcmp(e, "0") == 0) return false;
  if (e && strcmp(e, "1") == 0) return true;
  const size_t v = (size_t)vl, padded = ((size_t)H * (size_t)(W + 2) + v - 1) / v;
  const size_t tight = ((size_t)H * (size_t)W + v - 1) / v;
  return padded * 100 >= tight * (100 + SHIFT_GAIN_PCT);
}

void px_c3_geom(int H, int W, int stride, px_c3 *g) {
  memset(g, 0, sizeof *g);
  g->isa = c3_isa();
  g->vl = c3_vl(g->isa);
  g->ob = g->isa == PX_C3_AVX512 ? 8 : g->isa == PX_C3_AVX2 ? 4 : BASE_OB;
  const size_t vl = (size_t)g->vl;
  g->H = H;
  g->W = W;
  g->stride = stride == 2 ? 2 : 1;
  if (g->stride == 1) {
    g->Ho = H;
    g->Wo = W;
    g->shifted = c3_shifted(H, W, g->vl);
    g->Wr = g->shifted ? W : W + 2;
  } else {
    g->Ho = (H - 1) / 2 + 1;
    g->Wo = (W - 1) / 2 + 1;
    g->Wr = g->Wo + 1;
  }
  const ptrdiff_t Wr = g->Wr;
  g->Q = (size_t)g->Ho * (size_t)Wr;
  // The forward kernel's chunks: 3 vectors, then the 1 or 2 left.
  g->Qr = round_up(g->Q, vl);
  if (g->shifted) {
    // Copy j is read at q + i·Wr (i ≤ 2) for q < Qr, and dW reads dy's
    // copy 1 at PSq + Wr + q.
    size_t need = g->Qr + 2 * (size_t)Wr, img = (size_t)(H + 2) * (size_t)Wr;
    g->PSq = round_up(need > img ? need : img, vl);
    g->PS = 3 * g->PSq;
    for (int t = 0; t < 9; t++) g->off[t] = (ptrdiff_t)((t % 3) * g->PSq) + (t / 3) * Wr;
    g->dy_at = g->PSq + (size_t)Wr;
    g->dy_ps = g->PS;
  } else if (g->stride == 1) {
    size_t need = g->Qr + 2 * (size_t)Wr + 2, img = (size_t)(H + 2) * (size_t)Wr;
    g->PS = round_up(need > img ? need : img, vl);
    for (int t = 0; t < 9; t++) g->off[t] = (t / 3) * Wr + t % 3;
    g->dy_at = (size_t)Wr + 1;
    g->dy_ps = g->PS;
  } else {
    // A phase plane: (Ho + 1) rows of Wr; the taps read up to Wr + 1 past q.
    size_t need = g->Qr + (size_t)Wr + 1, img = (size_t)(g->Ho + 1) * (size_t)Wr;
    g->PSq = round_up(need > img ? need : img, vl);
    g->PS = 4 * g->PSq;
    for (int t = 0; t < 9; t++) {
      const int i = t / 3, j = t % 3;
      g->off[t] = (ptrdiff_t)(((i & 1) * 2 + (j & 1)) * g->PSq) + (i >> 1) * Wr + (j >> 1);
    }
    g->dy_at = 0;
    g->dy_ps = g->Qr;
    // dx: each phase of the padded dx has (Ho + 1) rows of Wr positions;
    // dy in the dx2 layout has Ho + 2 rows of Wr, read up to Wr + 1 past q.
    g->dx_Qr = round_up((size_t)(g->Ho + 1) * (size_t)Wr, vl);
    need = g->dx_Qr + (size_t)Wr + 1;
    img = (size_t)(g->Ho + 2) * (size_t)Wr;
    g->dx_ps = round_up(need > img ? need : img, vl);
    for (int ph = 0; ph < 4; ph++) {
      const int a = ph >> 1, b = ph & 1;
      int k = 0;
      for (int i = a; i < 3; i += 2)
        for (int j = b; j < 3; j += 2) {
          g->dx_tap[ph][k] = 3 * i + j;
          g->dx_off[ph][k] = (1 - (i >> 1)) * Wr + (1 - (j >> 1));
          k++;
        }
      g->dx_nt[ph] = k;
    }
  }
  g->dy_lead = (vl - g->dy_at % vl) % vl;
}

// A plane's rows are short (7 to 56 floats on ResNet's layers), and a call
// to glibc's memcpy for each costs its call and size dispatch: memmove was
// 2.3 % of a ResNet-20 step (perf, Xeon with AVX-512, 2026-12-02), the
// same copies inline 1.7 % (the pads and the outputs' crop); on the zoo
// CNN's 28-float rows 10.6 % before, 10.2 % inline.  An inline loop,
// vectorized; ROW_COPIES on its callers keeps gcc from turning the loop
// back into the call.
#define ROW_COPIES __attribute__((optimize("no-tree-loop-distribute-patterns")))
ROW_COPIES static inline void copy_row(float *restrict d, const float *restrict s, int n) {
  for (int i = 0; i < n; i++) d[i] = s[i];
}

ROW_COPIES void px_c3_pad(const px_c3 *g, const float *x, int C, float *xp) {
  const int H = g->H, W = g->W, Wr = g->Wr;
  if (g->stride == 2) {
    // Padded row Y = y + 1 goes to phase row (Y mod 2, Y div 2); of its
    // columns X = x + 1, the odd x (even X) to phase column 0 at X/2 ≥ 1, the
    // even x to phase column 1 at x/2.  Rows and columns past the image: zeros.
    const int Hq = g->Ho + 1, n_odd = W / 2, n_even = (W + 1) / 2;
    for (int c = 0; c < C; c++) {
      const float *s = x + (size_t)c * H * W;
      float *base = xp + (size_t)c * g->PS;
      for (int a = 0; a < 2; a++)
        for (int h = 0; h < Hq; h++) {
          float *r0 = base + (size_t)(2 * a) * g->PSq + (size_t)h * Wr;
          float *r1 = base + (size_t)(2 * a + 1) * g->PSq + (size_t)h * Wr;
          const int y = 2 * h + a - 1;
          if (y < 0 || y >= H) {
            memset(r0, 0, (size_t)Wr * sizeof *r0);
            memset(r1, 0, (size_t)Wr * sizeof *r1);
            continue;
          }
          const float *sr = s + (size_t)y * W;
          r0[0] = 0.0f;
          for (int w = 0; w < n_odd; w++) r0[1 + w] = sr[2 * w + 1];
          for (int w = 1 + n_odd; w < Wr; w++) r0[w] = 0.0f;
          for (int w = 0; w < n_even; w++) r1[w] = sr[2 * w];
          for (int w = n_even; w < Wr; w++) r1[w] = 0.0f;
        }
      const size_t done = (size_t)Hq * Wr;
      for (int ph = 0; ph < 4; ph++) memset(base + (size_t)ph * g->PSq + done, 0, (g->PSq - done) * sizeof(float));
    }
    return;
  }
  if (g->shifted) {
    // Copy j's row r + 1 is image row r from column j - 1: copy 0 starts
    // with a zero, copy 2 ends with one; rows 0 and H + 1 and the rest zero.
    const size_t done = (size_t)(H + 1) * Wr;
    for (int c = 0; c < C; c++) {
      const float *s = x + (size_t)c * H * W;
      for (int j = 0; j < 3; j++) {
        float *p = xp + (size_t)c * g->PS + (size_t)j * g->PSq;
        memset(p, 0, (size_t)Wr * sizeof *p);
        for (int h = 0; h < H; h++) {
          float *row = p + (size_t)(h + 1) * Wr;
          const float *sr = s + (size_t)h * W;
          if (j == 1) {
            copy_row(row, sr, W);
          } else if (j == 0) {
            row[0] = 0.0f;
            copy_row(row + 1, sr, W - 1);
          } else {
            copy_row(row, sr + 1, W - 1);
            row[W - 1] = 0.0f;
          }
        }
        memset(p + done, 0, (g->PSq - done) * sizeof *p);
      }
    }
    return;
  }
  for (int c = 0; c < C; c++) {
    float *p = xp + (size_t)c * g->PS;
    const float *s = x + (size_t)c * H * W;
    memset(p, 0, (size_t)(Wr + 1) * sizeof *p);  // top border row and the first left border
    for (int h = 0; h < H; h++) {
      float *row = p + (size_t)(h + 1) * Wr + 1;
      copy_row(row, s + (size_t)h * W, W);
      row[W] = 0.0f;      // right border
      row[W + 1] = 0.0f;  // next row's left border
    }
    const size_t done = (size_t)(H + 1) * Wr + 1;
    memset(p + done, 0, (g->PS - done) * sizeof *p);
  }
}

ROW_COPIES void px_c3_pad_dy(const px_c3 *g, const float *dy, int O, float *dyp) {
  if (g->stride == 1) {
    px_c3_pad(g, dy, O, dyp);
    return;
  }
  const int Ho = g->Ho, Wo = g->Wo, Wr = g->Wr;
  for (int o = 0; o < O; o++) {
    float *p = dyp + (size_t)o * g->dy_ps;
    const float *s = dy + (size_t)o * Ho * Wo;
    for (int h = 0; h < Ho; h++) {
      copy_row(p + (size_t)h * Wr, s + (size_t)h * Wo, Wo);
      p[(size_t)h * Wr + Wo] = 0.0f;
    }
    memset(p + g->Q, 0, (g->dy_ps - g->Q) * sizeof *p);
  }
}

ROW_COPIES void px_c3_pad_dx2(const px_c3 *g, const float *dy, int O, float *dyq) {
  const int Ho = g->Ho, Wo = g->Wo, Wr = g->Wr;
  for (int o = 0; o < O; o++) {
    float *p = dyq + (size_t)o * g->dx_ps;
    const float *s = dy + (size_t)o * Ho * Wo;
    memset(p, 0, (size_t)Wr * sizeof *p);  // the zero row above
    for (int h = 0; h < Ho; h++) {
      float *row = p + (size_t)(h + 1) * Wr;
      row[0] = 0.0f;  // the zero column on the left
      copy_row(row + 1, s + (size_t)h * Wo, Wo);
    }
    const size_t done = (size_t)(Ho + 1) * Wr;
    memset(p + done, 0, (g->dx_ps - done) * sizeof *p);
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

// A block's ob input channels are 9·ob floats in a row of Wt for each o:
// read in order, written transposed (the loop over (tap, row) that read
// them 9 floats apart took 5.8 % of the 512-channel 7×7 layer's forward
// and backward against 4.3 %: docs/PERFORMANCE.md, "Figures behind code
// comments").
void px_c3_weights_dx(const px_c3 *g, const float *Wt, int O, int C, float *wr) {
  const int ob = g->ob, blocks = (C + ob - 1) / ob;
  for (int b = 0; b < blocks; b++)
    for (int o = 0; o < O; o++) {
      float *d = wr + ((size_t)b * O + o) * 9 * ob;
      const float *s = Wt + ((size_t)o * C + (size_t)b * ob) * 9;
      for (int r = 0; r < ob; r++) {
        if (b * ob + r < C)
          for (int t = 0; t < 9; t++) d[t * ob + r] = s[r * 9 + 8 - t];
        else
          for (int t = 0; t < 9; t++) d[t * ob + r] = 0.0f;
      }
    }
}

void px_c3_weights_dx2(const px_c3 *g, const float *Wt, int O, int C, int ph, float *wr) {
  const int ob = g->ob, blocks = (C + ob - 1) / ob, nt = g->dx_nt[ph];
  for (int b = 0; b < blocks; b++)
    for (int o = 0; o < O; o++)
      for (int k = 0; k < nt; k++)
        for (int r = 0; r < ob; r++) {
          const int c = b * ob + r;
          wr[(((size_t)b * O + o) * nt + k) * ob + r] = c < C ? Wt[((size_t)o * C + c) * 9 + g->dx_tap[ph][k]] : 0.0f;
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

bool px_c3_wide(void) { return c3_vl(c3_isa()) == 16; }

#define C3_NONE "im2col + GEMM (cpuid: no avx2+fma; direct 3x3 only with PX_CONV_DIRECT=1)"
// Where the direct kernels run, the stride-1 layers that conv2d.c's rule
// picks go through Winograd (PX_CONV_WINOGRAD=0: none, =1: all of them).
#define W4_ON " + winograd f(4x4,3x3) (stride 1, >= 16 channels, >= 14x14)"
#define W4_ALL " + winograd f(4x4,3x3) (every stride-1 layer: PX_CONV_WINOGRAD=1)"
#define W4_INFO(direct) \
  (w4 == 0 ? direct " (winograd off: PX_CONV_WINOGRAD=0)" : w4 == 2 ? direct W4_ALL : direct W4_ON)
const char *px_conv_kernel_info(void) {
  const char *e = getenv("PX_CONV_WINOGRAD");
  const int w4 = e && strcmp(e, "0") == 0 ? 0 : e && strcmp(e, "1") == 0 ? 2 : 1;
  (void)w4;
#if defined(PX_C3_AVX2_VARIANT)
  const int isa = c3_isa();
  return isa == PX_C3_AVX512 ? W4_INFO("direct 3x3 avx512f+fma (cpuid)")
    : isa == PX_C3_AVX2      ? W4_INFO("direct 3x3 avx2+fma (cpuid)")
                             : C3_NONE;
#elif defined(PX_NATIVE_BUILD)
  return BASE_VL == 16 ? W4_INFO("direct 3x3 native avx512 (-march=native)")
                       : W4_INFO("direct 3x3 native (-march=native)");
#elif defined(__x86_64__) && !defined(__AVX2__)
  return C3_NONE;
#else
  return W4_INFO("direct 3x3 (compiler default target)");
#endif
}

// Calls the copy of kernel fn for the instruction set isa (PX_C3_*): the
// AVX-512 and AVX2 copies exist in a portable x86-64 build only.
#ifdef PX_C3_AVX2_VARIANT
#define C3_CALL(isa, fn, ...)                         \
  ((isa) == PX_C3_AVX512   ? fn##_avx512(__VA_ARGS__) \
     : (isa) == PX_C3_AVX2 ? fn##_avx2(__VA_ARGS__)   \
                           : fn##_base(__VA_ARGS__))
#else
#define C3_CALL(isa, fn, ...) ((void)(isa), fn##_base(__VA_ARGS__))
#endif

static void c3_run(const px_c3 *g, const px_c3_pass *p, int blk, float *tile) {
  C3_CALL(g->isa, px_c3_run, p, blk, tile);
}

void px_c3_conv_part(const px_c3 *g, const float *in_p, int in_c, int c_lo, int c_hi, const float *wr, int out_c,
                     int blk, const float *bias, float *tile) {
  px_c3_pass p = {.in = in_p,
                  .in_ps = g->PS,
                  .in_c = in_c,
                  .nt = 9,
                  .out_c = out_c,
                  .wr = wr,
                  .bias = bias,
                  .c_lo = c_lo,
                  .c_hi = c_hi,
                  .Qr = g->Qr};
  memcpy(p.off, g->off, sizeof p.off);
  c3_run(g, &p, blk, tile);
}

ROW_COPIES void px_c3_conv(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk,
                           const float *bias, float *out, float *tile) {
  px_c3_conv_part(g, in_p, in_c, 0, in_c, wr, out_c, blk, bias, tile);
  px_c3_tile_out(g, tile, out_c, blk, out);
}

ROW_COPIES void px_c3_tile_out(const px_c3 *g, const float *tile, int out_c, int blk, float *out) {
  const int Ho = g->Ho, Wo = g->Wo, Wr = g->Wr, o0 = blk * g->ob;
  for (int r = 0; r < g->ob && o0 + r < out_c; r++) {
    float *y = out + (size_t)(o0 + r) * Ho * Wo;
    const float *s = tile + (size_t)r * g->Qr;
    for (int h = 0; h < Ho; h++) copy_row(y + (size_t)h * Wo, s + (size_t)h * Wr, Wo);
  }
}

void px_c3_dx2(const px_c3 *g, const float *dyq, int O, const float *const wr[4], int C, int blk, float *dx,
               float *tile) {
  const int H = g->H, W = g->W, Wr = g->Wr, Hq = g->Ho + 1, c0 = blk * g->ob;
  for (int ph = 0; ph < 4; ph++) {
    px_c3_pass p = {.in = dyq,
                    .in_ps = g->dx_ps,
                    .in_c = O,
                    .nt = g->dx_nt[ph],
                    .out_c = C,
                    .wr = wr[ph],
                    .bias = NULL,
                    .c_lo = 0,
                    .c_hi = O,
                    .Qr = g->dx_Qr};
    for (int k = 0; k < p.nt; k++) p.off[k] = g->dx_off[ph][k];
    c3_run(g, &p, blk, tile);
    // Phase (a, b) position (h', w') is the padded dx's (2h' + a, 2w' + b):
    // dx's (2h' + a - 1, 2w' + b - 1) where that lies inside.
    const int a = ph >> 1, b = ph & 1;
    for (int r = 0; r < g->ob && c0 + r < C; r++) {
      float *d = dx + (size_t)(c0 + r) * H * W;
      const float *s = tile + (size_t)r * g->dx_Qr;
      for (int h = 0; h < Hq; h++) {
        const int y = 2 * h + a - 1;
        if (y < 0 || y >= H) continue;
        float *dr = d + (size_t)y * W;
        const float *sr = s + (size_t)h * Wr;
        if (b == 0)  // x = 2w - 1: the odd columns, w from 1
          for (int w = 0; w < W / 2; w++) dr[2 * w + 1] = sr[w + 1];
        else  // x = 2w: the even columns
          for (int w = 0; w < (W + 1) / 2; w++) dr[2 * w] = sr[w];
      }
    }
  }
}

void px_c3_dw(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples, float *dW) {
  C3_CALL(g->isa, px_c3_dw, g, x_p, C, dy_p, O, blk, n_samples, dW);
}

// Winograd F(4×4, 3×3) (Lavin & Gray, "Fast Algorithms for Convolutional
// Neural Networks", 2016): a 4×4 tile of output from its 6×6 input patch d as
//   y = Aᵀ [U ⊙ V] A,   U = G w Gᵀ (6×6 per (out, in) pair),   V = Bᵀ d B,
// 36 multiplies per tile and pair where the direct sum takes 144.  Summed
// over the input channels, element ξ of the 6×6 is one matrix product
// M_ξ = U_ξ · V_ξ ((out × in) · (in × tiles)).  The weight gradient is
// its adjoint: dU_ξ = Σ_tiles (A dY Aᵀ)_ξ · V_ξ ((out × tiles) · (tiles ×
// in)), dw = Gᵀ dU G.  The transforms and the products are in
// conv2d_w4_body.inc.
//   G = [¼ 0 0; -⅙ -⅙ -⅙; -⅙ ⅙ -⅙; 1/24 1/12 ⅙; 1/24 -1/12 ⅙; 0 0 1]
void px_w4_geom(int H, int W, int ns, px_w4 *g) {
  memset(g, 0, sizeof *g);
  g->isa = c3_isa();
  g->vl = c3_vl(g->isa);
  g->ob = g->isa == PX_C3_AVX512 ? 8 : g->isa == PX_C3_AVX2 ? 4 : BASE_OB;
  g->H = H;
  g->W = W;
  g->ns = ns < 1 ? 1 : ns;
  // Every sample starts on a tile row (RS a multiple of 4), so its tiles,
  // and the rounding of each output, are the same in any group.
  g->RS = (H + 2 + 3) / 4 * 4;
  const int Ht = g->ns * g->RS - 2;
  g->ty = (Ht + 3) / 4;
  g->tx = (W + 3) / 4;
  g->Wq = g->tx + 1;
  g->Q = (size_t)g->ty * (size_t)g->Wq;
  g->Qr = round_up(g->Q, (size_t)g->vl);
  // The patches read up to Wq + 1 past q; the planes hold ty + 1 rows.
  const size_t need = g->Qr + (size_t)g->Wq + 1, img = (size_t)(g->ty + 1) * (size_t)g->Wq;
  g->PSq = round_up(need > img ? need : img, (size_t)g->vl);
  g->PS = 16 * g->PSq;
}

size_t px_w4_u_floats(const px_w4 *g, int out_c, int in_c) {
  return 36 * (size_t)((out_c + g->ob - 1) / g->ob) * in_c * g->ob;
}

static const float W4_G[6][3] = {{0.25f, 0.0f, 0.0f},
                                 {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                                 {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                                 {1.0f / 24, 1.0f / 12, 1.0f / 6},
                                 {1.0f / 24, -1.0f / 12, 1.0f / 6},
                                 {0.0f, 0.0f, 1.0f}};

// Per input channel: the block's ob rows side by side, so each step of
// the transform is one loop over r the compiler vectorizes.
void px_w4_weights(const px_w4 *g, const float *Wt, int O, int C, bool dx, int b, float *U) {
  enum { OBM = 16 }; /* the widest block */
  const int ob = g->ob, out_c = dx ? C : O, in_c = dx ? O : C, blocks = (out_c + ob - 1) / ob;
  const size_t per = (size_t)blocks * in_c * ob;
  for (int c = 0; c < in_c; c++) {
    float w[9][OBM], gw[6][3][OBM];
    for (int r = 0; r < ob; r++) {
      const int o = b * ob + r;
      for (int t = 0; t < 9; t++)
        w[t][r] = o >= out_c ? 0.0f : dx ? Wt[((size_t)c * C + o) * 9 + (8 - t)] : Wt[((size_t)o * C + c) * 9 + t];
    }
    for (int a = 0; a < 6; a++)
      for (int j = 0; j < 3; j++)
        for (int r = 0; r < ob; r++)
          gw[a][j][r] = W4_G[a][0] * w[j][r] + W4_G[a][1] * w[3 + j][r] + W4_G[a][2] * w[6 + j][r];
    float *u = U + ((size_t)b * in_c + c) * ob;
    for (int a = 0; a < 6; a++)
      for (int k = 0; k < 6; k++) {
        float *d = u + (size_t)(6 * a + k) * per;
        for (int r = 0; r < ob; r++)
          d[r] = gw[a][0][r] * W4_G[k][0] + gw[a][1][r] * W4_G[k][1] + gw[a][2][r] * W4_G[k][2];
      }
  }
}

size_t px_w4_scratch(const px_w4 *g, int in_c, int out_c) {
  const size_t wch = 3 * (size_t)g->vl;
  const size_t mc_blocks = px_w4_wide(g->vl, in_c) ? (size_t)(out_c + g->ob - 1) / (size_t)g->ob : 1;
  return 36 * (size_t)in_c * wch + 36 * mc_blocks * (size_t)g->ob * wch + 16 * (size_t)out_c * g->Qr;
}

void px_w4_pad(const px_w4 *g, const float *x, size_t in_ss, int ns, int C, float *xp) {
  C3_CALL(g->isa, px_w4_pad, g, x, in_ss, ns, C, xp);
}

void px_w4_sample(const px_w4 *g, const float *xp, int in_c, const float *U, int out_c, const float *bias, float *out,
                  size_t out_ss, int ns, float *scratch) {
  C3_CALL(g->isa, px_w4_sample, g, xp, in_c, U, out_c, bias, out, out_ss, ns, scratch);
}

size_t px_w4_du_floats(int out_c, int in_c) { return 36 * px_w4_rows(out_c) * px_w4_rows(in_c); }

// As many vectors of tiles as a group has, up to DW_CHUNK_MAX, where the
// chunk's transforms (36 × (in + out channels) × the vectors) fit in
// DW_CHUNK_FLOATS: each block of accumulators sums its lanes once a
// chunk, so longer chunks sum them less often; past L2 the products reload
// the transforms from L3.
#define DW_CHUNK_FLOATS ((size_t)1024 << 10) /* 4 MB */
#define DW_CHUNK_MIN 6
#define DW_CHUNK_MAX 16
int px_w4_dw_chunk(const px_w4 *g, int in_c, int out_c) {
  const size_t per = 36 * (px_w4_rows(in_c) + px_w4_rows(out_c)) * (size_t)g->vl;
  size_t n = DW_CHUNK_FLOATS / per, group = g->Qr / (size_t)g->vl;
  if (n > DW_CHUNK_MAX) n = DW_CHUNK_MAX;
  if (n > group) n = group;
  return n < DW_CHUNK_MIN ? DW_CHUNK_MIN : (int)n;
}

size_t px_w4_dw_scratch(const px_w4 *g, int in_c, int out_c) {
  /* the 36 sets of V and of M a cache line apart */
  const size_t v = (size_t)px_w4_dw_chunk(g, in_c, out_c) * (size_t)g->vl;
  return 36 * ((px_w4_rows(in_c) + px_w4_rows(out_c)) * v + 32);
}

void px_w4_dw(const px_w4 *g, const float *xp, int in_c, const float *dp, int out_c, int ns, float *dU,
              float *scratch) {
  C3_CALL(g->isa, px_w4_dw, g, xp, in_c, dp, out_c, ns, dU, scratch);
}

// dw = Gᵀ dU G: (Gᵀ dU)[i][b] = Σ_a G[a][i] dU[a][b], then dw[i][j] =
// Σ_b (Gᵀ dU)[i][b] G[b][j]; 16 input channels side by side (dU's rows
// hold them in a row), so each step is one loop the compiler vectorizes.
void px_w4_dw_weights(const float *dU, int out_c, int in_c, float *dW) {
  enum { L = 16 };
  const size_t Cp = px_w4_rows(in_c), xs = px_w4_rows(out_c) * Cp;
  for (int o = 0; o < out_c; o++)
    for (int c0 = 0; c0 < in_c; c0 += L) {
      const int n = in_c - c0 < L ? in_c - c0 : L;
      const float *u = dU + (size_t)o * Cp + (size_t)c0;
      float gu[3][6][L], w[9][L];
      for (int i = 0; i < 3; i++)
        for (int b = 0; b < 6; b++) {
          float *d = gu[i][b];
          for (int l = 0; l < L; l++) d[l] = 0.0f;
          for (int a = 0; a < 6; a++) {
            const float ga = W4_G[a][i], *r = u + (size_t)(6 * a + b) * xs;
#pragma omp simd
            for (int l = 0; l < n; l++) d[l] += ga * r[l];
          }
        }
      for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
          float *d = w[3 * i + j];
          for (int l = 0; l < L; l++) d[l] = 0.0f;
          for (int b = 0; b < 6; b++) {
            const float gb = W4_G[b][j];
#pragma omp simd
            for (int l = 0; l < L; l++) d[l] += gu[i][b][l] * gb;
          }
        }
      for (int l = 0; l < n; l++)
        for (int t = 0; t < 9; t++) dW[((size_t)o * in_c + (size_t)(c0 + l)) * 9 + t] += w[t][l];
    }
}
