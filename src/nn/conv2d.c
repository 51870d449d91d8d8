// Conv2d as im2col + GEMM, one sample at a time (zero padding, no dilation).
//
//   x: (N, C, H, W)   W: (O, C, k, k) = (O, K) with K = C·k·k   b: (O,)
//   y: (N, O, H', W')  H' = (H + 2p - k)/s + 1,  P = H'·W'
//
//   col_n: (K, P)   col_n[(c·k + i)·k + j, oh·W' + ow] = x[n, c, oh·s - p + i, ow·s - p + j]  (0 outside)
//   forward:   y_n  = W · col_n + b        (O, K)·(K, P)      y_n is y[n] as (O, P): NCHW as is
//   backward:  dW  += dy_n · col_nᵀ        (O, P)·(P, K)
//              db  += Σ_q dy_n[:, q]
//              dcol = Wᵀ · dy_n            (K, O)·(O, P)
//              dx_n = col2im(dcol)         (every tap adds back into its pixel)
//
// Why per sample and not one GEMM over the batch laid side by side
// (col: (K, N·P)): on the benchmark CNN (batch 64, 1 thread) the batched
// im2col streams N·K·P floats through DRAM and, with the NCHW <-> (O, N·P)
// permutes it needs, cost more than the GEMM itself, while OpenBLAS runs
// the per-sample GEMMs (O ≥ 8, P ≥ 49) as fast or faster (the measurement:
// docs/PERFORMANCE.md, "Figures behind code comments").  One
// sample's columns stay in L2, and in y and dy each sample's (O, P) block is
// already the GEMM's layout, so nothing is permuted.
//
// Threads: samples are spread over OpenMP threads, each with its own col
// buffer and single-threaded GEMMs (OpenBLAS's OpenMP build runs one thread
// inside a parallel region).  With one sample or one thread, the loop is
// serial and OpenBLAS threads each GEMM instead.
//
// Backward recomputes col_n (it is in cache when the GEMMs read it) in the
// buffers forward used, so the arena holds T·K·P floats of columns for T
// threads, not N·K·P.
//
// dW must not race: the batch is cut into B fixed blocks of consecutive
// samples, B = min(N, DW_BLOCKS, PART_BUDGET / (O·K)); each block sums its
// samples' dW into its own (O, K) partial, then the partials are added in
// block order.  B depends only on N and the layer, so dW does not depend on
// the thread count (bit for bit).  When not even two partials fit (wide
// layers: ResNet's later stages), samples run one after another and each
// GEMM is cut into fixed chunks of ROW_CHUNK output rows, one thread per
// chunk, each chunk a single-threaded GEMM.  Not letting OpenBLAS thread
// these GEMMs itself is deliberate: its threaded and single-threaded sgemm
// take different kernels (its small-matrix path runs only on one thread),
// so the bits would depend on the thread count.  Fixed chunks keep them
// independent of it, as the blocked path does.
//
// 3×3 padding-1 layers of stride 1 or 2 take direct kernels instead
// (conv2d_3x3.c: no im2col, no GEMM packing, no col2im; use_direct says
// which widths); PX_CONV_DIRECT=0 in the environment turns them off
// (im2col + GEMM for every layer), =1 takes them for every such layer.
// They keep the rules above: each sample's forward and dx are one thread's
// work in a fixed order, and dW is summed per block of samples into
// partials added in block order.
#include "plexus/nn.h"
#include "nn/conv2d_3x3.h"
#include "tensor/internal.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_vision.h"
#include "tensor/cuda/px_cuda.h"
#endif

// 16, not more: every partial is zeroed, filled and added back, so on the
// zoo's CNN 64 one-sample blocks spent a tenth of the step zeroing and
// summing partials (docs/PERFORMANCE.md, "Figures behind code comments");
// 16 blocks still feed 16 threads.
#define DW_BLOCKS 16
#define PART_BUDGET ((size_t)1 << 22) /* floats of dW partials (16 MiB) */
#define DW_MIN_VECTORS 32             /* direct kernels: vectors of positions a dW block sums at least */
#define ROW_CHUNK 64                  /* output rows per GEMM chunk on the wide path */

typedef struct conv2d {
  px_module base;
  int in_c, out_c, k, stride, pad;
  bool has_bias;
  // Saved by forward for backward.
  px_tensor x; /* (N, C, H, W) */
  int Ho, Wo;
  float *cols; /* (n_cols, K, P): one col buffer per thread, reused by backward */
  int n_cols;
  float *xp; /* direct path: x padded (N, C, PS) by forward for backward, or NULL */
} conv2d;

// The direct 3×3 kernels apply.  By default only where they run at full
// speed (px_c3_fast): a -march=native build, or the portable build's AVX2 +
// FMA or AVX-512 copy on a CPU that has it; on an x86-64 CPU without them,
// im2col + GEMM (the baseline copy, SSE2 with no register pinning, has not
// been measured against OpenBLAS's kernels for such a CPU).  With 8-float
// vectors only up to 64 channels in and out, where they were measured
// faster (ResNet-20, the zoo's and the benchmark's CNNs); on ResNet-18 with
// them for every layer (128-512 channels, where OpenBLAS's GEMMs are
// efficient) the step took longer.  With 16-float vectors (px_c3_wide) at
// every width: ResNet-18's 128-512-channel layers 1.3-2.0× faster than
// im2col + GEMM (docs/PERFORMANCE.md, "Figures behind code comments").
// Stride 2 (ResNet's downsampling 3×3 layers) through the phase planes
// (conv2d_3x3.c), by the same width rule: ResNet-20's two such layers
// about 2× faster than im2col + GEMM (docs/PERFORMANCE.md, "Figures behind
// code comments").
// PX_CONV_DIRECT=0: never; =1: every 3×3 padding-1 layer of stride 1 or 2.
static bool use_direct(const conv2d *c) {
  if (c->k != 3 || (c->stride != 1 && c->stride != 2) || c->pad != 1) return false;
  const char *e = getenv("PX_CONV_DIRECT");
  if (e && strcmp(e, "0") == 0) return false;
  if (e && strcmp(e, "1") == 0) return true;
  return px_c3_fast() && (px_c3_wide() || (c->in_c <= 64 && c->out_c <= 64));
}

// First and one-past-last output column ow whose input column
// ow·s - p + j lies inside [0, W).
static void valid_range(int W, int Wo, int s, int p, int j, int *lo, int *hi) {
  int a = p - j;  // ow·s >= p - j
  *lo = a <= 0 ? 0 : (a + s - 1) / s;
  int b = W - 1 + p - j;  // ow·s <= W - 1 + p - j
  *hi = b < 0 ? 0 : b / s + 1;
  if (*hi > Wo) *hi = Wo;
  if (*lo > *hi) *lo = *hi;
}

// Worth an OpenMP region of its own: big enough and not already inside one.
static bool par_here(size_t work) { return PX_PAR(work) && !omp_in_parallel(); }

// "Same" convolution (s = 1, k = 2p + 1, so W' = W, H' = H): tap (i, j) of
// a plane is the plane shifted by i - p rows and dj = j - p columns.  Its
// rows whose input row exists form one block, a flat copy shifted by dj;
// the |dj| columns per row that the flat shift takes from the neighbouring
// row lie outside the image and are zeroed.  One long vectorized loop per
// tap instead of one short loop per row.
static void same_rows(int H, int Ho, int i, int p, int *oh_lo, int *oh_hi) {
  *oh_lo = p - i > 0 ? p - i : 0;            // ih = oh - p + i >= 0
  *oh_hi = H + p - i < Ho ? H + p - i : Ho;  // ih < H
  if (*oh_hi < *oh_lo) *oh_hi = *oh_lo;
}

