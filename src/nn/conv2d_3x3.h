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

// One sample's planes in the padded flat layout.  Stride 1: plane c holds
// the image with a zero border of one pixel, rows of Wr = W + 2 floats,
// then zeros up to PS floats; output pixel (h, w) is flat position
// q = h·Wr + w, and tap (i, j) of it reads the plane at q + i·Wr + j.
// Stride 2: channel c holds the padded image's four phase planes (even or
// odd rows × even or odd columns), each (Ho + 1) rows of Wr = Wo + 1
// floats and PSq floats long (PS = 4·PSq); output pixel (h, w) is
// q = h·Wr + w, and tap (i, j) reads phase (i mod 2, j mod 2) at q +
// (i div 2)·Wr + (j div 2): the same 1-D form, with other offsets (off).
// Either way positions with w ≥ Wo or q ≥ Q = Ho·Wr are computed and thrown
// away (or, in dW, meet zeros).
// Stride 1, shifted (where the two border columns would cost a fifth or
// more of the vectors: px_c3_geom): channel c holds three copies of the
// image with a zero row above and below, rows of Wr = W with no border
// columns, copy j shifted so that its (r, w) is the padded image's (r,
// w + j), each PSq floats long (PS = 3·PSq); tap (i, j) reads copy j at
// q + i·Wr.  Every computed position below Q = Ho·W is kept: an 8×8 plane
// is 4 vectors of 16 instead of 5.
typedef struct px_c3 {
  int H, W, stride;
  bool shifted;        /* stride 1 in the three shifted copies above */
  int Ho, Wo, Wr;      /* output plane; Wr: row stride of the flat layout */
  int isa, vl, ob;     /* the kernel copy (PX_C3_*), its floats per vector and output channels per block */
  size_t Q, Qr, PS;    /* Qr: Q rounded up to a vector; PS: a channel's floats, a multiple of vl */
  size_t PSq;          /* stride 2: one phase plane's floats; shifted: one copy's */
  ptrdiff_t off[9];    /* tap 3i + j reads position q + off[3i + j] of its channel */
  size_t dy_at, dy_ps; /* dW's dy: position q at dy_at of a plane, planes dy_ps apart */
  size_t dy_lead;      /* floats before dy_p's first plane that align dW's loads of it (px_c3_dw) */
  // Stride 2, dx: four convolutions of dy (dx2 layout: a zero row above and
  // below, a zero column on the left, rows of Wr, planes dx_ps apart), one
  // per phase of the padded dx, each over (Ho + 1)·Wr positions (dx_Qr
  // rounded up), with the taps of that phase (dx_nt of them: 4, 2, 2, 1).
  size_t dx_ps, dx_Qr;
  int dx_nt[4], dx_tap[4][4];
  ptrdiff_t dx_off[4][4];
} px_c3;

// The geometry of an H × W plane (stride 1 or 2, padding 1) for the kernel
// copy this CPU runs.
void px_c3_geom(int H, int W, int stride, px_c3 *g);
// xp (C, PS) = x (C, H, W) padded (stride 1, shifted or not) or split into
// phases (stride 2) as above.
void px_c3_pad(const px_c3 *g, const float *x, int C, float *xp);
// dy (O, Ho, Wo) laid out for px_c3_dw: stride 1, padded like x (dy_ps = PS,
// dy_at = Wr + 1, shifted PSq + Wr: the unshifted copy's first image row;
// the same planes also feed dx); stride 2, rows of Wr with a
// zero column, zeros after them (dy_at = 0).
void px_c3_pad_dy(const px_c3 *g, const float *dy, int O, float *dyp);
// Stride 2: dy (O, Ho, Wo) in the dx2 layout (dx_ps floats a plane).
void px_c3_pad_dx2(const px_c3 *g, const float *dy, int O, float *dyq);
// Weights rearranged for px_c3_conv: blocks of g->ob output channels,
// [block][in channel][tap][ob], zeros past the last output channel.
size_t px_c3_wr_floats(const px_c3 *g, int out_c, int in_c);
// forward: out = O channels over in = C, taps as they are.
void px_c3_weights_fwd(const px_c3 *g, const float *Wt, int O, int C, float *wr);
// input gradient, stride 1: out = C channels over in = O, taps flipped (Wt (O, C, 3, 3)).
void px_c3_weights_dx(const px_c3 *g, const float *Wt, int O, int C, float *wr);
// input gradient, stride 2: phase ph's taps, [block of C][o][k < dx_nt[ph]][ob];
// px_c3_wr_floats(g, C, O) floats hold any phase's.
void px_c3_weights_dx2(const px_c3 *g, const float *Wt, int O, int C, int ph, float *wr);
// out[blk·ob .. +ob) (Ho, Wo) planes = bias + Σ_in Σ_tap wr · in_p, for block
// blk of out_c channels; in_p (in_c, PS) padded; tile: g->ob·Qr floats.
void px_c3_conv(const px_c3 *g, const float *in_p, int in_c, const float *wr, int out_c, int blk, const float *bias,
                float *out, float *tile);
