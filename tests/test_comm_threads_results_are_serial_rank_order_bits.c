/* Claim: on 2, 3 and 4 threads, every collective of the threads backend
 * gives, on every rank, exactly the bits of the serial reduction in rank
 * order, x0 ∘ x1 ∘ ... ∘ x(N-1) (AVG: that sum ÷ N), for every dtype and
 * op, for odd counts on both sides of the all-reduce's switches (whole
 * below 16 KiB, claimed chunks, fixed slices past 32 MiB), with pieces that
 * end mid cache line; NaN and signed zeros included, where MIN and MAX must
 * keep the same operand as the serial code.  All-gather and broadcast move every byte.  The asynchronous
 * variants, started interleaved with blocking calls and with each other
 * and waited in another order, give the same bits; so do thousands of
 * back-to-back tiny all-reduces (each reusing the rendezvous slots).
 * Point-to-point messages, small and large, arrive whole and in order.
 * If it failed, ranks would drift apart in training, DDP on N threads
 * would not equal one process on the N-fold batch bit for bit, or a fast
 * path would have changed the numbers. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdint.h>
#include <string.h>

/* ---- Rank r's value at element i ------------------------------------------------
 * Hash-based and scaled by (1 + r), so that sums round differently in
 * different orders; about one element in 61 is NaN, -0 or +0. */
static uint32_t hash3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t x = a * 2654435761u ^ b * 0x9e3779b9u ^ c * 0x85ebca6bu;
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  x *= 0x297a2d39u;
  x ^= x >> 15;
  return x;
}

static double special(int r, size_t i) {
  switch (hash3((uint32_t)i, (uint32_t)r, 9) % 3) {
  case 0: return NAN;
  case 1: return -0.0;
  default: return 0.0;
  }
}

static bool is_special(int r, size_t i) { return hash3((uint32_t)i, (uint32_t)r, 7) % 61 == 0; }

static float v_f32(int r, size_t i, uint32_t salt) {
  if (is_special(r, i)) return (float)special(r, i);
  return ((float)(hash3((uint32_t)i, (uint32_t)r, salt) >> 8) / 16777216.0f - 0.5f) * (1.0f + (float)r);
}
static double v_f64(int r, size_t i, uint32_t salt) {
  if (is_special(r, i)) return special(r, i);
  uint64_t x = (uint64_t)hash3((uint32_t)i, (uint32_t)r, salt) << 21 ^ hash3((uint32_t)i, (uint32_t)r, salt + 1);
  return ((double)(x & ((1ull << 53) - 1)) / 9007199254740992.0 - 0.5) * (1.0 + r);
}
/* Integers near the ends of their range, so sums wrap. */
static int32_t v_i32(int r, size_t i, uint32_t salt) { return (int32_t)hash3((uint32_t)i, (uint32_t)r, salt); }
static int64_t v_i64(int r, size_t i, uint32_t salt) {
  return (int64_t)((uint64_t)hash3((uint32_t)i, (uint32_t)r, salt) << 32 | hash3((uint32_t)i, (uint32_t)r, salt + 3));
}

static void fill(void *buf, px_dtype t, int r, size_t first, size_t count, uint32_t salt) {
  for (size_t i = 0; i < count; i++) switch (t) {
    case PX_F32: ((float *)buf)[i] = v_f32(r, first + i, salt); break;
    case PX_F64: ((double *)buf)[i] = v_f64(r, first + i, salt); break;
    case PX_I32: ((int32_t *)buf)[i] = v_i32(r, first + i, salt); break;
    default: ((int64_t *)buf)[i] = v_i64(r, first + i, salt); break;
    }
}

/* The serial reduction over ranks 0..n-1 of elements first .. first+count-1,
 * left to right, written as the backend must write it. */
