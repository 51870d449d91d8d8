/* Claim: on 2, 3 and 4 threads, a reduce-scatter large enough to be
 * reduced in claimed pieces with non-temporal stores (threads_coll.c: a
 * recv of STREAM_BYTES, 16 MiB, or more; threads_reduce.c: each piece read as four lanes
 * a quarter apart, plus a tail of count % 4 elements) gives every rank the
 * serial rank-order bits x0 ∘ x1 ∘ ... ∘ x(N-1) of its block, for F32 SUM,
 * F64 AVG, F32 MAX and I32 SUM, with a last piece whose length is not a
 * multiple of 4, and writes nothing past the end of any recv.  If it
 * failed, ZeRO's gradient reduce-scatter would give ranks other sums than
 * one process computes, or overwrite the caller's memory. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 256
/* 4 Mi + 4099 elements a block: 16 MiB and more of F32, and a last claimed
 * piece of 4099 elements (64 KiB pieces of 16384 F32 or 8192 F64). */
#define COUNT ((size_t)(4u << 20) + 4099)

static double val(int r, size_t i) {
  uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(r + 1) * 0x9e3779b9u;
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  return ((double)(x >> 8) / 16777216.0 - 0.5) * (1.0 + r);
}

static void check(px_comm *c, px_dtype t, px_reduce_op op, const char *what) {
  const int n = px_comm_size(c), r = px_comm_rank(c);
  const size_t es = px_dtype_size(t), total = (size_t)n * COUNT;
  unsigned char *send = malloc(total * es), *recv = malloc(COUNT * es + GUARD), *want = malloc(COUNT * es);
  CHECK(send && recv && want, "out of memory");
  if (!send || !recv || !want) return;
  for (size_t i = 0; i < total; i++) {
    double v = val(r, i);
    if (t == PX_F32) ((float *)send)[i] = (float)v;
    else if (t == PX_F64) ((double *)send)[i] = v;
    else ((int32_t *)send)[i] = (int32_t)(v * 1e9);
  }
  // The serial rank-order reduction of block r.
  for (size_t i = 0; i < COUNT; i++) {
    size_t at = (size_t)r * COUNT + i;
    if (t == PX_F32) {
      float a = (float)val(0, at);
      for (int k = 1; k < n; k++) {
        float b = (float)val(k, at);
        a = op == PX_MAX ? (b > a ? b : a) : a + b;
      }
      ((float *)want)[i] = a;
    } else if (t == PX_F64) {
      double a = val(0, at);
      for (int k = 1; k < n; k++) a = a + val(k, at);
      ((double *)want)[i] = op == PX_AVG ? a / n : a;
    } else {
      uint32_t a = (uint32_t)(int32_t)(val(0, at) * 1e9);
      for (int k = 1; k < n; k++) a += (uint32_t)(int32_t)(val(k, at) * 1e9);
      ((int32_t *)want)[i] = (int32_t)a;
    }
  }
  memset(recv, 0xA5, COUNT * es + GUARD);
  CHECK_OK(px_comm_reduce_scatter(c, send, recv, COUNT, t, op));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < COUNT; i++)
    if (memcmp(recv + i * es, want + i * es, es) && bad++ == 0) first = i;
  CHECK(bad == 0, "streamed reduce_scatter %s: rank %d of %d has %zu elements not the serial bits, the first at %zu",
        what, r, n, bad, first);
  size_t over = 0;
  for (size_t i = COUNT * es; i < COUNT * es + GUARD; i++) over += recv[i] != 0xA5;
  CHECK(over == 0, "streamed reduce_scatter %s wrote %zu bytes past rank %d's recv", what, over, r);
  CHECK_OK(px_comm_barrier(c));  // no rank frees a buffer a peer may still write
  free(send);
  free(recv);
  free(want);
}

static int rank_main(px_comm *c, void *arg) {
  (void)arg;
  check(c, PX_F32, PX_SUM, "F32 SUM");
  check(c, PX_F64, PX_AVG, "F64 AVG");
  check(c, PX_F32, PX_MAX, "F32 MAX");
  check(c, PX_I32, PX_SUM, "I32 SUM");
  return 0;
}

int main(void) {
  for (int n = 2; n <= 4; n++) {
    int code = -1;
    CHECK_OK(px_comm_run(n, rank_main, NULL, &code));
    CHECK(code == 0, "px_comm_run(%d) exit code %d", n, code);
  }
  return px_test_finish("test_comm_threads_streamed_reduce_scatter_is_serial_bits");
}