// px_c3_conv in parts: px_c3_conv_part sums input channels [c_lo, c_hi)
// into the tile (the first part, c_lo = 0, starts it from the bias; c_lo
// and c_hi are multiples of PX_C3_CB or in_c), px_c3_tile_out copies the
// finished tile out.  Parts called in order of c_lo give px_c3_conv's bits:
// the kernel sums PX_C3_CB channels at a time into the tile either way.
#define PX_C3_CB 64
void px_c3_conv_part(const px_c3 *g, const float *in_p, int in_c, int c_lo, int c_hi, const float *wr, int out_c,
                     int blk, const float *bias, float *tile);
void px_c3_tile_out(const px_c3 *g, const float *tile, int out_c, int blk, float *out);
// Stride 2: dx's channels blk·ob .. of C (H, W) planes from dyq (O, dx_ps)
// and the four phases' weights; tile: g->ob·dx_Qr floats.
void px_c3_dx2(const px_c3 *g, const float *dyq, int O, const float *const wr[4], int C, int blk, float *dx,
               float *tile);
// dW[o][c][tap] += Σ_{n in [0, n_samples)} Σ_q dy_p[n][o][dy_at + q] · x_p[n][c][q + off(tap)]
// for o in block blk (g->ob rows) of O; x_p (n, C, PS) from px_c3_pad, dy_p
// (n, O, dy_ps) from px_c3_pad_dy; dW (O, C, 9).  Sums over q and the samples
// in registers, then adds each (o, c, tap) once: the order is fixed by the
// arguments alone.  Fastest where dy_p lies g->dy_lead floats past a 64-byte
// boundary (its rows' loads are then aligned: on ResNet-20's layers with
// AVX-512, 1.2-1.3× faster than unaligned).
void px_c3_dw(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples, float *dW);

// Winograd F(4×4, 3×3) for stride-1 padding-1 layers (conv2d_3x3.c,
// "Winograd").  ns samples of H × W are stacked into one tall plane, RS =
// H + 2 rounded up to a multiple of 4 rows a sample (at least two zero rows
// between samples, and each sample's first row on a tile's), of 4×4 output
// tiles, ty × tx of them; tile (i, j) is flat index q = i·Wq + j of 16
// phase planes (a, b) of the padded tall plane, P[4·Yq + a][4·Xq + b] at
// Yq·Wq + Xq (Wq = tx + 1 columns, ty + 1 rows, PSq floats a plane, PS =
// 16·PSq a channel).
typedef struct px_w4 {
  int H, W, ns, RS, ty, tx, Wq;
  int isa, vl, ob;       /* the kernel copy, as px_c3 */
  size_t Q, Qr, PSq, PS; /* Q = ty·Wq tile positions, Qr rounded up to a vector */
} px_w4;
// The geometry for up to ns samples of H × W at a time.
void px_w4_geom(int H, int W, int ns, px_w4 *g);
// Floats of the transformed weights: 36 sets of blocks of ob output channels.
size_t px_w4_u_floats(const px_w4 *g, int out_c, int in_c);
// U = G w Gᵀ of every (out, in) pair of block b of output channels (one
// call a block), U [ξ][block][in][ob]: forward (dx false) out = O over
// in = C; dx true: out = C over in = O with the taps flipped (the input
// gradient of a stride-1 layer).
void px_w4_weights(const px_w4 *g, const float *Wt, int O, int C, bool dx, int b, float *U);
// ns ≤ g->ns samples of x (C, H, W each, in_ss floats apart) into xp (C
// channels of PS floats), which must start zeroed: only the images'
// positions are written, the rest stays zero between calls (the slots of
// absent samples, ns .. g->ns - 1, are zeroed).
void px_w4_pad(const px_w4 *g, const float *x, size_t in_ss, int ns, int C, float *xp);
// px_w4_sample's order for in_c input channels: true where the 36
// transformed inputs of a chunk of tiles (36 · in_c · 3 vectors) outgrow
// PX_W4_WIDE_BYTES, so that each block of outputs re-read them from L3.
#define PX_W4_WIDE_BYTES ((size_t)1 << 19)
static inline bool px_w4_wide(int vl, int in_c) {
  return 36 * (size_t)in_c * 3 * (size_t)vl * sizeof(float) > PX_W4_WIDE_BYTES;
}
// Floats of scratch px_w4_sample needs (a thread's own).
size_t px_w4_scratch(const px_w4 *g, int in_c, int out_c);
// ns samples (out_ss floats apart): out (out_c, H, W) = bias + conv(x, w)
// from xp (px_w4_pad of in_c channels) and U.
void px_w4_sample(const px_w4 *g, const float *xp, int in_c, const float *U, int out_c, const float *bias, float *out,
                  size_t out_ss, int ns, float *scratch);
