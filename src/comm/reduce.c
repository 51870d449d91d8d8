// Reduction kernels of the threads backend:
//   dst[i] = src_0[i] ∘ src_1[i] ∘ ... ∘ src_{n-1}[i]
// always in rank order, so whichever rank computes an element gets the same
// bits, and they equal the serial left-to-right reduction.
#include "comm/internal.h"

#include <string.h>

/* Chunked through a stack buffer: every source's chunk is read before dst's
 * chunk is written, so dst may be one of the sources (a rank's own slice). */
#define RCHUNK 512
#define FADD(a, b) ((a) + (b))
/* Integers wrap as MPI's do, without signed-overflow UB. */
#define IADD32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define IADD64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define DEF_REDUCE(NAME, T, ADD)                                                        \
  static void NAME(void *dst_, const void *const *srcs, int n, size_t count, px_reduce_op op) { \
    T tmp[RCHUNK];                                                                      \
    T *dst = dst_;                                                                      \
    for (size_t base = 0; base < count; base += RCHUNK) {                              \
      size_t m = count - base < RCHUNK ? count - base : RCHUNK;                         \
      memcpy(tmp, (const T *)srcs[0] + base, m * sizeof(T));                            \
      for (int k = 1; k < n; k++) {                                                     \
        const T *s = (const T *)srcs[k] + base;                                         \
        if (op == PX_SUM || op == PX_AVG)                                               \
          for (size_t i = 0; i < m; i++) tmp[i] = ADD(tmp[i], s[i]);                    \
        else if (op == PX_MIN)                                                          \
          for (size_t i = 0; i < m; i++) tmp[i] = s[i] < tmp[i] ? s[i] : tmp[i];        \
        else                                                                            \
          for (size_t i = 0; i < m; i++) tmp[i] = s[i] > tmp[i] ? s[i] : tmp[i];        \
      }                                                                                 \
      if (op == PX_AVG)                                                                 \
        for (size_t i = 0; i < m; i++) tmp[i] = (T)(tmp[i] / (T)n);                     \
      memcpy(dst + base, tmp, m * sizeof(T));                                           \
    }                                                                                   \
  }
DEF_REDUCE(reduce_f32, float, FADD)
DEF_REDUCE(reduce_f64, double, FADD)
DEF_REDUCE(reduce_i32, int32_t, IADD32)
DEF_REDUCE(reduce_i64, int64_t, IADD64)

void px_comm_reduce(void *dst, const void *const *srcs, int n, size_t count, px_dtype dt, px_reduce_op op) {
  switch (dt) {
  case PX_F32: reduce_f32(dst, srcs, n, count, op); break;
  case PX_F64: reduce_f64(dst, srcs, n, count, op); break;
  case PX_I32: reduce_i32(dst, srcs, n, count, op); break;
  case PX_I64: reduce_i64(dst, srcs, n, count, op); break;
  default: break; // comm.c admits only the four above
  }
}