#define SERIAL(T, GEN, WRAP)                                \
  for (size_t i = 0; i < count; i++) {                      \
    T acc = GEN(0, first + i, salt);                        \
    for (int k = 1; k < n; k++) {                           \
      T v = GEN(k, first + i, salt);                        \
      if (op == PX_SUM || op == PX_AVG) acc = WRAP(acc, v); \
      else if (op == PX_MIN) acc = v < acc ? v : acc;       \
      else acc = v > acc ? v : acc;                         \
    }                                                       \
    if (op == PX_AVG) acc = (T)(acc / (T)n);                \
    ((T *)out)[i] = acc;                                    \
  }
#define FADD(a, b) ((a) + (b))
#define IADD32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define IADD64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
static void serial(void *out, px_dtype t, px_reduce_op op, int n, size_t first, size_t count, uint32_t salt) {
  switch (t) {
  case PX_F32: SERIAL(float, v_f32, FADD) break;
  case PX_F64: SERIAL(double, v_f64, FADD) break;
  case PX_I32: SERIAL(int32_t, v_i32, IADD32) break;
  default: SERIAL(int64_t, v_i64, IADD64) break;
  }
}

static const px_dtype types[] = {PX_F32, PX_F64, PX_I32, PX_I64};
static const px_reduce_op ops[] = {PX_SUM, PX_AVG, PX_MIN, PX_MAX};
static const char *op_name(px_reduce_op op) {
  return op == PX_SUM ? "SUM" : op == PX_AVG ? "AVG" : op == PX_MIN ? "MIN" : "MAX";
}

/* Bitwise: memcmp, so -0 differs from +0 and NaN equals itself. */
static void expect_bits(const void *have, const void *want, size_t count, px_dtype t, const char *what, int r, int n) {
  size_t es = px_dtype_size(t);
  if (memcmp(have, want, count * es) == 0) return;
  size_t i = 0;
  while (memcmp((const char *)have + i * es, (const char *)want + i * es, es) == 0) i++;
  CHECK(0, "%s, %s, n=%d, count %zu: rank %d's element %zu differs from the serial rank-order result", what,
        px_dtype_name(t), n, count, r, i);
}

static const size_t counts[] = {1, 3, 17, 1023, 4095, 4097, 33333, 262147};
#define NCOUNTS (sizeof counts / sizeof *counts)

static void check_allreduce(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  for (size_t ci = 0; ci < NCOUNTS; ci++)
    for (int ti = 0; ti < 4; ti++)
      for (int oi = 0; oi < 4; oi++) {
        size_t count = counts[ci];
        px_dtype t = types[ti];
        uint32_t salt = (uint32_t)(ci * 16 + (size_t)ti * 4 + (size_t)oi);
        void *buf = malloc(count * 8), *want = malloc(count * 8);
        fill(buf, t, r, 0, count, salt);
        serial(want, t, ops[oi], n, 0, count, salt);
        CHECK_OK(px_comm_allreduce(c, buf, count, t, ops[oi]));
        char what[64];
        snprintf(what, sizeof what, "allreduce %s", op_name(ops[oi]));
        expect_bits(buf, want, count, t, what, r, n);
        free(buf);
        free(want);
      }
}

static void check_reduce_scatter(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  for (size_t ci = 0; ci < NCOUNTS; ci++)
    for (int ti = 0; ti < 4; ti++)
      for (int oi = 0; oi < 4; oi++) {
        size_t count = counts[ci];
        px_dtype t = types[ti];
        uint32_t salt = (uint32_t)(1000 + ci * 16 + (size_t)ti * 4 + (size_t)oi);
        void *send = malloc((size_t)n * count * 8), *recv = malloc(count * 8), *want = malloc(count * 8);
        fill(send, t, r, 0, (size_t)n * count, salt);
        serial(want, t, ops[oi], n, (size_t)r * count, count, salt);
        CHECK_OK(px_comm_reduce_scatter(c, send, recv, count, t, ops[oi]));
        char what[64];
        snprintf(what, sizeof what, "reduce_scatter %s", op_name(ops[oi]));
        expect_bits(recv, want, count, t, what, r, n);
        free(send);
        free(recv);
        free(want);
      }
}