// Zero columns [c0, c1) of `rows` rows of width W.
static void zero_cols(float *d, int rows, int W, int c0, int c1) {
  if (c0 < 0) c0 = 0;
  if (c1 > W) c1 = W;
  for (int r = 0; r < rows && c0 < c1; r++)
    for (int c = c0; c < c1; c++) d[(size_t)r * W + c] = 0.0f;
}

// dst (H', W') = tap (i, j) of plane (H, W), zero outside.
static void im2col_tap_same(const float *plane, float *dst, int H, int W, int i, int j, int p) {
  int lo, hi;
  same_rows(H, H, i, p, &lo, &hi);
  memset(dst, 0, (size_t)lo * W * sizeof *dst);
  memset(dst + (size_t)hi * W, 0, (size_t)(H - hi) * W * sizeof *dst);
  if (hi == lo) return;
  const int dj = j - p, rows = hi - lo;
  const ptrdiff_t len = (ptrdiff_t)rows * W;
  float *d = dst + (size_t)lo * W;
  const float *src = plane + (size_t)(lo - p + i) * W;  // input row of the block's first row
  // d[t] = src[t + dj] where 0 <= t + dj < len, else 0
  const ptrdiff_t t0 = dj < 0 ? -dj : 0, t1 = dj > 0 ? len - dj : len;
  for (ptrdiff_t t = 0; t < t0 && t < len; t++) d[t] = 0.0f;
  for (ptrdiff_t t = t1 > 0 ? t1 : 0; t < len; t++) d[t] = 0.0f;
#pragma omp simd
  for (ptrdiff_t t = t0; t < t1; t++) d[t] = src[t + dj];
  if (dj > 0) zero_cols(d, rows, W, W - dj, W);
  if (dj < 0) zero_cols(d, rows, W, 0, -dj);
}

// plane (H, W) += tap (i, j) of dcol (H', W'); dcol's entries outside the
// image are zeroed first (dcol is scratch), so the flat shifted add is exact.
static void col2im_tap_same(float *dcol, float *plane, int H, int W, int i, int j, int p) {
  int lo, hi;
  same_rows(H, H, i, p, &lo, &hi);
  if (hi == lo) return;
  const int dj = j - p, rows = hi - lo;
  const ptrdiff_t len = (ptrdiff_t)rows * W;
  float *d = dcol + (size_t)lo * W;
  float *dst = plane + (size_t)(lo - p + i) * W;
  if (dj > 0) zero_cols(d, rows, W, W - dj, W);
  if (dj < 0) zero_cols(d, rows, W, 0, -dj);
  const ptrdiff_t t0 = dj < 0 ? -dj : 0, t1 = dj > 0 ? len - dj : len;
#pragma omp simd
  for (ptrdiff_t t = t0; t < t1; t++) dst[t + dj] += d[t];
}

// col (K, P) from one sample x (C, H, W).
static void im2col(const conv2d *c, const float *x, int H, int W, float *col) {
  const int C = c->in_c, k = c->k, s = c->stride, p = c->pad, Ho = c->Ho, Wo = c->Wo;
  const size_t P = (size_t)Ho * Wo;
  const bool same = s == 1 && Wo == W;
#pragma omp parallel for schedule(static) if (par_here((size_t)C * k * k * P))
  for (int ci = 0; ci < C; ci++) {
    const float *plane = x + (size_t)ci * H * W;
    for (int i = 0; i < k; i++)
      for (int j = 0; j < k; j++) {
        float *dst = col + ((size_t)(ci * k + i) * k + j) * P;
        if (same) {
          im2col_tap_same(plane, dst, H, W, i, j, p);
          continue;
        }
        int lo, hi;
        valid_range(W, Wo, s, p, j, &lo, &hi);
        for (int oh = 0; oh < Ho; oh++) {
          float *out = dst + (size_t)oh * Wo;
          const int ih = oh * s - p + i;
          if (ih < 0 || ih >= H || lo == hi) {
            memset(out, 0, (size_t)Wo * sizeof *out);
            continue;
          }
          // out[ow] = x[ih, ow·s - p + j]   for lo <= ow < hi, else 0
          for (int ow = 0; ow < lo; ow++) out[ow] = 0.0f;
          for (int ow = hi; ow < Wo; ow++) out[ow] = 0.0f;
          const float *src = plane + (size_t)ih * W + (lo * s - p + j);
          float *o = out + lo;
          const int n = hi - lo;
          if (s == 1) {
#pragma omp simd simdlen(8)  // rows are short (7..56): 16 lanes would leave them scalar
            for (int t = 0; t < n; t++) o[t] = src[t];
          } else {
            for (int t = 0; t < n; t++) o[t] = src[(size_t)t * s];
          }
        }
      }
  }
}

// dx (C, H, W) = col2im(dcol (K, P)) for one sample; one thread per plane.
// dcol is scratch: the "same" path zeroes its entries outside the image.
static void col2im(const conv2d *c, float *dcol, int H, int W, float *dx) {
  const int C = c->in_c, k = c->k, s = c->stride, p = c->pad, Ho = c->Ho, Wo = c->Wo;
  const size_t P = (size_t)Ho * Wo;
  const bool same = s == 1 && Wo == W;
#pragma omp parallel for schedule(static) if (par_here((size_t)C * k * k * P))
  for (int ci = 0; ci < C; ci++) {
    float *plane = dx + (size_t)ci * H * W;
    memset(plane, 0, (size_t)H * W * sizeof *plane);
    for (int i = 0; i < k; i++)
      for (int j = 0; j < k; j++) {
        float *src = dcol + ((size_t)(ci * k + i) * k + j) * P;
        if (same) {
          col2im_tap_same(src, plane, H, W, i, j, p);
          continue;
        }
        int lo, hi;
        valid_range(W, Wo, s, p, j, &lo, &hi);
        for (int oh = 0; oh < Ho; oh++) {
          const int ih = oh * s - p + i;
          if (ih < 0 || ih >= H || lo == hi) continue;
          // dx[ih, ow·s - p + j] += dcol[., oh·W' + ow]   for lo <= ow < hi
          const float *in = src + (size_t)oh * Wo + lo;
          float *row = plane + (size_t)ih * W + (lo * s - p + j);
          const int n = hi - lo;
          if (s == 1) {
#pragma omp simd simdlen(8)
            for (int t = 0; t < n; t++) row[t] += in[t];
          } else {
            for (int t = 0; t < n; t++) row[(size_t)t * s] += in[t];
          }
        }
      }
  }
}

static px_status conv_shape_error(const px_module *m, const px_tensor *x, const char *why) {
  const conv2d *c = (const conv2d *)m;
  char s[PX_SHAPE_STR_MAX];
  return px_error(PX_ERR_SHAPE, "Conv2d(%d -> %d, k=%d, stride=%d, padding=%d) \"%s\": input %s %s", c->in_c, c->out_c,
                  c->k, c->stride, c->pad, m->params[0].name, px_shape_str(x->ndim, x->shape, s, sizeof s), why);
}

// Threads that a parallel sample loop may use.
static int team_size(void) {
  (void)px_get_num_threads();  // applies PX_NUM_THREADS first: it may raise the team size
  int t = omp_get_max_threads();
  return t < 1 ? 1 : t;
}

// `need` (K, P) col buffers: forward's when there are enough (the arena
// keeps them until the next step), else new ones.
static float *conv_cols(conv2d *c, px_ctx *ctx, size_t KP, int need, bool fresh) {
  if (fresh || c->n_cols < need) {
    c->cols = px_arena_alloc(ctx->arena, (size_t)need * KP * sizeof(float));
    c->n_cols = c->cols ? need : 0;
  }
  return c->cols;
}

