/* test_comm_checks.h — the collective checks every backend must pass, shared
 * by test_comm_threads_collectives_match_serial.c (self and threads) and
 * test_comm_collectives_mpi.c (MPI).  Each rank calls comm_checks(c, exact).
 *
 * exact: the backend promises the serial result bit for bit (threads and
 * self sum in rank order 0, 1, ..., N-1).  MPI picks its own order, so
 * there sums are compared with a tolerance; every rank must still get the
 * same bits.  Include it after defining _POSIX_C_SOURCE (nanosleep). */
#ifndef TEST_COMM_CHECKS_H
#define TEST_COMM_CHECKS_H

#include "px_test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

/* ---- Rank r's value at element i, per dtype ---------------------------------
 * Hash-based, and scaled by (1 + r) so magnitudes differ between ranks:
 * float sums then round differently in different orders, which is what the
 * bitwise checks need to be meaningful. */
static uint32_t cc_hash(int r, size_t i, uint32_t salt) {
  uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)r * 0x9e3779b9u ^ salt * 0x85ebca6bu;
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  x *= 0x297a2d39u;
  x ^= x >> 15;
  return x;
}
static float cc_f32(int r, size_t i) {
  return ((float)(cc_hash(r, i, 1) >> 8) / 16777216.0f - 0.5f) * (1.0f + (float)r);
}
static double cc_f64(int r, size_t i) {
  uint64_t x = (uint64_t)cc_hash(r, i, 2) << 21 ^ cc_hash(r, i, 3);
  return ((double)(x & ((1ull << 53) - 1)) / 9007199254740992.0 - 0.5) * (1.0 + r);
}
static int32_t cc_i32(int r, size_t i) { return (int32_t)(cc_hash(r, i, 4) % 2001u) - 1000; }
static int64_t cc_i64(int r, size_t i) { return ((int64_t)(cc_hash(r, i, 5) % 1000003u) << 20) - ((int64_t)1 << 39); }

static void cc_fill(void *buf, size_t count, px_dtype t, int r) {
  for (size_t i = 0; i < count; i++) switch (t) {
    case PX_F32: ((float *)buf)[i] = cc_f32(r, i); break;
    case PX_F64: ((double *)buf)[i] = cc_f64(r, i); break;
    case PX_I32: ((int32_t *)buf)[i] = cc_i32(r, i); break;
    default: ((int64_t *)buf)[i] = cc_i64(r, i); break;
    }
}

/* The serial reduction of element i over ranks 0..n-1, in rank order, as a
 * double, and the sum of magnitudes (the scale of its rounding error). */
#define CC_SERIAL(T, GEN)                                   \
  {                                                         \
    T acc = GEN(0, i);                                      \
    *scale = fabs((double)acc);                             \
    for (int k = 1; k < n; k++) {                           \
      T v = GEN(k, i);                                      \
      *scale += fabs((double)v);                            \
      if (op == PX_SUM || op == PX_AVG) acc = (T)(acc + v); \
      else if (op == PX_MIN) acc = v < acc ? v : acc;       \
      else acc = v > acc ? v : acc;                         \
    }                                                       \
    if (op == PX_AVG) acc = (T)(acc / (T)n);                \
    return (double)acc;                                     \
  }
static double cc_serial(px_dtype t, px_reduce_op op, int n, size_t i, double *scale) {
  switch (t) {
  case PX_F32: CC_SERIAL(float, cc_f32)
  case PX_F64: CC_SERIAL(double, cc_f64)
  case PX_I32: CC_SERIAL(int32_t, cc_i32)
  default: CC_SERIAL(int64_t, cc_i64)
  }
}

static double cc_get(const void *buf, px_dtype t, size_t i) {
  switch (t) {
  case PX_F32: return ((const float *)buf)[i];
  case PX_F64: return ((const double *)buf)[i];
  case PX_I32: return ((const int32_t *)buf)[i];
  default: return (double)((const int64_t *)buf)[i];
  }
}