/* All-reduces past 32 MiB take another path (fixed slices, then copies):
 * the same bits. */
static void check_allreduce_huge(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  const size_t count = 8388613;  // F32: 32 MiB + 20 B
  float *buf = malloc(count * 4), *want = malloc(count * 4);
  fill(buf, PX_F32, r, 0, count, 4242);
  serial(want, PX_F32, PX_SUM, n, 0, count, 4242);
  CHECK_OK(px_comm_allreduce(c, buf, count, PX_F32, PX_SUM));
  expect_bits(buf, want, count, PX_F32, "allreduce SUM of 32 MiB", r, n);
  free(buf), free(want);
}

/* Outputs of STREAM_BYTES (16 MiB) and more are written with non-temporal
 * stores: the same bits, from ragged starts (recv one element past an
 * aligned address). */
static void check_reduce_scatter_streamed(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  const size_t count = 4194307;  // F32 and I32: 16 MiB + 12 B; F64: 32 MiB + 24 B
  const px_dtype ts[] = {PX_F32, PX_F64, PX_I32};
  const px_reduce_op os[] = {PX_SUM, PX_AVG, PX_MAX};
  for (int q = 0; q < 3; q++) {
    size_t es = px_dtype_size(ts[q]);
    void *send = malloc((size_t)n * count * es), *recv0 = malloc((count + 1) * es), *want = malloc(count * es);
    void *recv = (char *)recv0 + es;
    fill(send, ts[q], r, 0, (size_t)n * count, (uint32_t)(3000 + q));
    serial(want, ts[q], os[q], n, (size_t)r * count, count, (uint32_t)(3000 + q));
    CHECK_OK(px_comm_reduce_scatter(c, send, recv, count, ts[q], os[q]));
    char what[64];
    snprintf(what, sizeof what, "streamed reduce_scatter %s", op_name(os[q]));
    expect_bits(recv, want, count, ts[q], what, r, n);
    free(send), free(recv0), free(want);
  }
}

static void check_allgather_broadcast(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  for (size_t ci = 0; ci < NCOUNTS; ci++) {
    size_t count = counts[ci];
    // All-gather of bytes: rank k's block is byte pattern k.
    unsigned char *send = malloc(count), *recv = malloc((size_t)n * count), *want = malloc((size_t)n * count);
    for (size_t i = 0; i < count; i++) send[i] = (unsigned char)hash3((uint32_t)i, (uint32_t)r, 77);
    for (int k = 0; k < n; k++)
      for (size_t i = 0; i < count; i++)
        want[(size_t)k * count + i] = (unsigned char)hash3((uint32_t)i, (uint32_t)k, 77);
    memset(recv, 0xEE, (size_t)n * count);
    CHECK_OK(px_comm_allgather(c, send, recv, count, PX_U8));
    CHECK(memcmp(recv, want, (size_t)n * count) == 0, "allgather U8 count %zu wrong on rank %d", count, r);
    // In place: my block already sits in recv.
    memset(recv, 0xEE, (size_t)n * count);
    memcpy(recv + (size_t)r * count, send, count);
    CHECK_OK(px_comm_allgather(c, recv + (size_t)r * count, recv, count, PX_U8));
    CHECK(memcmp(recv, want, (size_t)n * count) == 0, "in-place allgather count %zu wrong on rank %d", count, r);
    // Broadcast of doubles (NaNs and zeros move as bits) from every root.
    double *b = malloc(count * sizeof *b), *bw = malloc(count * sizeof *bw);
    for (int root = 0; root < n; root++) {
      fill(bw, PX_F64, root, 0, count, 55);
      if (r == root) memcpy(b, bw, count * sizeof *b);
      else memset(b, 0xEE, count * sizeof *b);
      CHECK_OK(px_comm_broadcast(c, b, count, PX_F64, root));
      CHECK(memcmp(b, bw, count * sizeof *b) == 0, "broadcast count %zu from root %d wrong on rank %d", count, root, r);
    }
    free(b);
    free(bw);
    free(send);
    free(recv);
    free(want);
  }
}

