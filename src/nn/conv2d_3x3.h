// Direct 3×3 stride-1 padding-1 convolution kernels (conv2d_3x3.c), used by
// conv2d.c instead of im2col + GEMM for that shape.
#ifndef PX_NN_CONV2D_3X3_H
#define PX_NN_CONV2D_3X3_H

#include <stdbool.h>
#include <stddef.h>

// The copies of the kernels (conv2d_3x3_body.inc compiled once per
// instruction set), chosen once from cpuid: px_c3_geom records the one a
// layer's buffers are laid out for, and px_c3_conv / px_c3_dw call it.
enum { PX_C3_BASE, PX_C3_AVX2, PX_C3_AVX512 };

// One sample's planes in the padded flat layout: plane c holds the image
// with a zero border of one pixel, rows of Wp = W + 2 floats, then zeros up
// to PS floats.  Output pixel (h, w) is flat position q = h·Wp + w, and tap
// (i, j) of it reads the padded plane at q + i·Wp + j; positions with w ≥ W
// or q ≥ Q = H·Wp are computed and thrown away (or, in dW, meet zeros).
typedef struct px_c3 {
  int H, W, Wp;
  int isa, vl, ob;  /* the kernel copy (PX_C3_*), its floats per vector and output channels per block */
  size_t Q, Qr, PS; /* Qr: Q rounded up to a vector; PS: plane stride, a multiple of vl */
  size_t dy_lead;   /* floats before dy_p's first plane that align dW's loads of it (px_c3_dw) */
} px_c3;

// The geometry of an H × W plane for the kernel copy this CPU runs.
void px_c3_geom(int H, int W, px_c3 *g);
// xp (C, PS) = x (C, H, W) padded as above.
void px_c3_pad(const px_c3 *g, const float *x, int C, float *xp);
// Weights rearranged for px_c3_conv: blocks of g->ob output channels,
// [block][in channel][tap][ob], zeros past the last output channel.
size_t px_c3_wr_floats(const px_c3 *g, int out_c, int in_c);
// forward: out = O channels over in = C, taps as they are.
void px_c3_weights_fwd(const px_c3 *g, const float *Wt, int O, int C, float *wr);
// input gradient: out = C channels over in = O, taps flipped (Wt (O, C, 3, 3)).
void px_c3_weights_dx(const px_c3 *g, const float *Wt, int O, int C, float *wr);
// out[blk·ob .. +ob) (H, W) planes = bias + Σ_in Σ_tap wr · in_p, for block
// blk of out_c channels; in_p (in_c, PS) padded; tile: g->ob·Qr floats.
void px_c3_conv(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk, const float *bias,
                float *out, float *tile);
// dW[o][c][tap] += Σ_{n in [0, n_samples)} Σ_q dy_p[n][o][Wp + 1 + q] · x_p[n][c][q + off(tap)]
// for o in block blk (g->ob rows) of O; x_p (n, C, PS), dy_p (n, O, PS)
// padded; dW (O, C, 9).  Sums over q and the samples in registers, then
// adds each (o, c, tap) once: the order is fixed by the arguments alone.
// Fastest where dy_p lies g->dy_lead floats past a 64-byte boundary (its
// rows' loads are then aligned: on ResNet-20's layers with AVX-512, 1.2-1.3×
// faster than unaligned).
void px_c3_dw(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples, float *dW);

// The copies of px_c3_conv and px_c3_dw: for the compiler's default target
// (conv2d_3x3.c), for AVX2 + FMA (conv2d_3x3_avx2.c) and for AVX-512F + FMA
// (conv2d_3x3_avx512.c), the last two in a portable x86-64 build.
#define PX_C3_COPY(sfx)                                                                                          \
  void px_c3_conv_##sfx(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk,        \
                        const float *bias, float *out, float *tile);                                             \
  void px_c3_dw_##sfx(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples, \
                      float *dW);
PX_C3_COPY(base)
PX_C3_COPY(avx2)
PX_C3_COPY(avx512)
#undef PX_C3_COPY
// The kernels run at full speed here: a native build, or the AVX2 or
// AVX-512 copy on a CPU that has them (conv2d.c takes them by default only
// then).
bool px_c3_fast(void);
// The copy this CPU runs has 16-float vectors (AVX-512F): measured faster
// than im2col + GEMM at every channel count, not only up to 64.
bool px_c3_wide(void);

#endif