/* A reduction result `have` for element i against the serial one. */
static bool cc_matches(double have, px_dtype t, px_reduce_op op, int n, size_t i, bool exact) {
  double scale, want = cc_serial(t, op, n, i, &scale);
  if (exact || t == PX_I32 || t == PX_I64 || op == PX_MIN || op == PX_MAX) return have == want;
  double eps = t == PX_F32 ? 1e-6 : 1e-15;
  return fabs(have - want) <= 4 * eps * scale;
}

/* FNV-1a of the bytes: equal on every rank iff the results are bitwise equal
 * (up to a 2^-64 accident). */
static int64_t cc_fnv(const void *buf, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)buf)[i]) * 1099511628211ull;
  return (int64_t)(h >> 1);
}

/* Every rank holds the same bytes in buf. */
static void cc_check_same_everywhere(px_comm *c, const void *buf, size_t bytes, const char *what) {
  int n = px_comm_size(c);
  int64_t mine = cc_fnv(buf, bytes), *all = calloc((size_t)n, sizeof *all);
  CHECK_OK(px_comm_allgather(c, &mine, all, 1, PX_I64));
  for (int k = 0; k < n; k++) CHECK(all[k] == all[0], "%s: rank %d's result differs from rank 0's (bitwise)", what, k);
  free(all);
}

static const px_dtype cc_types[] = {PX_F32, PX_F64, PX_I32, PX_I64};
static const px_reduce_op cc_ops[] = {PX_SUM, PX_AVG, PX_MIN, PX_MAX};

static void cc_allreduce(px_comm *c, bool exact) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  const size_t counts[] = {0, 1, 17, 1000};
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
    for (int ti = 0; ti < 4; ti++)
      for (int oi = 0; oi < 4; oi++) {
        size_t count = counts[ci];
        px_dtype t = cc_types[ti];
        px_reduce_op op = cc_ops[oi];
        void *buf = malloc(count * 8 + 8);
        cc_fill(buf, count, t, r);
        CHECK_OK(px_comm_allreduce(c, buf, count, t, op));
        int bad = 0;
        for (size_t i = 0; i < count && bad < 3; i++)
          if (!cc_matches(cc_get(buf, t, i), t, op, n, i, exact)) {
            double scale;
            CHECK(0, "allreduce %s %s n=%d count=%zu: [%zu] = %.17g, serial %.17g (rank %d)", px_dtype_name(t),
                  op == PX_SUM     ? "SUM"
                    : op == PX_AVG ? "AVG"
                    : op == PX_MIN ? "MIN"
                                   : "MAX",
                  n, count, i, cc_get(buf, t, i), cc_serial(t, op, n, i, &scale), r);
            bad++;
          }
        if (count) cc_check_same_everywhere(c, buf, count * px_dtype_size(t), "allreduce");
        free(buf);
      }
}

static void cc_broadcast(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  // Any dtype moves as bytes, including ones reductions refuse.
  const px_dtype types[] = {PX_U8, PX_BF16, PX_F32, PX_I64};
  for (int root = 0; root < n; root++)
    for (int ti = 0; ti < 4; ti++) {
      size_t count = 1001, es = px_dtype_size(types[ti]);
      unsigned char *buf = malloc(count * es);
      for (size_t i = 0; i < count * es; i++) buf[i] = (unsigned char)(r == root ? i * 7 + root : 0xAA);
      CHECK_OK(px_comm_broadcast(c, buf, count, types[ti], root));
      size_t bad = 0;
      for (size_t i = 0; i < count * es; i++) bad += buf[i] != (unsigned char)(i * 7 + root);
      CHECK(bad == 0, "broadcast %s from root %d: %zu wrong bytes on rank %d", px_dtype_name(types[ti]), root, bad, r);
      free(buf);
    }
}