/* Asynchronous and blocking calls interleaved; waited in another order. */
static void check_async_interleaved(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  for (size_t ci = 0; ci < NCOUNTS; ci += 2) {
    size_t count = counts[ci];
    uint32_t salt = (uint32_t)(5000 + ci);
    float *a1 = malloc(count * 4), *w1 = malloc(count * 4);
    double *a2 = malloc(count * 8), *w2 = malloc(count * 8);
    int64_t *rs_send = malloc((size_t)n * count * 8), *rs = malloc(count * 8), *wrs = malloc(count * 8);
    int32_t *ag = malloc(count * 4), *agr = malloc((size_t)n * count * 4), *wag = malloc((size_t)n * count * 4);
    double *bc = malloc(count * 8), *wbc = malloc(count * 8);
    float *blk = malloc(count * 4), *wblk = malloc(count * 4);
    fill(a1, PX_F32, r, 0, count, salt);
    serial(w1, PX_F32, PX_SUM, n, 0, count, salt);
    fill(a2, PX_F64, r, 0, count, salt + 1);
    serial(w2, PX_F64, PX_MAX, n, 0, count, salt + 1);
    fill(rs_send, PX_I64, r, 0, (size_t)n * count, salt + 2);
    serial(wrs, PX_I64, PX_AVG, n, (size_t)r * count, count, salt + 2);
    fill(ag, PX_I32, r, 0, count, salt + 3);
    for (int k = 0; k < n; k++) fill(wag + (size_t)k * count, PX_I32, k, 0, count, salt + 3);
    fill(wbc, PX_F64, n - 1, 0, count, salt + 4);
    if (r == n - 1) memcpy(bc, wbc, count * 8);
    else memset(bc, 0, count * 8);
    fill(blk, PX_F32, r, 0, count, salt + 5);
    serial(wblk, PX_F32, PX_AVG, n, 0, count, salt + 5);

    px_request *q[5];
    CHECK_OK(px_comm_iallreduce(c, a1, count, PX_F32, PX_SUM, &q[0]));
    CHECK_OK(px_comm_ireduce_scatter(c, rs_send, rs, count, PX_I64, PX_AVG, &q[1]));
    // A blocking collective queues behind the started ones.
    CHECK_OK(px_comm_allreduce(c, blk, count, PX_F32, PX_AVG));
    CHECK_OK(px_comm_iallgather(c, ag, agr, count, PX_I32, &q[2]));
    CHECK_OK(px_comm_ibroadcast(c, bc, count, PX_F64, n - 1, &q[3]));
    CHECK_OK(px_comm_iallreduce(c, a2, count, PX_F64, PX_MAX, &q[4]));
    for (int k = 4; k >= 0; k--) CHECK_OK(px_request_wait(q[k]));
    expect_bits(a1, w1, count, PX_F32, "iallreduce SUM", r, n);
    expect_bits(a2, w2, count, PX_F64, "iallreduce MAX", r, n);
    expect_bits(rs, wrs, count, PX_I64, "ireduce_scatter AVG", r, n);
    expect_bits(agr, wag, (size_t)n * count, PX_I32, "iallgather", r, n);
    expect_bits(bc, wbc, count, PX_F64, "ibroadcast", r, n);
    expect_bits(blk, wblk, count, PX_F32, "allreduce AVG between async ones", r, n);
    free(a1), free(w1), free(a2), free(w2), free(rs_send), free(rs), free(wrs);
    free(ag), free(agr), free(wag), free(bc), free(wbc), free(blk), free(wblk);
  }
}

