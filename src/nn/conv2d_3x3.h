// Direct 3×3 stride-1 padding-1 convolution kernels (conv2d_3x3.c), used by
// conv2d.c instead of im2col + GEMM for that shape.
#ifndef PX_NN_CONV2D_3X3_H
#define PX_NN_CONV2D_3X3_H

#include <stdbool.h>
#include <stddef.h>

// Output channels per register block.
#define PX_C3_OB 4

// One sample's planes in the padded flat layout: plane c holds the image
// with a zero border of one pixel, rows of Wp = W + 2 floats, then zeros up
// to PS floats.  Output pixel (h, w) is flat position q = h·Wp + w, and tap
// (i, j) of it reads the padded plane at q + i·Wp + j; positions with w ≥ W
// or q ≥ Q = H·Wp are computed and thrown away (or, in dW, meet zeros).
typedef struct px_c3 {
  int H, W, Wp, nv; /* nv: vectors per chunk of the forward/dx kernel */
  size_t Q, Qr, PS; /* Qr: Q rounded up to the kernels' chunk; PS: plane stride */
} px_c3;

void px_c3_geom(int H, int W, px_c3 *g);
// xp (C, PS) = x (C, H, W) padded as above.
void px_c3_pad(const px_c3 *g, const float *x, int C, float *xp);
// Weights rearranged for px_c3_conv: blocks of PX_C3_OB output channels,
// [block][in channel][tap][PX_C3_OB], zeros past the last output channel.
size_t px_c3_wr_floats(int out_c, int in_c);
// forward: out = O channels over in = C, taps as they are.
void px_c3_weights_fwd(const float *Wt, int O, int C, float *wr);
// input gradient: out = C channels over in = O, taps flipped (Wt (O, C, 3, 3)).
void px_c3_weights_dx(const float *Wt, int O, int C, float *wr);
// out[blk·OB .. +OB) (H, W) planes = bias + Σ_in Σ_tap wr · in_p, for block
// blk of out_c channels; in_p (in_c, PS) padded; tile: PX_C3_OB·Qr floats.
void px_c3_conv(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk, const float *bias,
                float *out, float *tile);
// dW[o][c][tap] += Σ_{n in [0, n_samples)} Σ_q dy_p[n][o][Wp + 1 + q] · x_p[n][c][q + off(tap)]
// for o in block blk (PX_C3_OB rows) of O; x_p (n, C, PS), dy_p (n, O, PS)
// padded; dW (O, C, 9).  Sums over q and the samples in registers, then
// adds each (o, c, tap) once: the order is fixed by the arguments alone.
void px_c3_dw(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples, float *dW);

// The copies of px_c3_conv and px_c3_dw for the compiler's default target
// (conv2d_3x3.c) and for AVX2 + FMA (conv2d_3x3_avx2.c, in a portable x86-64
// build); px_c3_conv and px_c3_dw call one, chosen once from cpuid.
void px_c3_conv_base(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk,
                     const float *bias, float *out, float *tile);
void px_c3_dw_base(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples,
                   float *dW);
void px_c3_conv_avx2(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk,
                     const float *bias, float *out, float *tile);
void px_c3_dw_avx2(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples,
                   float *dW);
// The kernels run at full speed here: a native build, or the AVX2 + FMA
// copy on a CPU that has them (conv2d.c takes them by default only then).
bool px_c3_fast(void);

#endif