static void cc_allgather(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  size_t count = 37;
  int32_t send[37], *recv = malloc((size_t)n * count * sizeof *recv);
  for (size_t i = 0; i < count; i++) send[i] = r * 1000 + (int32_t)i;
  CHECK_OK(px_comm_allgather(c, send, recv, count, PX_I32));
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < count; i++)
      CHECK(recv[(size_t)k * count + i] == k * 1000 + (int32_t)i, "allgather: block %d [%zu] = %d on rank %d", k, i,
            recv[(size_t)k * count + i], r);
  // In place: my block of recv is what I send (how ZeRO gathers shards).
  memset(recv, 0, (size_t)n * count * sizeof *recv);
  for (size_t i = 0; i < count; i++) recv[(size_t)r * count + i] = -r - (int32_t)i;
  CHECK_OK(px_comm_allgather(c, recv + (size_t)r * count, recv, count, PX_I32));
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < count; i++)
      CHECK(recv[(size_t)k * count + i] == -k - (int32_t)i, "in-place allgather: block %d [%zu] = %d on rank %d", k, i,
            recv[(size_t)k * count + i], r);
  free(recv);
}

static void cc_reduce_scatter(px_comm *c, bool exact) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  size_t count = 333;
  for (int ti = 0; ti < 4; ti++)
    for (int oi = 0; oi < 4; oi += 1) {
      px_dtype t = cc_types[ti];
      px_reduce_op op = cc_ops[oi];
      size_t es = px_dtype_size(t);
      // Rank r's send is its values at elements 0 .. n*count-1.
      void *send = malloc((size_t)n * count * es), *recv = malloc(count * es);
      cc_fill(send, (size_t)n * count, t, r);
      CHECK_OK(px_comm_reduce_scatter(c, send, recv, count, t, op));
      // My block r is elements r*count ..: compare with the serial value there.
      int bad = 0;
      for (size_t i = 0; i < count && bad < 3; i++) {
        size_t g = (size_t)r * count + i;
        double scale, want = cc_serial(t, op, n, g, &scale);
        if (!cc_matches(cc_get(recv, t, i), t, op, n, g, exact)) {
          CHECK(0, "reduce_scatter %s op %d n=%d: [%zu] = %.17g, serial %.17g (rank %d)", px_dtype_name(t), (int)op, n,
                i, cc_get(recv, t, i), want, r);
          bad++;
        }
      }
      free(send);
      free(recv);
    }
}

static void cc_point_to_point(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  int right = (r + 1) % n, left = (r + n - 1) % n;
  // A ring, with tags received in another order than sent: matching is by tag.
  double out[3][50], in[3][50];
  px_request *sends[5];
  for (int t = 0; t < 3; t++) {
    for (int i = 0; i < 50; i++) out[t][i] = r * 1000 + t * 100 + i;
    CHECK_OK(px_comm_isend(c, out[t], 50, PX_F64, right, t, &sends[t]));
  }
  // Two messages on one tag arrive in the order they were sent.
  int64_t first = 100 + r, second = 200 + r, a = -1, b = -1;
  CHECK_OK(px_comm_isend(c, &first, 1, PX_I64, right, 7, &sends[3]));
  CHECK_OK(px_comm_isend(c, &second, 1, PX_I64, right, 7, &sends[4]));
  const int order[3] = {2, 0, 1};
  for (int k = 0; k < 3; k++) CHECK_OK(px_comm_recv(c, in[order[k]], 50, PX_F64, left, order[k]));
  px_request *rb;
  CHECK_OK(px_comm_irecv(c, &a, 1, PX_I64, left, 7, &rb));
  CHECK_OK(px_comm_recv(c, &b, 1, PX_I64, left, 7));
  CHECK_OK(px_request_wait(rb));
  for (int k = 0; k < 5; k++) CHECK_OK(px_request_wait(sends[k]));
  for (int t = 0; t < 3; t++)
    for (int i = 0; i < 50; i++)
      CHECK(in[t][i] == left * 1000 + t * 100 + i, "ring tag %d [%d] = %g on rank %d", t, i, in[t][i], r);
  CHECK(a == 100 + left && b == 200 + left, "same-tag messages out of order: %lld, %lld on rank %d", (long long)a,
        (long long)b, r);
  // Blocking pair between two ranks.
  if (n >= 2 && r < 2) {
    int32_t v = r == 0 ? 4242 : 0;
    if (r == 0) CHECK_OK(px_comm_send(c, &v, 1, PX_I32, 1, 3));
    else CHECK_OK(px_comm_recv(c, &v, 1, PX_I32, 0, 3));
    CHECK(v == 4242, "blocking send/recv: %d", v);
  }
  CHECK_OK(px_comm_barrier(c));
}