// Where the direct kernels' weights (in_c · out_c · 9 floats) outgrow
// C3_SPLIT_BYTES and the inputs' slice of PX_C3_CB channels over all N
// samples fits in it, c3_conv_all takes the input channels PX_C3_CB at a
// time across every (sample, block) item rather than every channel of one
// item after another: an item's run otherwise streams all its block's
// weights, and the next item (the next block) the next block's, so each
// sample read all of them from L3 (ResNet-18's 512-channel 7×7 layer,
// batch 8: the weight loads were most of the forward kernel's time, 14.7
// → 13.6 ms split).  A part's block of weights (PX_C3_CB · 9 · ob floats)
// stays in L1 across the samples and its slice of the inputs in L2 across
// the blocks; each item keeps its tile in `tiles` between parts.  Where
// that slice does not fit, the parts only re-read it from L3 (ResNet-18's
// 128 → 256 stride-2 layer at batch 8, 2 MB a slice: 6.1 → 6.9 ms split).
// The same bits either way: each tile sums the same parts in the same
// order (px_c3_conv_part).
#define C3_SPLIT_BYTES ((size_t)1 << 19)
static bool c3_split(const px_c3 *g, int in_c, int out_c, int64_t N) {
  return in_c > PX_C3_CB && (size_t)in_c * (size_t)out_c * 9 * sizeof(float) > C3_SPLIT_BYTES &&
    (size_t)N * PX_C3_CB * g->PS * sizeof(float) <= C3_SPLIT_BYTES;
}

// Floats of tile c3_conv_all needs: one an item where it splits, else one
// a thread (T threads).
static size_t c3_tile_floats(const px_c3 *g, int in_c, int out_c, int64_t N, int T) {
  const size_t tile = (size_t)g->ob * g->Qr, blocks = (size_t)(out_c + g->ob - 1) / (size_t)g->ob;
  return c3_split(g, in_c, out_c, N) ? (size_t)N * blocks * tile : (size_t)T * tile;
}

// out (N samples of out_c planes, out_ss floats apart) = bias + the
// convolution of in_p (N samples of in_c padded planes, in_ss apart) with
// wr, as (sample, block) items over the team of an enclosing parallel
// region.  Its last loop leaves without a barrier: the caller's next loop
// (dW beside dx) or the region's end waits.
static void c3_conv_all(const px_c3 *g, const float *in_p, size_t in_ss, int in_c, const float *wr, int out_c,
                        const float *bias, float *out, size_t out_ss, int64_t N, float *tiles) {
  const int blocks = (out_c + g->ob - 1) / g->ob;
  const int64_t items = N * blocks;
  const size_t tile = (size_t)g->ob * g->Qr;
  if (!c3_split(g, in_c, out_c, N)) {
    float *t = tiles + (size_t)omp_get_thread_num() * tile;
#pragma omp for schedule(static) nowait
    for (int64_t it = 0; it < items; it++) {
      const int64_t n = it / blocks;
      px_c3_conv(g, in_p + (size_t)n * in_ss, in_c, wr, out_c, (int)(it % blocks), bias, out + (size_t)n * out_ss, t);
    }
    return;
  }
  // Items block by block, the samples inside: a thread's run of items
  // shares its blocks' weights.  Each part waits for the one before.
  for (int c0 = 0; c0 < in_c; c0 += PX_C3_CB) {
    const int c1 = c0 + PX_C3_CB < in_c ? c0 + PX_C3_CB : in_c;
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      const int64_t n = it % N;
      const int blk = (int)(it / N);
      px_c3_conv_part(g, in_p + (size_t)n * in_ss, in_c, c0, c1, wr, out_c, blk, bias,
                      tiles + (size_t)(n * blocks + blk) * tile);
    }
  }
#pragma omp for schedule(static) nowait
  for (int64_t it = 0; it < items; it++)
    px_c3_tile_out(g, tiles + (size_t)it * tile, out_c, (int)(it % blocks), out + (size_t)(it / blocks) * out_ss);
}

// Forward through the direct kernels: pad every sample, then (sample,
// block of g.ob output channels) items spread over the threads.
static px_status conv_forward_direct(conv2d *c, px_ctx *ctx, int64_t N, int H, int W, float *Y) {
  const px_module *m = &c->base;
  const int C = c->in_c, O = c->out_c, T = team_size();
  px_c3 g;
  px_c3_geom(H, W, c->stride, &g);
  const int blocks = (O + g.ob - 1) / g.ob;
  const int64_t items = N * blocks;
  const bool par = T > 1 && items > 1 && PX_PAR((size_t)N * C * O * g.Ho * g.Wo / 64);
  float *xp = px_arena_alloc(ctx->arena, (size_t)N * C * g.PS * sizeof(float));
  float *wr = px_arena_alloc(ctx->arena, px_c3_wr_floats(&g, O, C) * sizeof(float));
  float *tiles = px_arena_alloc(ctx->arena, c3_tile_floats(&g, C, O, N, par ? T : 1) * sizeof(float));
  if (!xp || !wr || !tiles) return PX_ERR_NOMEM;
  px_c3_weights_fwd(&g, m->params[0].data, O, C, wr);
  const float *X = px_f32(&c->x), *b = c->has_bias ? m->params[1].data : NULL;
  const size_t in_sample = (size_t)C * H * W, out_sample = (size_t)O * g.Ho * g.Wo, xps = (size_t)C * g.PS;
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) px_c3_pad(&g, X + (size_t)n * in_sample, C, xp + (size_t)n * xps);
    c3_conv_all(&g, xp, xps, C, wr, O, b, Y, out_sample, N, tiles);
  }
  c->xp = xp;
  return PX_OK;
}

// Winograd F(4×4, 3×3) (conv2d_3x3.c, px_w4_*) for the stride-1 layers
// that take the direct kernels, with planes of at least W4_MIN_PLANE pixels
// a side and W4_MIN_CHANNELS channels in and out: there it measured faster
// than the direct kernels (forward, 1 thread, AVX-512: 1.26-1.34× on
// ResNet-20's 16- and 32-channel layers, 1.9-2.1× on ResNet-18's 56×56
// and 28×28 layers, 1.12-1.25× at 14×14); no faster at 8×8, slower on 7×7
// planes and with 1-8 channels (docs/PERFORMANCE.md, "Winograd").
// PX_CONV_WINOGRAD=0 turns it off, =1 takes it for every stride-1 layer
// the direct kernels take.
#define W4_MIN_PLANE 14
#define W4_MIN_CHANNELS 16
static bool use_winograd(const conv2d *c, int H, int W) {
  if (c->stride != 1 || !use_direct(c)) return false;
  const char *e = getenv("PX_CONV_WINOGRAD");
  if (e && strcmp(e, "0") == 0) return false;
  if (e && strcmp(e, "1") == 0) return true;
  return H >= W4_MIN_PLANE && W >= W4_MIN_PLANE && c->in_c >= W4_MIN_CHANNELS && c->out_c >= W4_MIN_CHANNELS;
}

// The input gradient through Winograd: by default where the forward takes
// it and the layer does not widen (dx's input, dy, has no more channels
// than its output: the zoo CNN's 32 → 64 layer at 14×14, batch 64, took
// 4.76 ms for backward on the direct kernels and 5.07 through Winograd;
// docs/PERFORMANCE.md, "Winograd"); PX_CONV_WINOGRAD=1: wherever the
// forward may take it.
static bool use_winograd_dx(const conv2d *c, int H, int W) {
  const char *e = getenv("PX_CONV_WINOGRAD");
  if (e && strcmp(e, "1") == 0) return use_winograd(c, H, W);
  return use_winograd(c, H, W) && c->out_c <= c->in_c;
}