/* Many tiny all-reduces in a row, of changing lengths and dtypes. */
static void check_back_to_back(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  for (int it = 0; it < 3000; it++) {
    size_t count = 1 + (size_t)it % 5;
    px_dtype t = types[it % 4];
    px_reduce_op op = ops[(it / 4) % 4];
    uint64_t buf[5], want[5];
    fill(buf, t, r, 0, count, (uint32_t)it);
    serial(want, t, op, n, 0, count, (uint32_t)it);
    CHECK_OK(px_comm_allreduce(c, buf, count, t, op));
    if (memcmp(buf, want, count * px_dtype_size(t)) != 0) {
      CHECK(0, "back-to-back allreduce %d (%s %s, count %zu) wrong on rank %d", it, px_dtype_name(t), op_name(op),
            count, r);
      break;
    }
    if (it % 500 == 0) CHECK_OK(px_comm_barrier(c));
  }
}

/* Point-to-point moves every byte, small and large (a large send with no
 * receive posted yet waits briefly, then buffers): a ping-pong between
 * neighbours, then a ring where every rank sends two large messages on one
 * tag before it receives, which must arrive in order. */
static void check_point_to_point(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  int right = (r + 1) % n, left = (r + n - 1) % n;
  for (size_t ci = 0; ci < NCOUNTS; ci++) {
    size_t count = counts[ci];
    float *x = malloc(count * 4), *want = malloc(count * 4);
    // Pairs (0,1), (2,3): the even rank starts; 3 ranks: rank 2 sits out.
    int peer = r % 2 == 0 ? r + 1 : r - 1;
    if (peer < n) {
      for (int round = 0; round < 4; round++) {
        int sender = round % 2 == 0 ? (r % 2 == 0 ? r : peer) : (r % 2 == 0 ? peer : r);
        fill(want, PX_F32, sender, 0, count, (uint32_t)(9000 + round));
        if (sender == r) {
          memcpy(x, want, count * 4);
          CHECK_OK(px_comm_send(c, x, count, PX_F32, peer, round));
        } else {
          memset(x, 0xEE, count * 4);
          CHECK_OK(px_comm_recv(c, x, count, PX_F32, peer, round));
          expect_bits(x, want, count, PX_F32, "ping-pong", r, n);
        }
      }
    }
    free(x);
    free(want);
  }
  size_t count = 262147;
  float *a = malloc(count * 4), *b = malloc(count * 4), *in = malloc(count * 4), *want = malloc(count * 4);
  fill(a, PX_F32, r, 0, count, 31);
  fill(b, PX_F32, r, 0, count, 32);
  CHECK_OK(px_comm_send(c, a, count, PX_F32, right, 8));
  CHECK_OK(px_comm_send(c, b, count, PX_F32, right, 8));
  memset(a, 0, count * 4), memset(b, 0, count * 4);  // sent means copied
  for (uint32_t salt = 31; salt <= 32; salt++) {
    fill(want, PX_F32, left, 0, count, salt);
    CHECK_OK(px_comm_recv(c, in, count, PX_F32, left, 8));
    expect_bits(in, want, count, PX_F32, salt == 31 ? "ring, first message" : "ring, second message", r, n);
  }
  free(a), free(b), free(in), free(want);
  CHECK_OK(px_comm_barrier(c));
}

static int rank_main(px_comm *c, void *arg) {
  (void)arg;
  check_allreduce(c);
  check_allreduce_huge(c);
  check_reduce_scatter(c);
  check_reduce_scatter_streamed(c);
  check_allgather_broadcast(c);
  check_async_interleaved(c);
  check_back_to_back(c);
  check_point_to_point(c);
  return 0;
}

int main(void) {
  for (int n = 2; n <= 4; n++) {
    int code = -1;
    double t0 = px_time_now();
    CHECK_OK(px_comm_run(n, rank_main, NULL, &code));
    CHECK(code == 0, "px_comm_run(%d) exit code %d", n, code);
    printf("%d ranks: %.2f s\n", n, px_time_now() - t0);
  }
  return px_test_finish("test_comm_threads_results_are_serial_rank_order_bits");
}