static void cc_async(px_comm *c, bool exact) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  // Several operations in flight at once, waited for in start order.
  enum { K = 4, COUNT = 5000 };
  float *bufs[K];
  px_request *req[K + 3];
  for (int k = 0; k < K; k++) {
    bufs[k] = malloc(COUNT * sizeof(float));
    for (size_t i = 0; i < COUNT; i++) bufs[k][i] = cc_f32(r, i + (size_t)k * COUNT);
    CHECK_OK(px_comm_iallreduce(c, bufs[k], COUNT, PX_F32, PX_SUM, &req[k]));
  }
  int64_t bc[8];
  for (int i = 0; i < 8; i++) bc[i] = r == n - 1 ? 77 * i : -1;
  CHECK_OK(px_comm_ibroadcast(c, bc, 8, PX_I64, n - 1, &req[K]));
  int32_t mine[2] = {r, -r}, *all = malloc((size_t)n * 2 * sizeof *all);
  CHECK_OK(px_comm_iallgather(c, mine, all, 2, PX_I32, &req[K + 1]));
  double *rs_send = malloc((size_t)n * 3 * sizeof(double)), rs_recv[3];
  for (int i = 0; i < n * 3; i++) rs_send[i] = r + 0.25 * i;
  CHECK_OK(px_comm_ireduce_scatter(c, rs_send, rs_recv, 3, PX_F64, PX_AVG, &req[K + 2]));
  for (int k = 0; k < K + 3; k++) CHECK_OK(px_request_wait(req[k]));
  for (int k = 0; k < K; k++) {
    int bad = 0;
    for (size_t i = 0; i < COUNT && bad < 3; i++) {
      double want = 0, scale = 0;
      float acc = cc_f32(0, i + (size_t)k * COUNT);
      for (int q = 1; q < n; q++) acc += cc_f32(q, i + (size_t)k * COUNT);
      for (int q = 0; q < n; q++) scale += fabs((double)cc_f32(q, i + (size_t)k * COUNT));
      want = acc;
      bool ok = exact ? bufs[k][i] == acc : fabs(bufs[k][i] - want) <= 4e-6 * scale;
      if (!ok) {
        CHECK(0, "iallreduce %d [%zu] = %.9g, serial %.9g (rank %d)", k, i, bufs[k][i], want, r);
        bad++;
      }
    }
    free(bufs[k]);
  }
  for (int i = 0; i < 8; i++) CHECK(bc[i] == 77 * i, "ibroadcast [%d] = %lld", i, (long long)bc[i]);
  for (int k = 0; k < n; k++) CHECK(all[2 * k] == k && all[2 * k + 1] == -k, "iallgather block %d", k);
  for (int i = 0; i < 3; i++) {
    // AVG over ranks of (q + 0.25 * (3r + i)) = (n-1)/2 + 0.25 * (3r + i).
    double want = (n - 1) / 2.0 + 0.25 * (3 * r + i);
    CHECK(fabs(rs_recv[i] - want) < 1e-12, "ireduce_scatter AVG [%d] = %g, want %g", i, rs_recv[i], want);
  }
  free(all);
  free(rs_send);

  // px_request_test turns true by itself, without px_request_wait driving it.
  size_t big = 200000;
  float *x = malloc(big * sizeof *x);
  for (size_t i = 0; i < big; i++) x[i] = 1.0f;
  px_request *t;
  CHECK_OK(px_comm_iallreduce(c, x, big, PX_F32, PX_SUM, &t));
  bool done = false;
  double until = px_time_now() + 10;
  while (!done && px_time_now() < until) {
    CHECK_OK(px_request_test(t, &done));
    if (!done) nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  CHECK(done, "px_request_test never saw the iallreduce complete (rank %d)", r);
  CHECK_OK(px_request_wait(t));
  CHECK(x[0] == (float)n && x[big - 1] == (float)n, "tested iallreduce: %g %g", x[0], x[big - 1]);
  free(x);
}