// The weight gradient through Winograd (conv_wino_bwd): where the forward
// takes it, up to W4_DW_MAX_CHANNELS channels in and out together.
// Backward (dx + dW), 1 thread, AVX-512, against the direct kernels' dW:
// ResNet-20's 16-channel 32×32 layer 1.32× faster, ResNet-18's 64-channel
// 56×56 1.63× and 128-channel 28×28 1.36×; ResNet-20's 32-channel 16×16
// layer and the zoo CNN's 32 → 64 at 14×14 0.96-1.18× and 0.83-1.12×
// depending on the minute, but the steps faster with them (ResNet-20
// 624-638 samples/s against 573-599, the zoo CNN 4738-5182 against
// 4499-4597); 256 → 256 at 14×14 not faster (18.8-20.7 ms against
// 17.3-19.3), hence the cap (docs/PERFORMANCE.md, "Winograd's weight
// gradient").  PX_CONV_WINOGRAD=1: wherever the forward may take it.
#define W4_DW_MAX_CHANNELS 256
static bool use_winograd_dw(const conv2d *c, int H, int W) {
  const char *e = getenv("PX_CONV_WINOGRAD");
  if (e && strcmp(e, "1") == 0) return use_winograd(c, H, W);
  return use_winograd(c, H, W) && c->in_c + c->out_c <= W4_DW_MAX_CHANNELS;
}

// Positions of 4×4 tiles a group of samples fills at least (W4_GROUP_TILES
// tile positions of the tall plane): several samples of a small plane share
// each vector's lanes.
#define W4_GROUP_TILES 96

// out (N, out_c, H, W) = bias + conv(in, w) through Winograd: groups of
// samples a thread (phase padding, input transform, then every block of
// output channels), so their transforms stay in cache.  dx: the input
// gradient (in = dy, out_c = C, the weights flipped).
static px_status conv_wino(const conv2d *c, px_ctx *ctx, int64_t N, int H, int W, const float *in, int in_c, int out_c,
                           bool dx, const float *bias, float *out) {
  const int T = team_size();
  px_w4 g;
  px_w4_geom(H, W, 1, &g);
  const int per = g.RS / 4 * g.Wq; /* tile positions a sample takes in a tall plane */
  int ns = (W4_GROUP_TILES + per - 1) / per;
  if (ns > N) ns = (int)N;
  // As many groups as a multiple of the threads, where the samples allow
  // (each output's sums are the same for any grouping).
  if (T > 1 && N > 1) {
    int64_t groups = (N + ns - 1) / ns;
    groups = (groups + T - 1) / T * T;
    ns = (int)((N + groups - 1) / groups);
  }
  px_w4_geom(H, W, ns, &g);
  const int64_t groups = (N + ns - 1) / ns;
  const bool par = T > 1 && groups > 1 && PX_PAR((size_t)N * in_c * out_c * H * W / 64);
  const int nt = par ? T : 1;
  // Per thread: the phase planes (zeroed once: px_w4_pad writes only the
  // images' positions) and px_w4_sample's scratch.
  const size_t xp_floats = (size_t)in_c * g.PS, scratch_floats = px_w4_scratch(&g, in_c, out_c);
  float *xps = px_arena_calloc(ctx->arena, (size_t)nt * xp_floats * sizeof(float));
  float *scratch = px_arena_alloc(ctx->arena, (size_t)nt * scratch_floats * sizeof(float));
  float *U = px_arena_alloc(ctx->arena, px_w4_u_floats(&g, out_c, in_c) * sizeof(float));
  if (!xps || !scratch || !U) return PX_ERR_NOMEM;
  const size_t in_sample = (size_t)in_c * H * W, out_sample = (size_t)out_c * H * W;
  const int blocks = (out_c + g.ob - 1) / g.ob;
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int b = 0; b < blocks; b++) px_w4_weights(&g, c->base.params[0].data, c->out_c, c->in_c, dx, b, U);
#pragma omp for schedule(static)
    for (int64_t gi = 0; gi < groups; gi++) {
      const int t = omp_get_thread_num();
      float *xp = xps + (size_t)t * xp_floats;
      const int64_t n0 = gi * ns;
      const int k = N - n0 < ns ? (int)(N - n0) : ns;
      px_w4_pad(&g, in + (size_t)n0 * in_sample, in_sample, k, in_c, xp);
      px_w4_sample(&g, xp, in_c, U, out_c, bias, out + (size_t)n0 * out_sample, out_sample, k,
                   scratch + (size_t)t * scratch_floats);
    }
  }
  return PX_OK;
}

#ifdef PX_HAVE_CUDA
// The device path (x on PX_CUDA; the arena and the parameters on the
// device), on chunks of nb samples, their columns side by side (K, nb·P):
//   forward   col = im2col(x chunk);  z = W · col  (O, nb·P);  y = z + b,
//             laid out back as (nb, O, P)
//   backward  db += Σ dy (one double sum per channel);  dz = dy chunk as
//             (O, nb·P);  dW += dz · colᵀ;  dcol = Wᵀ · dz;
//             dx = col2im(dcol) (gather form: no atomics)
// Chunks run one after another on the compute stream, so dW's sum has a
// fixed order.  nb: as many samples as CONV_CUDA_SCRATCH floats of
// scratch hold (at least one; PX_CUDA_CONV_CHUNK lowers it).  compute_dtype PX_BF16: every GEMM operand
// cast to bf16 (W once per call), f32 accumulation into f32 outputs.
#define CONV_CUDA_SCRATCH ((size_t)1 << 25) /* floats (128 MiB) of col, dcol and z per chunk */
#define CUDA_TRY(call)            \
  do {                            \
    px_status st_ = (call);       \
    if (st_ != PX_OK) return st_; \
  } while (0)

static int conv_cuda_chunk(const conv2d *c, int64_t N, size_t K, size_t P) {
  const size_t per_sample = (2 * K + (size_t)c->out_c) * P;
  size_t nb = CONV_CUDA_SCRATCH / (per_sample ? per_sample : 1);
  if (nb < 1) nb = 1;
  // PX_CUDA_CONV_CHUNK=n caps it at n samples (the tests' way to reach
  // several chunks, a short last one among them, on small inputs).
  const char *e = getenv("PX_CUDA_CONV_CHUNK");
  if (e && atoi(e) > 0 && (size_t)atoi(e) < nb) nb = (size_t)atoi(e);
  if (nb > (size_t)N) nb = (size_t)N;
  while (nb > 1 && nb * P > INT32_MAX) nb /= 2;  // a GEMM dimension (int)
  return (int)nb;
}

static px_status conv_forward_cuda(conv2d *c, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  const px_module *m = &c->base;
  const int64_t N = x->shape[0];
  const int H = (int)x->shape[2], W = (int)x->shape[3], C = c->in_c, O = c->out_c;
  const int K = C * c->k * c->k, P = c->Ho * c->Wo;
  const int nb = conv_cuda_chunk(c, N, (size_t)K, (size_t)P);
  const size_t BP = (size_t)nb * P;
  const bool bf16 = ctx->compute_dtype == PX_BF16;
  float *col = px_arena_alloc(ctx->arena, (size_t)K * BP * sizeof(float));
  float *z = px_arena_alloc(ctx->arena, (size_t)O * BP * sizeof(float));
  uint16_t *wb = bf16 ? px_arena_alloc(ctx->arena, (size_t)O * K * sizeof(uint16_t)) : NULL;
  uint16_t *colb = bf16 ? px_arena_alloc(ctx->arena, (size_t)K * BP * sizeof(uint16_t)) : NULL;
  if (!col || !z || (bf16 && (!wb || !colb))) return PX_ERR_NOMEM;
  const float *X = px_f32(x), *Wt = m->params[0].data, *b = c->has_bias ? m->params[1].data : NULL;
  float *Y = px_f32(y);
  if (bf16) CUDA_TRY(px_cuda_to_bf16(wb, Wt, (size_t)O * K));
  const size_t in_sample = (size_t)C * H * W, out_sample = (size_t)O * P;
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int cb = N - n0 < nb ? (int)(N - n0) : nb, cbp = cb * P;
    CUDA_TRY(px_k_im2col(X + (size_t)n0 * in_sample, col, cb, C, H, W, c->k, c->stride, c->pad, c->Ho, c->Wo));
    // z = W · col      (O, K)·(K, cb·P)
    if (bf16) {
      CUDA_TRY(px_cuda_to_bf16(colb, col, (size_t)K * cbp));
      CUDA_TRY(px_cuda_gemm_bf16(false, false, O, cbp, K, 1.0f, wb, K, colb, cbp, 0.0f, z, cbp));
    } else {
      CUDA_TRY(px_cuda_sgemm(false, false, O, cbp, K, 1.0f, Wt, K, col, cbp, 0.0f, z, cbp));
    }
    CUDA_TRY(px_k_conv_unpack(z, b, Y + (size_t)n0 * out_sample, cb, O, P));
  }
  c->x = *x;
  return PX_OK;
}

