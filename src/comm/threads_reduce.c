// Reduction kernels of the threads backend:
//   dst[i] = src_0[i] ∘ src_1[i] ∘ ... ∘ src_{n-1}[i]     (AVG: then ÷ n)
// always left to right in rank order, so whichever rank computes an element
// gets the same bits, equal to the serial reduction x0 ∘ x1 ∘ ... ∘ x(n-1).
//
// Speed.  A large reduction is bound by memory, so the kernel makes one
// pass over its sources and writes dst once: two sources go straight into
// dst; more go through a block of the stack that stays in L1 (a running
// value for BLOCK elements), and the last source is fused with the store to
// dst (and the AVG division).  dst may be one of the sources exactly (a
// rank reduces its own slice in place): with at most two sources each lane
// reads its element before writing it, and with more the block has read
// every source's elements before dst's are written.  No partial overlaps
// occur, so `omp simd` (no loop-carried dependence) is correct and lets the
// compiler vectorise despite the possible aliasing, which its runtime
// overlap checks would otherwise send to the scalar loop.
//
// Non-temporal stores.  When dst is none of the sources (a reduce-scatter
// into a recv buffer) and the output at least STREAM_BYTES long (the
// caller says so for a piece of one: pxt_reduce_as), every block of SBLOCK
// elements is finished in L1 (the first two sources fused in one loop) and
// streamed to dst with non-temporal stores: an ordinary
// store first reads each line of dst from memory (write-allocate), a
// quarter of the traffic of a 2-rank reduction; streaming measured faster
// at 8-128 MiB.  In place (dst is a source, as in the all-reduce) its
// lines are already in the cache, and streaming them out measured slower,
// so those stores stay ordinary; so do small outputs, which the caller will
// likely read from the cache.  (The figures of this comment:
// docs/PERFORMANCE.md, "Figures behind code comments".)
//
// Four lanes.  A streamed reduction is mostly reads (N sources, one
// output), and on the 2-core guest reading is what costs: two threads
// reading 256 MiB each took longer than each copying 3/4 of that, unless
// each read four pages at once (bench/membw_read_vs_copy.c).  So the
// streamed path splits its piece into four lanes a quarter apart and
// reduces them in lockstep (4N read streams in flight), which measured
// faster than one lane at 2 and 4 ranks; a software prefetch of the next
// block instead was slower (docs/PERFORMANCE.md, "Threads all-gather and
// reduce-scatter" and "Figures behind code comments").
#include "comm/threads.h"

#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#define BLOCK 1024 /* elements of the running value: 4-8 KiB, in L1 */
#ifndef SBLOCK
/* Elements of a streamed block: 8-16 KiB, in L1 (512 and 8192 measured the
 * same at 256 MiB, docs/PERFORMANCE.md). */
#define SBLOCK 2048
#endif
#ifndef CBLOCK
#define CBLOCK (16u << 10) /* bytes of a block of pxt_copy_to_all: in L1 */
#endif

/* dst[0 .. bytes) = src with non-temporal stores where the ISA has them;
 * the caller fences once at the end (stream_fence). */
static void stream_copy(void *dst, const void *src, size_t bytes) {
#if defined(__AVX__) || defined(__SSE2__)
#if defined(__AVX__)
  enum { W = 32 };
#else
  enum { W = 16 };
#endif
  char *d = dst;
  const char *s = src;
  size_t head = (W - ((uintptr_t)d & (W - 1))) & (W - 1);
  if (head > bytes) head = bytes;
  memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= W; d += W, s += W, bytes -= W)
#if defined(__AVX__)
    _mm256_stream_si256((__m256i *)(void *)d, _mm256_loadu_si256((const __m256i *)(const void *)s));
#else
    _mm_stream_si128((__m128i *)(void *)d, _mm_loadu_si128((const __m128i *)(const void *)s));
#endif
  memcpy(d, s, bytes);
#else
  memcpy(dst, src, bytes);
#endif
}