static void cc_split(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  px_comm_set_timeout(c, 42);
  px_comm *half = NULL;
  CHECK_OK(px_comm_split(c, r % 2, r, &half));
  CHECK(half != NULL, "split: no communicator for rank %d", r);
  int want_size = r % 2 == 0 ? (n + 1) / 2 : n / 2;
  CHECK(px_comm_size(half) == want_size && px_comm_rank(half) == r / 2, "even/odd split: rank %d/%d on world rank %d",
        px_comm_rank(half), px_comm_size(half), r);
  CHECK(px_comm_timeout(half) == 42, "split did not inherit the timeout: %g", px_comm_timeout(half));
  CHECK(px_comm_backend_of(half) == px_comm_backend_of(c), "split changed the backend");
  int64_t s = r, want = 0;
  for (int k = r % 2; k < n; k += 2) want += k;
  CHECK_OK(px_comm_allreduce(half, &s, 1, PX_I64, PX_SUM));
  CHECK(s == want, "sum of world ranks of parity %d = %lld, want %lld", r % 2, (long long)s, (long long)want);
  // Interleaved async work on the sub-group and the world.
  double hv = 1, wv = 1;
  px_request *hr, *wr;
  CHECK_OK(px_comm_iallreduce(half, &hv, 1, PX_F64, PX_SUM, &hr));
  CHECK_OK(px_comm_iallreduce(c, &wv, 1, PX_F64, PX_SUM, &wr));
  CHECK_OK(px_request_wait(wr));
  CHECK_OK(px_request_wait(hr));
  CHECK(hv == want_size && wv == n, "async in sub-group %g (want %d), world %g (want %d)", hv, want_size, wv, n);
  // A split of a split.
  px_comm *solo = NULL;
  CHECK_OK(px_comm_split(half, px_comm_rank(half), 0, &solo));
  CHECK(solo && px_comm_size(solo) == 1 && px_comm_rank(solo) == 0, "split into singletons");
  int64_t one = 5;
  CHECK_OK(px_comm_allreduce(solo, &one, 1, PX_I64, PX_AVG));
  CHECK(one == 5, "allreduce in a group of one: %lld", (long long)one);
  px_comm_free(solo);
  px_comm_free(half);

  // Keys reverse the order: world rank r becomes n-1-r.
  px_comm *rev = NULL;
  CHECK_OK(px_comm_split(c, 0, -r, &rev));
  CHECK(px_comm_rank(rev) == n - 1 - r && px_comm_size(rev) == n, "reversed split: rank %d", px_comm_rank(rev));
  int32_t who = r;
  CHECK_OK(px_comm_broadcast(rev, &who, 1, PX_I32, 0));
  CHECK(who == n - 1, "broadcast from rank 0 of the reversed group came from world rank %d", who);
  int32_t ranks_seen[64];
  int32_t me = r;
  if (n <= 64) {
    CHECK_OK(px_comm_allgather(rev, &me, ranks_seen, 1, PX_I32));
    for (int k = 0; k < n; k++) CHECK(ranks_seen[k] == n - 1 - k, "reversed allgather [%d] = %d", k, ranks_seen[k]);
  }
  px_comm_free(rev);

  // A negative color leaves a rank out (MPI_UNDEFINED).
  px_comm *rest = (px_comm *)1;
  CHECK_OK(px_comm_split(c, r == 0 ? -1 : 3, 0, &rest));
  if (r == 0) CHECK(rest == NULL, "negative color gave a communicator");
  else {
    CHECK(rest && px_comm_size(rest) == n - 1 && px_comm_rank(rest) == r - 1, "split without rank 0");
    CHECK_OK(px_comm_barrier(rest));
    px_comm_free(rest);
  }
  px_comm_set_timeout(c, 600);
}