static px_status conv_backward_cuda(conv2d *c, px_ctx *ctx, const float *DY, float *DX, bool bf16) {
  const px_module *m = &c->base;
  const int64_t N = c->x.shape[0];
  const int H = (int)c->x.shape[2], W = (int)c->x.shape[3], C = c->in_c, O = c->out_c;
  const int K = C * c->k * c->k, P = c->Ho * c->Wo;
  const int nb = conv_cuda_chunk(c, N, (size_t)K, (size_t)P);
  const size_t BP = (size_t)nb * P;
  float *col = px_arena_alloc(ctx->arena, (size_t)K * BP * sizeof(float));
  float *dz = px_arena_alloc(ctx->arena, (size_t)O * BP * sizeof(float));
  float *dcol = DX ? px_arena_alloc(ctx->arena, (size_t)K * BP * sizeof(float)) : NULL;
  uint16_t *wb = bf16 && DX ? px_arena_alloc(ctx->arena, (size_t)O * K * sizeof(uint16_t)) : NULL;
  uint16_t *colb = bf16 ? px_arena_alloc(ctx->arena, (size_t)K * BP * sizeof(uint16_t)) : NULL;
  uint16_t *dzb = bf16 ? px_arena_alloc(ctx->arena, (size_t)O * BP * sizeof(uint16_t)) : NULL;
  if (!col || !dz || (DX && !dcol) || (bf16 && (!colb || !dzb || (DX && !wb)))) return PX_ERR_NOMEM;
  const float *X = px_f32(&c->x), *Wt = m->params[0].data;
  float *dW = m->params[0].grad;
  if (c->has_bias) CUDA_TRY(px_k_bias_grad(DY, m->params[1].grad, N, O, P));
  if (wb) CUDA_TRY(px_cuda_to_bf16(wb, Wt, (size_t)O * K));
  const size_t in_sample = (size_t)C * H * W, out_sample = (size_t)O * P;
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int cb = N - n0 < nb ? (int)(N - n0) : nb, cbp = cb * P;
    CUDA_TRY(px_k_im2col(X + (size_t)n0 * in_sample, col, cb, C, H, W, c->k, c->stride, c->pad, c->Ho, c->Wo));
    CUDA_TRY(px_k_conv_pack(DY + (size_t)n0 * out_sample, dz, cb, O, P));
    if (bf16) {
      // dW += dz · colᵀ      (O, cb·P)·(cb·P, K)
      CUDA_TRY(px_cuda_to_bf16(dzb, dz, (size_t)O * cbp));
      CUDA_TRY(px_cuda_to_bf16(colb, col, (size_t)K * cbp));
      CUDA_TRY(px_cuda_gemm_bf16(false, true, O, K, cbp, 1.0f, dzb, cbp, colb, cbp, 1.0f, dW, K));
      // dcol = Wᵀ · dz       (K, O)·(O, cb·P)
      if (DX) CUDA_TRY(px_cuda_gemm_bf16(true, false, K, cbp, O, 1.0f, wb, K, dzb, cbp, 0.0f, dcol, cbp));
    } else {
      CUDA_TRY(px_cuda_sgemm(false, true, O, K, cbp, 1.0f, dz, cbp, col, cbp, 1.0f, dW, K));
      if (DX) CUDA_TRY(px_cuda_sgemm(true, false, K, cbp, O, 1.0f, Wt, K, dz, cbp, 0.0f, dcol, cbp));
    }
    if (DX)
      CUDA_TRY(px_k_col2im(dcol, DX + (size_t)n0 * in_sample, cb, C, H, W, c->k, c->stride, c->pad, c->Ho, c->Wo));
  }
  return PX_OK;
}
#endif

static px_status conv_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  conv2d *c = (conv2d *)m;
  char why[160];
  if (x->ndim != 4) return conv_shape_error(m, x, "must be 4-D (N, C, H, W)");
  if (x->shape[1] != c->in_c) {
    snprintf(why, sizeof why, "has %lld channels, expected %d", (long long)x->shape[1], c->in_c);
    return conv_shape_error(m, x, why);
  }
  const int64_t N = x->shape[0], H = x->shape[2], W = x->shape[3];
  if (H + 2 * c->pad < c->k || W + 2 * c->pad < c->k) {
    snprintf(why, sizeof why, "is smaller than the kernel: padded %lldx%lld < %dx%d", (long long)(H + 2 * c->pad),
             (long long)(W + 2 * c->pad), c->k, c->k);
    return conv_shape_error(m, x, why);
  }
  if (N < 1 || H < 1 || W < 1) return conv_shape_error(m, x, "is empty");
  c->Ho = (int)((H + 2 * c->pad - c->k) / c->stride + 1);
  c->Wo = (int)((W + 2 * c->pad - c->k) / c->stride + 1);
  const int O = c->out_c;
  const size_t K = (size_t)c->in_c * c->k * c->k, P = (size_t)c->Ho * c->Wo;
  int64_t yshape[4] = {N, O, c->Ho, c->Wo};
  px_status st = px_ctx_tensor(ctx, y, 4, yshape);
  if (st != PX_OK) return st;
#ifdef PX_HAVE_CUDA
  if (x->device == PX_CUDA) return conv_forward_cuda(c, ctx, x, y);
#endif
  const int T = team_size();
  c->xp = NULL;
  if (use_winograd(c, (int)H, (int)W)) {
    c->x = *x;
    return conv_wino(c, ctx, N, (int)H, (int)W, px_f32(x), c->in_c, O, false, c->has_bias ? m->params[1].data : NULL,
                     px_f32(y));
  }
  if (use_direct(c)) {
    c->x = *x;
    return conv_forward_direct(c, ctx, N, (int)H, (int)W, px_f32(y));
  }
  const bool par = T > 1 && N > 1 && PX_PAR((size_t)N * K * P);
  float *cols = conv_cols(c, ctx, K * P, par ? T : 1, true);
  if (!cols) return PX_ERR_NOMEM;

  const float *X = px_f32(x), *Wt = m->params[0].data;
  const float *b = c->has_bias ? m->params[1].data : NULL;
  float *Y = px_f32(y);
  const size_t in_sample = (size_t)c->in_c * H * W, out_sample = (size_t)O * P;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t n = 0; n < N; n++) {
    float *col = cols + (size_t)omp_get_thread_num() * K * P;
    float *yn = Y + (size_t)n * out_sample;
    im2col(c, X + (size_t)n * in_sample, (int)H, (int)W, col);
    // y_n = b, then y_n += W · col_n      (O, K)·(K, P)
    for (int o = 0; o < O; o++) {
      const float bo = b ? b[o] : 0.0f;
      float *row = yn + (size_t)o * P;
#pragma omp simd
      for (size_t q = 0; q < P; q++) row[q] = bo;
    }
    px_sgemm(false, false, O, (int)P, (int)K, 1.0f, Wt, (int)K, col, (int)P, 1.0f, yn, (int)P);
  }
  c->x = *x;
  return PX_OK;
}

