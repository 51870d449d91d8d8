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
#include "tensor/internal.h"

#include <string.h>

// The vector helpers below are static and inlined: the ABI note gcc gives
// for 32-byte vector arguments on targets without AVX does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#define VL 8               /* floats per vector */
#define OB PX_C3_OB
// Input channels summed in registers before the partial sum goes to the
// tile: 64 channels = 576 terms.  One running sum over all of a 512-channel
// layer's 4608 terms measured 9× the error of the im2col + GEMM path
// (1.1e-5 against 1.3e-6 of the output's scale, float64 reference).
#define CB 64

typedef float v8 __attribute__((vector_size(VL * sizeof(float))));

static inline v8 ld(const float *p) {
  v8 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void st(float *p, v8 v) { memcpy(p, &v, sizeof v); }
static inline v8 splat(float s) { return (v8){s, s, s, s, s, s, s, s}; }

// Keeps a loaded vector in a register: without it gcc folds the load into
// every FMA that uses it (one load per FMA instead of one per vector).
#if defined(__GNUC__) && defined(__AVX__)  /* a ymm register holds a v8 */
#define PIN(v) __asm__("" : "+x"(v))
#else
#define PIN(v) ((void)0)
#endif

static size_t round_up(size_t a, size_t m) { return (a + m - 1) / m * m; }

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

size_t px_c3_wr_floats(int out_c, int in_c) {
  return (size_t)((out_c + OB - 1) / OB) * in_c * 9 * OB;
}

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

// fp-contract: a·b + c as one FMA where the target has it (ISO C mode turns
// contraction off by default).  The same binary always computes the same bits.
// The forward/dx kernel for NV vectors per chunk, twice (NV = 2, 3): the
// accumulators a[OB][NV] must have constant bounds to live in registers.
#define NV 2
#define CONV_NAME conv_nv2
#include "nn/conv2d_3x3_kernel.inc"
#undef NV
#undef CONV_NAME
#define NV 3
#define CONV_NAME conv_nv3
#include "nn/conv2d_3x3_kernel.inc"
#undef NV
#undef CONV_NAME

void px_c3_conv(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk,
                const float *bias, float *out, float *tile) {
  if (g->nv == 2) conv_nv2(g, in_p, in_c, wr, out_c, blk, bias, out, tile);
  else conv_nv3(g, in_p, in_c, wr, out_c, blk, bias, out, tile);
}

// Cloned as a static function: a cloned extern one gets an ifunc symbol
// that -fvisibility=hidden does not hide (the exported-symbols test).
__attribute__((optimize("fp-contract=fast"))) PX_KERNEL
static void dw_kernel(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples,
                      float *dW) {
  const ptrdiff_t Wp = g->Wp;
  const int o0 = blk * OB;
  const size_t xs = (size_t)C * g->PS, ys = (size_t)O * g->PS, Q8 = round_up(g->Q, VL);
  // Rows past O read row o0 (valid) and are not written.
  const float *dyr[OB];
  for (int r = 0; r < OB; r++) dyr[r] = dy_p + (size_t)(o0 + r < O ? o0 + r : o0) * g->PS + Wp + 1;
  for (int c = 0; c < C; c++)
    for (int i = 0; i < 3; i++) {
      v8 a[OB][3];
      for (int r = 0; r < OB; r++)
        for (int j = 0; j < 3; j++) a[r][j] = splat(0.0f);
      for (int n = 0; n < n_samples; n++) {
        const float *x = x_p + n * xs + (size_t)c * g->PS + i * Wp;
        const size_t dn = n * ys;
        for (size_t q = 0; q < Q8; q += VL) {
          v8 xv[3];
          for (int j = 0; j < 3; j++) {
            xv[j] = ld(x + q + j);
            PIN(xv[j]);
          }
          for (int r = 0; r < OB; r++) {
            v8 d = ld(dyr[r] + dn + q);
            PIN(d);
            for (int j = 0; j < 3; j++) a[r][j] += d * xv[j];
          }
        }
      }
      for (int r = 0; r < OB && o0 + r < O; r++)
        for (int j = 0; j < 3; j++) {
          float s = 0.0f;
          for (int l = 0; l < VL; l++) s += a[r][j][l];
          dW[((size_t)(o0 + r) * C + c) * 9 + i * 3 + j] += s;
        }
    }
}

void px_c3_dw(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples,
              float *dW) {
  dw_kernel(g, x_p, C, dy_p, O, blk, n_samples, dW);
}