static void cc_large(px_comm *c, bool exact) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  // Not a multiple of any rank count or of a cache line: slices are ragged.
  size_t count = 3000001;
  float *x = malloc(count * sizeof *x);
  for (size_t i = 0; i < count; i++)
    x[i] = (float)((i * 2654435761u + (size_t)r * 40503u) & 0xffff) / 65536.0f - 0.5f + 0.001f * r;
  CHECK_OK(px_comm_allreduce(c, x, count, PX_F32, PX_SUM));
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    float acc = 0, scale = 0;
    for (int k = 0; k < n; k++) {
      float v = (float)((i * 2654435761u + (size_t)k * 40503u) & 0xffff) / 65536.0f - 0.5f + 0.001f * k;
      acc = k == 0 ? v : acc + v;
      scale += fabsf(v);
    }
    bool ok = exact ? x[i] == acc : fabsf(x[i] - acc) <= 4e-6f * scale;
    if (!ok && bad++ < 3) CHECK(0, "large allreduce [%zu] = %.9g, serial %.9g (rank %d)", i, x[i], acc, r);
  }
  CHECK(bad == 0, "large allreduce: %zu of %zu elements wrong on rank %d", bad, count, r);
  cc_check_same_everywhere(c, x, count * sizeof *x, "large allreduce");
  free(x);
}

static void cc_errors_and_helpers(px_comm *c) {
  int n = px_comm_size(c), r = px_comm_rank(c);
  uint16_t h[4] = {0};
  CHECK(px_comm_allreduce(c, h, 4, PX_BF16, PX_SUM) == PX_ERR_UNSUPPORTED, "BF16 allreduce accepted");
  CHECK(strstr(px_last_error(), "BF16") != NULL, "message does not name the dtype: %s", px_last_error());
  float f = 0;
  CHECK(px_comm_broadcast(c, &f, 1, PX_F32, n) == PX_ERR_INVALID, "root %d accepted", n);
  char want[64];
  snprintf(want, sizeof want, "root %d", n);
  CHECK(strstr(px_last_error(), want) != NULL, "message does not name the root: %s", px_last_error());
  snprintf(want, sizeof want, "size %d", n);
  CHECK(strstr(px_last_error(), want) != NULL, "message does not name the size: %s", px_last_error());
  CHECK(px_comm_send(c, &f, 1, PX_F32, -1, 0) == PX_ERR_INVALID, "dst -1 accepted");
  CHECK(px_comm_recv(c, &f, 1, PX_F32, n + 2, 0) == PX_ERR_INVALID, "src %d accepted", n + 2);
  CHECK(px_comm_allreduce(c, &f, 1, PX_F32, (px_reduce_op)9) == PX_ERR_INVALID, "op 9 accepted");

  double m = r;
  CHECK_OK(px_comm_mean(c, &m));
  CHECK(fabs(m - (n - 1) / 2.0) < 1e-12, "px_comm_mean = %g, want %g", m, (n - 1) / 2.0);
  CHECK_OK(px_print_ordered(c, "rank %d of %d says hello\n(second line)", r, n));
  px_print0(c, "px_print0 from rank 0 of %d\n", n);
  CHECK(px_comm_local_rank(c) >= 0 && px_comm_local_rank(c) < px_comm_local_size(c) && px_comm_local_size(c) <= n,
        "local rank %d of %d in a world of %d", px_comm_local_rank(c), px_comm_local_size(c), n);
  px_comm_set_label(c, "step 1, bucket 2");
  CHECK_OK(px_comm_barrier(c));
  px_comm_set_label(c, NULL);
}

/* All of the above, on every rank of c. */
static void comm_checks(px_comm *c, bool exact) {
  cc_allreduce(c, exact);
  cc_broadcast(c);
  cc_allgather(c);
  cc_reduce_scatter(c, exact);
  CHECK_OK(px_comm_barrier(c));
  cc_point_to_point(c);
  cc_async(c, exact);
  cc_split(c);
  cc_large(c, exact);
  cc_errors_and_helpers(c);
}

#endif