// db_acc[o] += Σ_q dy_n[o, q]      dy_n: (O, P)
static void accumulate_db(const float *dyn, int O, size_t P, double *db_acc) {
  for (int o = 0; o < O; o++) {
    const float *row = dyn + (size_t)o * P;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (size_t q = 0; q < P; q++) sum += row[q];
    db_acc[o] += sum;
  }
}

// One sample's backward: dW_acc += dy_n · col_nᵀ, db_acc[o] += Σ_q dy_n[o, q],
// and dx_n = col2im(Wᵀ · dy_n) when dxn != NULL.
static void conv_backward_sample(const conv2d *c, const float *xn, const float *dyn, float *dxn, float *col,
                                 float *dW_acc, double *db_acc, int H, int W) {
  const int O = c->out_c;
  const size_t K = (size_t)c->in_c * c->k * c->k, P = (size_t)c->Ho * c->Wo;
  if (db_acc) accumulate_db(dyn, O, P, db_acc);
  im2col(c, xn, H, W, col);
  // dW += dy_n · col_nᵀ      (O, P)·(P, K)
  px_sgemm(false, true, O, (int)K, (int)P, 1.0f, dyn, (int)P, col, (int)P, 1.0f, dW_acc, (int)K);
  if (!dxn) return;
  // dcol = Wᵀ · dy_n         (K, O)·(O, P), written over col
  px_sgemm(true, false, (int)K, (int)P, O, 1.0f, c->base.params[0].data, (int)K, dyn, (int)P, 0.0f, col, (int)P);
  col2im(c, col, H, W, dxn);
}

// The same for a wide layer, each GEMM cut into chunks of ROW_CHUNK rows
// spread over the threads (single-threaded GEMMs inside the region):
//   dW[o0:o1]  += dy_n[o0:o1] · col_nᵀ          (rows, P)·(P, K)
//   dcol[k0:k1] = W[:, k0:k1]ᵀ · dy_n            (rows, O)·(O, P)
static void conv_backward_sample_wide(const conv2d *c, const float *xn, const float *dyn, float *dxn, float *col,
                                      float *dW_acc, double *db_acc, int H, int W) {
  const int O = c->out_c;
  const size_t K = (size_t)c->in_c * c->k * c->k, P = (size_t)c->Ho * c->Wo;
  const bool par = team_size() > 1 && !omp_in_parallel();
  if (db_acc) accumulate_db(dyn, O, P, db_acc);
  im2col(c, xn, H, W, col);
  const int o_chunks = (O + ROW_CHUNK - 1) / ROW_CHUNK;
#pragma omp parallel for schedule(static) if (par)
  for (int ch = 0; ch < o_chunks; ch++) {
    const int o0 = ch * ROW_CHUNK, rows = O - o0 < ROW_CHUNK ? O - o0 : ROW_CHUNK;
    px_sgemm(false, true, rows, (int)K, (int)P, 1.0f, dyn + (size_t)o0 * P, (int)P, col, (int)P, 1.0f,
             dW_acc + (size_t)o0 * K, (int)K);
  }
  if (!dxn) return;
  const float *Wt = c->base.params[0].data;
  const int k_chunks = (int)((K + ROW_CHUNK - 1) / ROW_CHUNK);
#pragma omp parallel for schedule(static) if (par)
  for (int ch = 0; ch < k_chunks; ch++) {
    const size_t k0 = (size_t)ch * ROW_CHUNK;
    const int rows = K - k0 < ROW_CHUNK ? (int)(K - k0) : ROW_CHUNK;
    px_sgemm(true, false, rows, (int)P, O, 1.0f, Wt + k0, (int)K, dyn, (int)P, 0.0f, col + k0 * P, (int)P);
  }
  col2im(c, col, H, W, dxn);
}

// dW += Σ_b part[b] (in block order), db likewise from double partials;
// dW_part NULL: db only.
static void add_partials(const float *dW_part, const double *db_part, int64_t B, size_t OK, int O, float *dW,
                         float *db) {
#pragma omp parallel for schedule(static) if (dW_part && PX_PAR((size_t)B * OK))
  for (size_t e = 0; e < (dW_part ? OK : 0); e++) {
    float sum = 0.0f;
    for (int64_t bi = 0; bi < B; bi++) sum += dW_part[(size_t)bi * OK + e];
    dW[e] += sum;
  }
  if (db)
    for (int o = 0; o < O; o++) {
      double sum = 0.0;
      for (int64_t bi = 0; bi < B; bi++) sum += db_part[(size_t)bi * O + o];
      db[o] += (float)sum;
    }
}

// dW and db through Winograd (px_w4_dw) where use_winograd_dw says, and
// dx with them where use_winograd_dx says (DX, else NULL): the batch cut
// into B fixed blocks of consecutive samples as the direct kernels' dW (B
// from N and the layer alone), a block a thread's work: groups of ns
// samples (ns from the plane alone) of x and dy into phase planes, dx from
// dy's (px_w4_sample) while they are in cache, their dW sums into the
// block's own dU; then the blocks' dU added in block order and Gᵀ dU G
// added to the gradient once (not once a block: on ResNet-20's 32-channel
// layer that took a tenth of dW).  So the bits do not depend on the thread
// count.
static px_status conv_wino_bwd(conv2d *c, px_ctx *ctx, int64_t N, int H, int W, const float *X, const float *DY,
                               float *DX) {
  px_module *m = &c->base;
  const int C = c->in_c, O = c->out_c, T = team_size();
  const size_t du_floats = px_w4_du_floats(O, C);
  px_w4 g;
  px_w4_geom(H, W, 1, &g);
  const int per = g.RS / 4 * g.Wq; /* tile positions a sample takes in a tall plane */
  int ns = (W4_GROUP_TILES + per - 1) / per;
  // Blocks of at least ns samples where there are enough (groups of one
  // 28×28 sample instead of two: ResNet-18's 128-channel layer at batch 8
  // took 13.5 ms for dx + dW, not 11.3), at least two (for two threads),
  // at most DW_BLOCKS.
  int64_t B = N / ns;
  if (B > DW_BLOCKS) B = DW_BLOCKS;
  if (B < 2) B = N < 2 ? N : 2;
  if ((size_t)B > PART_BUDGET / du_floats) B = (int64_t)(PART_BUDGET / du_floats);
  if (B < 1) B = 1;
  if (ns > (N + B - 1) / B) ns = (int)((N + B - 1) / B);
  px_w4_geom(H, W, ns, &g);
  const bool par = T > 1 && B > 1 && PX_PAR((size_t)N * C * O * H * W / 64);
  const int nt = par ? T : 1;
  const size_t xp_floats = (size_t)C * g.PS, dp_floats = (size_t)O * g.PS;
  const size_t dw_floats = px_w4_dw_scratch(&g, C, O), dx_floats = DX ? px_w4_scratch(&g, O, C) : 0;
  const size_t scratch_floats = dw_floats > dx_floats ? dw_floats : dx_floats;
  // Per thread: the phase planes of x and dy (zeroed once: px_w4_pad
  // writes only the images' positions) and the kernels' scratch; per block
  // its dU and db.
  float *xps = px_arena_calloc(ctx->arena, (size_t)nt * (xp_floats + dp_floats) * sizeof(float));
  float *scratch = px_arena_alloc(ctx->arena, (size_t)nt * scratch_floats * sizeof(float));
  float *dU = px_arena_alloc(ctx->arena, (size_t)B * du_floats * sizeof(float));
  double *db_part = px_arena_calloc(ctx->arena, (size_t)B * O * sizeof(double)); /* (B, O) */
  float *U = DX ? px_arena_alloc(ctx->arena, px_w4_u_floats(&g, C, O) * sizeof(float)) : NULL;
  if (!xps || !scratch || !dU || !db_part || (DX && !U)) return PX_ERR_NOMEM;
  const size_t in_sample = (size_t)C * H * W, out_sample = (size_t)O * H * W, HW = (size_t)H * W;
  const bool bias = c->has_bias;
  const int cblocks = DX ? (C + g.ob - 1) / g.ob : 0;
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int b = 0; b < cblocks; b++) px_w4_weights(&g, m->params[0].data, O, C, true, b, U);
#pragma omp for schedule(static)
    for (int64_t bi = 0; bi < B; bi++) {
      const int t = omp_get_thread_num();
      float *xp = xps + (size_t)t * (xp_floats + dp_floats), *dp = xp + xp_floats, *du = dU + (size_t)bi * du_floats;
      float *sc = scratch + (size_t)t * scratch_floats;
      memset(du, 0, du_floats * sizeof *du);
      const int64_t n0 = bi * N / B, n1 = (bi + 1) * N / B;
      for (int64_t n = n0; n < n1; n += ns) {
        const int k = n1 - n < ns ? (int)(n1 - n) : ns;
        px_w4_pad(&g, DY + (size_t)n * out_sample, out_sample, k, O, dp);
        if (DX) px_w4_sample(&g, dp, O, U, C, NULL, DX + (size_t)n * in_sample, in_sample, k, sc);
        px_w4_pad(&g, X + (size_t)n * in_sample, in_sample, k, C, xp);
        px_w4_dw(&g, xp, C, dp, O, k, du, sc);
      }
      if (bias)
        for (int64_t n = n0; n < n1; n++)
          for (int o = 0; o < O; o++) {
            const float *row = DY + (size_t)n * out_sample + (size_t)o * HW;
            double sum = 0.0;
#pragma omp simd reduction(+ : sum)
            for (size_t q = 0; q < HW; q++) sum += row[q];
            db_part[(size_t)bi * O + o] += sum;
          }
    }
    // dU = Σ_b dU_b, in block order, into block 0's.