/* Orders the streamed stores before whatever tells the peers we are done. */
static void stream_fence(void) {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/* Integers wrap as MPI's do, without signed-overflow UB. */
#define ADD_F(a, b) ((a) + (b))
#define ADD_I32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define ADD_I64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
/* The same expressions as the serial reference: for NaN the kept operand
 * matters, and x86's min/max instructions keep exactly this one. */
#define MIN_(a, b) ((b) < (a) ? (b) : (a))
#define MAX_(a, b) ((b) > (a) ? (b) : (a))

/* One kernel per (type, operation).  COMB(acc, next) folds the next rank's
 * value in; FIN(x) finishes: (x), or AVG's division by nn = n, fused with
 * the store so that AVG makes no second pass. */
#define DEF_KERNEL(NAME, T, COMB, FIN)                                                                            \
  static void NAME(T *dst, const void *const *srcs, int n, size_t count, bool stream) {                           \
    const T nn = (T)n, rnn = (T)1 / nn;                                                                           \
    (void)nn;                                                                                                     \
    (void)rnn;                                                                                                    \
    const T *s0 = srcs[0];                                                                                        \
    if (stream) {                                                                                                 \
      /* Four lanes a quarter of count apart, read in lockstep: 4N streams               \
       * in flight (above, "Four lanes"). */                        \
      _Alignas(64) T acc[SBLOCK];                                                                                 \
      const size_t L = SBLOCK / 4, qs = count / 4;                                                                \
      for (size_t base = 0; base < qs; base += L) {                                                               \
        size_t m = qs - base < L ? qs - base : L;                                                                 \
        const T *a = (const T *)srcs[0] + base;                                                                   \
        if (n == 1) {                                                                                             \
          _Pragma("omp simd") for (size_t i = 0; i < m; i++) {                                                    \
            acc[i] = FIN(a[i]);                                                                                   \
            acc[L + i] = FIN(a[qs + i]);                                                                          \
            acc[2 * L + i] = FIN(a[2 * qs + i]);                                                                  \
            acc[3 * L + i] = FIN(a[3 * qs + i]);                                                                  \
          }                                                                                                       \
        } else {                                                                                                  \
          const T *b = (const T *)srcs[1] + base;                                                                 \
          if (n == 2) {                                                                                           \
            _Pragma("omp simd") for (size_t i = 0; i < m; i++) {                                                  \
              acc[i] = FIN(COMB(a[i], b[i]));                                                                     \
              acc[L + i] = FIN(COMB(a[qs + i], b[qs + i]));                                                       \
              acc[2 * L + i] = FIN(COMB(a[2 * qs + i], b[2 * qs + i]));                                           \
              acc[3 * L + i] = FIN(COMB(a[3 * qs + i], b[3 * qs + i]));                                           \
            }                                                                                                     \
          } else {                                                                                                \
            _Pragma("omp simd") for (size_t i = 0; i < m; i++) {                                                  \
              acc[i] = COMB(a[i], b[i]);                                                                          \
              acc[L + i] = COMB(a[qs + i], b[qs + i]);                                                            \
              acc[2 * L + i] = COMB(a[2 * qs + i], b[2 * qs + i]);                                                \
              acc[3 * L + i] = COMB(a[3 * qs + i], b[3 * qs + i]);                                                \
            }                                                                                                     \
            for (int k = 2; k < n - 1; k++) {                                                                     \
              const T *c = (const T *)srcs[k] + base;                                                             \
              _Pragma("omp simd") for (size_t i = 0; i < m; i++) {                                                \
                acc[i] = COMB(acc[i], c[i]);                                                                      \
                acc[L + i] = COMB(acc[L + i], c[qs + i]);                                                         \
                acc[2 * L + i] = COMB(acc[2 * L + i], c[2 * qs + i]);                                             \
                acc[3 * L + i] = COMB(acc[3 * L + i], c[3 * qs + i]);                                             \
              }                                                                                                   \
            }                                                                                                     \
            const T *z = (const T *)srcs[n - 1] + base;                                                           \
            _Pragma("omp simd") for (size_t i = 0; i < m; i++) {                                                  \
              acc[i] = FIN(COMB(acc[i], z[i]));                                                                   \
              acc[L + i] = FIN(COMB(acc[L + i], z[qs + i]));                                                      \
              acc[2 * L + i] = FIN(COMB(acc[2 * L + i], z[2 * qs + i]));                                          \
              acc[3 * L + i] = FIN(COMB(acc[3 * L + i], z[3 * qs + i]));                                          \
            }                                                                                                     \
          }                                                                                                       \
        }                                                                                                         \
        for (int j = 0; j < 4; j++) stream_copy(dst + (size_t)j * qs + base, acc + (size_t)j * L, m * sizeof(T)); \
      }                                                                                                           \
      /* The last count % 4 elements, one lane. */                                                                \
      for (size_t i = 4 * qs; i < count; i++) {                                                                   \
        T v = ((const T *)srcs[0])[i];                                                                            \
        for (int k = 1; k < n; k++) v = COMB(v, ((const T *)srcs[k])[i]);                                         \
        dst[i] = FIN(v);                                                                                          \
      }                                                                                                           \
      stream_fence();                                                                                             \
      return;                                                                                                     \
    }                                                                                                             \
    if (n == 1) {                                                                                                 \
      _Pragma("omp simd") for (size_t i = 0; i < count; i++) dst[i] = FIN(s0[i]);                                 \
      return;                                                                                                     \
    }                                                                                                             \
    if (n == 2) {                                                                                                 \
      const T *s1 = srcs[1];                                                                                      \
      _Pragma("omp simd") for (size_t i = 0; i < count; i++) dst[i] = FIN(COMB(s0[i], s1[i]));                    \
      return;                                                                                                     \
    }                                                                                                             \
    T acc[BLOCK];                                                                                                 \
    for (size_t base = 0; base < count; base += BLOCK) {                                                          \
      size_t m = count - base < BLOCK ? count - base : BLOCK;                                                     \
      const T *a = (const T *)srcs[0] + base, *b = (const T *)srcs[1] + base;                                     \
      _Pragma("omp simd") for (size_t i = 0; i < m; i++) acc[i] = COMB(a[i], b[i]);                               \
      for (int k = 2; k < n - 1; k++) {                                                                           \
        const T *s = (const T *)srcs[k] + base;                                                                   \
        _Pragma("omp simd") for (size_t i = 0; i < m; i++) acc[i] = COMB(acc[i], s[i]);                           \
      }                                                                                                           \
      const T *z = (const T *)srcs[n - 1] + base;                                                                 \
      T *d = dst + base;                                                                                          \
      _Pragma("omp simd") for (size_t i = 0; i < m; i++) d[i] = FIN(COMB(acc[i], z[i]));                          \
    }                                                                                                             \
  }

#define NOFIN(x) (x)
/* AVG divides by n (integers truncate) exactly as the serial reference
 * does: by division, not by a reciprocal. */
#define AVGFIN(x) ((x) / nn)
/* Floating point with n a power of two: x / n and x × (1/n) are the same
 * correctly rounded x·2^-k, so the multiplication gives the division's
 * bits, and a vector division per element was the slowest part of the
 * pass (DDP's averaging all-reduce: docs/PERFORMANCE.md, "Figures behind
 * code comments"). */
#define AVGP2FIN(x) ((x)*rnn)
#define DEF_TYPE(SUF, T, ADD)           \
  DEF_KERNEL(sum_##SUF, T, ADD, NOFIN)  \
  DEF_KERNEL(avg_##SUF, T, ADD, AVGFIN) \
  DEF_KERNEL(min_##SUF, T, MIN_, NOFIN) \
  DEF_KERNEL(max_##SUF, T, MAX_, NOFIN)

DEF_TYPE(f32, float, ADD_F)
DEF_TYPE(f64, double, ADD_F)
DEF_TYPE(i32, int32_t, ADD_I32)
DEF_TYPE(i64, int64_t, ADD_I64)
DEF_KERNEL(avgp2_f32, float, ADD_F, AVGP2FIN)
DEF_KERNEL(avgp2_f64, double, ADD_F, AVGP2FIN)

#define DISPATCH(SUF, T, AVG)                                      \
  switch (op) {                                                    \
  case PX_SUM: sum_##SUF((T *)dst, srcs, n, count, stream); break; \
  case PX_AVG: (AVG)((T *)dst, srcs, n, count, stream); break;     \
  case PX_MIN: min_##SUF((T *)dst, srcs, n, count, stream); break; \
  case PX_MAX: max_##SUF((T *)dst, srcs, n, count, stream); break; \
  }

void pxt_reduce_to_all(void *const *bufs, const void **blk, int n, size_t count, px_dtype dt, px_reduce_op op) {
  size_t es = px_dtype_size(dt);
  _Alignas(64) unsigned char acc[BLOCK * 8];  // in L1; reduced once, stored n times
  size_t per = sizeof acc / es;
  for (size_t base = 0; base < count; base += per) {
    size_t m = count - base < per ? count - base : per;
    for (int k = 0; k < n; k++) blk[k] = (const char *)bufs[k] + base * es;
    pxt_reduce(acc, blk, n, m, dt, op);
    for (int k = 0; k < n; k++) memcpy((char *)bufs[k] + base * es, acc, m * es);
  }
}

void pxt_reduce(void *dst, const void *const *srcs, int n, size_t count, px_dtype dt, px_reduce_op op) {
  pxt_reduce_as(dst, srcs, n, count, dt, op, count * px_dtype_size(dt) >= STREAM_BYTES);
}

void pxt_reduce_as(void *dst, const void *const *srcs, int n, size_t count, px_dtype dt, px_reduce_op op, bool stream) {
  for (int k = 0; k < n && stream; k++) stream = srcs[k] != dst;
  const bool pow2 = (n & (n - 1)) == 0;
  switch (dt) {
  case PX_F32: DISPATCH(f32, float, pow2 ? avgp2_f32 : avg_f32) break;
  case PX_F64: DISPATCH(f64, double, pow2 ? avgp2_f64 : avg_f64) break;
  case PX_I32: DISPATCH(i32, int32_t, avg_i32) break;
  case PX_I64: DISPATCH(i64, int64_t, avg_i64) break;
  default: break;  // comm.c admits only the four above
  }
}

void pxt_copy_to_all(void *const *dsts, int n, const void *src, size_t bytes, bool stream) {
  const char *s = src;
  for (size_t base = 0; base < bytes; base += CBLOCK) {
    size_t m = bytes - base < CBLOCK ? bytes - base : CBLOCK;
    for (int k = 0; k < n; k++) {
      char *d = (char *)dsts[k];
      if (d == s) continue;  // in place: already there
      if (stream) stream_copy(d + base, s + base, m);
      else memcpy(d + base, s + base, m);
    }
  }
  if (stream) stream_fence();
}