// The weight gradient: dU += Σ over the tiles of ns ≤ g->ns samples of
// (A dY Aᵀ) ⊙ (Bᵀ d B), xp from px_w4_pad of their input (in_c channels),
// dp from px_w4_pad of their output gradient (out_c channels); dU [36]
// [out_c rounded up to 4][in_c rounded up to 4] (px_w4_du_floats), each
// element's sum in an order fixed by the shapes and ns.  scratch:
// px_w4_dw_scratch floats (a thread's own).
size_t px_w4_du_floats(int out_c, int in_c);
// Rows px_w4_dw keeps for c channels: c rounded up to its register blocks' 4.
static inline size_t px_w4_rows(int c) { return ((size_t)c + 3) / 4 * 4; }
size_t px_w4_dw_scratch(const px_w4 *g, int in_c, int out_c);
// Vectors of tile positions px_w4_dw transforms at a time.
int px_w4_dw_chunk(const px_w4 *g, int in_c, int out_c);
void px_w4_dw(const px_w4 *g, const float *xp, int in_c, const float *dp, int out_c, int ns, float *dU, float *scratch);
// dW (out_c, in_c, 3, 3) += Gᵀ dU G for every (out, in) pair.
void px_w4_dw_weights(const float *dU, int out_c, int in_c, float *dW);

// One run of the forward kernel: in (in_c planes in_ps apart), nt taps at
// off[] with weights wr [block][in][nt][ob], into tile rows of Qr
// positions (a multiple of the vector width).
typedef struct px_c3_pass {
  const float *in;
  size_t in_ps;
  int in_c, nt, out_c;
  const float *wr, *bias;
  int c_lo, c_hi; /* input channels this run sums: [c_lo, c_hi) */
  ptrdiff_t off[9];
  size_t Qr;
} px_c3_pass;

// The copies of the kernels (px_c3_run: the forward kernel over a pass's
// positions into the tile; px_c3_dw): for the compiler's default target
// (conv2d_3x3.c), for AVX2 + FMA (conv2d_3x3_avx2.c) and for AVX-512F + FMA
// (conv2d_3x3_avx512.c), the last two in a portable x86-64 build.
#define PX_C3_COPY(sfx)                                                                                          \
  void px_c3_run_##sfx(const px_c3_pass *p, int blk, float *tile);                                               \
  void px_c3_dw_##sfx(const px_c3 *g, const float *x_p, int C, const float *dy_p, int O, int blk, int n_samples, \
                      float *dW);                                                                                \
  void px_w4_pad_##sfx(const px_w4 *g, const float *x, size_t in_ss, int ns, int C, float *xp);                  \
  void px_w4_sample_##sfx(const px_w4 *g, const float *xp, int C, const float *U, int O, const float *bias,      \
                          float *out, size_t out_ss, int ns, float *scratch);                                    \
  void px_w4_dw_##sfx(const px_w4 *g, const float *xp, int C, const float *dp, int O, int ns, float *dU,         \
                      float *scratch);
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