#pragma omp for schedule(static)
    for (size_t e = 0; e < du_floats; e++) {
      float sum = dU[e];
      for (int64_t bi = 1; bi < B; bi++) sum += dU[(size_t)bi * du_floats + e];
      dU[e] = sum;
    }
  }
  px_w4_dw_weights(dU, O, C, m->params[0].grad);
  add_partials(NULL, db_part, B, 0, O, NULL, bias ? m->params[1].grad : NULL);
  return PX_OK;
}

// Backward through the direct kernels: dy padded like x; dx as (sample,
// block of input channels) items; dW and db as (block of samples, block of
// output channels) items, each writing its own rows of its block's partial.
static px_status conv_backward_direct(conv2d *c, px_ctx *ctx, const float *DY, float *DX) {
  const px_module *m = &c->base;
  const int64_t N = c->x.shape[0];
  const int H = (int)c->x.shape[2], W = (int)c->x.shape[3], C = c->in_c, O = c->out_c, T = team_size();
  px_c3 g;
  px_c3_geom(H, W, c->stride, &g);
  const bool s2 = g.stride == 2;
  // Stride 1: dW and db through Winograd where use_winograd_dw says, dx
  // with them where use_winograd_dx says; the direct kernels below then
  // compute what is left (dx where the layer widens, or dW).
  const bool wdx = DX && use_winograd_dx(c, H, W), do_dw = !use_winograd_dw(c, H, W);
  if (!do_dw) {
    px_status st = conv_wino_bwd(c, ctx, N, H, W, px_f32(&c->x), DY, wdx ? DX : NULL);
    if (st != PX_OK || wdx || !DX) return st;
  } else if (wdx) {
    px_status st = conv_wino(c, ctx, N, H, W, DY, O, C, true, NULL, DX);
    if (st != PX_OK) return st;
    DX = NULL;
  }
  const int HWo = g.Ho * g.Wo;
  const size_t in_sample = (size_t)C * H * W, out_sample = (size_t)O * HWo;
  const size_t xps = (size_t)C * g.PS, yps = (size_t)O * g.dy_ps, qps = (size_t)O * g.dx_ps, OK = (size_t)O * C * 9;
  const bool par = T > 1 && N > 1 && PX_PAR((size_t)N * C * O * HWo / 64);
  const bool have_xp = c->xp != NULL;
  float *xp = have_xp || !do_dw ? c->xp : px_arena_alloc(ctx->arena, (size_t)N * xps * sizeof(float));
  // dy's planes start g.dy_lead floats past the arena's 64-byte alignment:
  // dW's loads of its rows are then aligned (px_c3_dw).
  float *dyp = px_arena_alloc(ctx->arena, ((size_t)N * yps + g.dy_lead) * sizeof(float));
  if (dyp) dyp += g.dy_lead;
  // Stride 2: dx from dy in its own layout (px_c3_pad_dx2), one weight
  // layout per phase; stride 1: dx from dyp, the weights flipped.
  float *dyq = DX && s2 ? px_arena_alloc(ctx->arena, (size_t)N * qps * sizeof(float)) : NULL;
  const size_t wrn = px_c3_wr_floats(&g, C, O);
  float *wr = DX ? px_arena_alloc(ctx->arena, (s2 ? 4 : 1) * wrn * sizeof(float)) : NULL;
  const size_t tile_floats = (size_t)g.ob * (s2 ? g.dx_Qr : g.Qr);
  float *tiles = !DX ? NULL
    : s2             ? px_arena_alloc(ctx->arena, (size_t)(par ? T : 1) * tile_floats * sizeof(float))
                     : px_arena_alloc(ctx->arena, c3_tile_floats(&g, O, C, N, par ? T : 1) * sizeof(float));
  // Blocks of samples: DW_BLOCKS, or fewer where a block would hold under
  // DW_MIN_VECTORS vectors of positions (samples × vectors per plane): each
  // block's kernel call sums its lanes once per (output, input channel, tap)
  // at the end, and with one 14×14 sample a block those sums took as long as
  // the FMAs (256 channels, batch 8: dx + dW at 129 GFLOP/s, the forward 203).
  // Fewer blocks everywhere was slower where planes are large (ResNet-20's
  // 32-channel layer, 16 samples a block: 3.15 -> 3.55 ms for dx + dW).
  const int dw_oblocks = (O + g.ob - 1) / g.ob;
  const int64_t per_plane = (int64_t)(g.Qr / (size_t)g.vl);
  const int64_t min_n = (DW_MIN_VECTORS + per_plane - 1) / per_plane;
  int64_t B = N / (min_n > 1 ? min_n : 1);
  if (B > DW_BLOCKS) B = DW_BLOCKS;
  if ((size_t)B > PART_BUDGET / OK) B = (int64_t)(PART_BUDGET / OK);
  if (B < 1) B = 1;
  // dW's partials (B, O, C, 9); one block: its sums go straight into the
  // gradient (each (o, c, tap) is added once, as add_partials would add
  // it: the same bits).
  float *dW_part = !do_dw ? NULL
    : B == 1              ? m->params[0].grad
                          : px_arena_calloc(ctx->arena, (size_t)B * OK * sizeof(float));
  double *db_part = do_dw ? px_arena_calloc(ctx->arena, (size_t)B * O * sizeof(double)) : NULL; /* (B, O) */
  if ((do_dw && (!xp || !dW_part || !db_part)) || !dyp || (DX && (!wr || !tiles || (s2 && !dyq)))) return PX_ERR_NOMEM;
  const float *wph[4] = {wr, NULL, NULL, NULL};
  if (DX && s2)
    for (int ph = 0; ph < 4; ph++) {
      px_c3_weights_dx2(&g, m->params[0].data, O, C, ph, wr + (size_t)ph * wrn);
      wph[ph] = wr + (size_t)ph * wrn;
    }
  else if (DX) px_c3_weights_dx(&g, m->params[0].data, O, C, wr);
  const float *X = px_f32(&c->x);
  const bool bias = c->has_bias;
  const int cblocks = (C + g.ob - 1) / g.ob, oblocks = dw_oblocks;
  const int64_t dx_items = DX && s2 ? N * cblocks : 0, dw_items = do_dw ? B * oblocks : 0;
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      if (!have_xp && do_dw) px_c3_pad(&g, X + (size_t)n * in_sample, C, xp + (size_t)n * xps);
      px_c3_pad_dy(&g, DY + (size_t)n * out_sample, O, dyp + (size_t)n * yps);
      if (dyq) px_c3_pad_dx2(&g, DY + (size_t)n * out_sample, O, dyq + (size_t)n * qps);
    }
    if (DX && !s2) c3_conv_all(&g, dyp, yps, O, wr, C, NULL, DX, in_sample, N, tiles);
    float *tile = DX && s2 ? tiles + (size_t)omp_get_thread_num() * tile_floats : NULL;
#pragma omp for schedule(static) nowait
    for (int64_t it = 0; it < dx_items; it++) {
      const int64_t n = it / cblocks;
      px_c3_dx2(&g, dyq + (size_t)n * qps, O, wph, C, (int)(it % cblocks), DX + (size_t)n * in_sample, tile);
    }
#pragma omp for schedule(static)
    for (int64_t it = 0; it < dw_items; it++) {
      const int64_t bi = it / oblocks, n0 = bi * N / B, n1 = (bi + 1) * N / B;
      const int bl = (int)(it % oblocks);
      px_c3_dw(&g, xp + (size_t)n0 * xps, C, dyp + (size_t)n0 * yps, O, bl, (int)(n1 - n0), dW_part + (size_t)bi * OK);
      if (bias)
        for (int64_t n = n0; n < n1; n++)
          for (int o = bl * g.ob; o < (bl + 1) * g.ob && o < O; o++) {
            const float *row = DY + (size_t)n * out_sample + (size_t)o * HWo;
            double sum = 0.0;
#pragma omp simd reduction(+ : sum)
            for (int q = 0; q < HWo; q++) sum += row[q];
            db_part[(size_t)bi * O + o] += sum;
          }
    }
  }
  if (do_dw)
    add_partials(B == 1 ? NULL : dW_part, db_part, B, OK, O, m->params[0].grad, bias ? m->params[1].grad : NULL);
  return PX_OK;
}

static px_status conv_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  conv2d *c = (conv2d *)m;
  const int64_t N = c->x.shape[0];
  const int H = (int)c->x.shape[2], W = (int)c->x.shape[3], O = c->out_c;
  const size_t K = (size_t)c->in_c * c->k * c->k, P = (size_t)c->Ho * c->Wo;
  const size_t in_sample = (size_t)c->in_c * H * W, out_sample = (size_t)O * P;
  if (dx) {
    px_status st = px_ctx_tensor_like(ctx, dx, &c->x);
    if (st != PX_OK) return st;
  }
  const float *X = px_f32(&c->x), *DY = px_f32(dy);
  float *DX = dx ? px_f32(dx) : NULL;
  float *dW = m->params[0].grad;
  float *db = c->has_bias ? m->params[1].grad : NULL;
#ifdef PX_HAVE_CUDA
  if (c->x.device == PX_CUDA) return conv_backward_cuda(c, ctx, DY, DX, ctx->compute_dtype == PX_BF16);
#endif
  if (use_direct(c)) return conv_backward_direct(c, ctx, DY, DX);

  // Blocks of consecutive samples: block bi holds samples [bi·N/B, (bi+1)·N/B).
  const size_t OK = (size_t)O * K;
  int64_t B = N < DW_BLOCKS ? N : DW_BLOCKS;
  if ((size_t)B > PART_BUDGET / OK) B = (int64_t)(PART_BUDGET / OK);
  if (B < 2) {
    float *cols = conv_cols(c, ctx, K * P, 1, false);
    double *dbs = px_arena_calloc(ctx->arena, (size_t)O * sizeof(double));
    if (!cols || !dbs) return PX_ERR_NOMEM;
    for (int64_t n = 0; n < N; n++)
      conv_backward_sample_wide(c, X + (size_t)n * in_sample, DY + (size_t)n * out_sample,
                                DX ? DX + (size_t)n * in_sample : NULL, cols, dW, db ? dbs : NULL, H, W);
    if (db)
      for (int o = 0; o < O; o++) db[o] += (float)dbs[o];
    return PX_OK;
  }
  const int T = team_size();
  const bool par = T > 1 && B > 1 && PX_PAR((size_t)N * K * P);
  float *cols = conv_cols(c, ctx, K * P, par ? T : 1, false);
  float *dW_part = px_arena_calloc(ctx->arena, (size_t)B * OK * sizeof(float));  /* (B, O, K) */
  double *db_part = px_arena_calloc(ctx->arena, (size_t)B * O * sizeof(double)); /* (B, O) */
  if (!cols || !dW_part || !db_part) return PX_ERR_NOMEM;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t bi = 0; bi < B; bi++) {
    float *col = cols + (size_t)omp_get_thread_num() * K * P;
    for (int64_t n = bi * N / B; n < (bi + 1) * N / B; n++)
      conv_backward_sample(c, X + (size_t)n * in_sample, DY + (size_t)n * out_sample,
                           DX ? DX + (size_t)n * in_sample : NULL, col, dW_part + (size_t)bi * OK,
                           db ? db_part + (size_t)bi * O : NULL, H, W);
  }
  // dW += Σ_b dW_part[b]   (in block order)
  add_partials(dW_part, db_part, B, OK, O, dW, db);
  return PX_OK;
}

// px_checkpoint_pair: backward needs x only (it rebuilds col_n from it);
// the col buffers forward left were released with the pair's internals, so
// backward must take fresh ones.
static void conv_rebind(px_module *m, const px_tensor *x) {
  conv2d *c = (conv2d *)m;
  c->x = *x;
  c->cols = NULL;
  c->n_cols = 0;
  c->xp = NULL;
}

static const px_module_ops conv2d_ops = {
  .type = "Conv2d",
  .forward = conv_forward,
  .backward = conv_backward,
  .rebind = conv_rebind,
};

px_module *px_conv2d(int in_channels, int out_channels, int kernel_size, int stride, int padding, bool bias) {
  if (in_channels <= 0 || out_channels <= 0 || kernel_size <= 0 || stride <= 0 || padding < 0) {
    px_error(PX_ERR_INVALID,
             "Conv2d(%d -> %d, k=%d, stride=%d, padding=%d): channels, kernel size and stride must be "
             "positive and padding non-negative",
             in_channels, out_channels, kernel_size, stride, padding);
    return NULL;
  }
  conv2d *c = (conv2d *)px_module_alloc(sizeof *c, &conv2d_ops);
  if (!c) return NULL;
  c->in_c = in_channels;
  c->out_c = out_channels;
  c->k = kernel_size;
  c->stride = stride;
  c->pad = padding;
  c->has_bias = bias;
  // PyTorch: kaiming_uniform(a=√5) on W and U(±1/√fan_in) on b, both
  // U(-1/√fan_in, 1/√fan_in) with fan_in = C·k·k.
  float bound = 1.0f / sqrtf((float)in_channels * kernel_size * kernel_size);
  int64_t wshape[4] = {out_channels, in_channels, kernel_size, kernel_size}, bshape[1] = {out_channels};
  px_module_add_param(&c->base, "weight", 4, wshape, PX_INIT_UNIFORM, bound, false);
  if (bias) px_module_add_param(&c->base, "bias", 1, bshape, PX_INIT_UNIFORM, bound, false);
  return &c->base;
}
