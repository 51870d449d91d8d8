/* fingerprint_cases.h — the collective-fingerprint scenarios, shared by the
 * threads tests (test_collective_fingerprints_catch_*) and the MPI one
 * (test_collective_fingerprints_catch_divergence_mpi).  Each function runs
 * on every rank of a communicator with the debug mode on and CHECKs what
 * that rank sees; the call sites the messages must name are this file's
 * lines, captured with __LINE__ next to the calls. */
#ifndef FINGERPRINT_CASES_H
#define FINGERPRINT_CASES_H

#include "px_test.h"

#include <stdint.h>
#include <string.h>

#define FP_SITE "tests/fingerprint_cases.h"

/* Every rank's status of a planted divergence must be PX_ERR_COMM: summed
 * over ranks by a collective that every rank calls after it (which also
 * proves the communicator is still in step: no rank ran the bad call). */
static inline void fp_all_failed(px_comm *c, px_status st, const char *what) {
  int32_t failed = st == PX_ERR_COMM ? 1 : 0;
  CHECK_OK(px_comm_allreduce(c, &failed, 1, PX_I32, PX_SUM));
  CHECK(failed == px_comm_size(c), "%s: %d of %d ranks returned PX_ERR_COMM", what, (int)failed, px_comm_size(c));
}

static inline void fp_expect_in(const char *msg, const char *want, int rank, const char *what) {
  CHECK(strstr(msg, want) != NULL, "%s, rank %d: the message lacks \"%s\"; it is: %s", what, rank, want, msg);
}

/* Every collective kind, the same on every rank: with the mode on, each
 * passes its check and computes what it computes with the mode off. */
static inline void fp_matched_collectives_pass(px_comm *c) {
  const int r = px_comm_rank(c), n = px_comm_size(c);
  CHECK(px_comm_debug_collectives(c), "rank %d: the debug mode is off", r);
  px_comm_set_label(c, "matched");
  double s = r + 1;
  CHECK_OK(px_comm_allreduce(c, &s, 1, PX_F64, PX_SUM));
  CHECK(s == n * (n + 1) / 2.0, "allreduce: %g", s);
  int32_t b[3] = {r, r, r};
  if (r == n - 1) b[0] = b[1] = b[2] = 77;
  CHECK_OK(px_comm_broadcast(c, b, 3, PX_I32, n - 1));
  CHECK(b[0] == 77 && b[2] == 77, "broadcast: %d", (int)b[0]);
  int64_t mine = 10 * r, all[8] = {0};
  CHECK_OK(px_comm_allgather(c, &mine, all, 1, PX_I64));
  for (int i = 0; i < n; i++) CHECK(all[i] == 10 * i, "allgather[%d] = %lld", i, (long long)all[i]);
  float send[8], got = 0;
  for (int i = 0; i < n; i++) send[i] = (float)i;
  CHECK_OK(px_comm_reduce_scatter(c, send, &got, 1, PX_F32, PX_SUM));
  CHECK(got == (float)(r * n), "reduce_scatter: %g", (double)got);
  CHECK_OK(px_comm_barrier(c));
  // The asynchronous ones, two in flight at a time.
  double a = 1;
  float g2[8] = {0}, one = (float)r;
  px_request *q1, *q2;
  CHECK_OK(px_comm_iallreduce(c, &a, 1, PX_F64, PX_MAX, &q1));
  CHECK_OK(px_comm_iallgather(c, &one, g2, 1, PX_F32, &q2));
  CHECK_OK(px_request_wait(q1));
  CHECK_OK(px_request_wait(q2));
  CHECK(a == 1 && g2[n - 1] == (float)(n - 1), "iallreduce %g, iallgather %g", a, (double)g2[n - 1]);
  int32_t ib = r == 0 ? 5 : 0;
  float rs = 0;
  CHECK_OK(px_comm_ibroadcast(c, &ib, 1, PX_I32, 0, &q1));
  CHECK_OK(px_comm_ireduce_scatter(c, send, &rs, 1, PX_F32, PX_SUM, &q2));
  CHECK_OK(px_request_wait(q1));
  CHECK_OK(px_request_wait(q2));
  CHECK(ib == 5 && rs == (float)(r * n), "ibroadcast %d, ireduce_scatter %g", (int)ib, (double)rs);
  // A sub-group (color and key differ by design) inherits the mode.
  px_comm *half = NULL;
  CHECK_OK(px_comm_split(c, r % 2, r, &half));
  CHECK(half && px_comm_debug_collectives(half), "rank %d: the split's communicator lost the debug mode", r);
  if (half) {
    int32_t k = 1;
    CHECK_OK(px_comm_allreduce(half, &k, 1, PX_I32, PX_SUM));
    CHECK(k == (n + (r % 2 ? 0 : 1)) / 2, "rank %d: sub-group sum %d", r, (int)k);
    px_comm_free(half);
  }
}

/* Rank `skipper` skips an all-reduce that the others make; every rank then
 * broadcasts.  The others' check of the all-reduce meets the skipper's
 * check of its broadcast: reported on every rank, naming both. */
static inline void fp_skipped_collective_is_caught(px_comm *c, int skipper) {
  const int r = px_comm_rank(c), n = px_comm_size(c);
  px_comm_set_label(c, "step 5, bucket 1");
  float x[1024];
  int32_t y[8];
  for (int i = 0; i < 1024; i++) x[i] = (float)(r + 1);
  for (int i = 0; i < 8; i++) y[i] = r;
  const int line_ar = __LINE__ + 1;
  px_status st = r != skipper ? px_comm_allreduce(c, x, 1024, PX_F32, PX_SUM) : PX_OK;
  const int line_bc = __LINE__ + 1;
  if (st == PX_OK) st = px_comm_broadcast(c, y, 8, PX_I32, 0);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", px_last_error());
  CHECK(st == PX_ERR_COMM, "skip: rank %d got %s (%s)", r, px_status_name(st), msg);
  char side0[256], side1[256];
  if (skipper != 0) {
    snprintf(side0, sizeof side0, "rank 0 allreduce 1024 F32 SUM 'step 5, bucket 1' at " FP_SITE ":%d", line_ar);
    snprintf(side1, sizeof side1, "rank %d broadcast 8 I32 from root 0 'step 5, bucket 1' at " FP_SITE ":%d", skipper,
             line_bc);
  } else {
    snprintf(side0, sizeof side0, "rank 0 broadcast 8 I32 from root 0 'step 5, bucket 1' at " FP_SITE ":%d", line_bc);
    snprintf(side1, sizeof side1, "rank 1 allreduce 1024 F32 SUM 'step 5, bucket 1' at " FP_SITE ":%d", line_ar);
  }
  fp_expect_in(msg, "differs between ranks (operation, count, dtype, reduce op, root, call site)", r, "skip");
  fp_expect_in(msg, side0, r, "skip");
  fp_expect_in(msg, side1, r, "skip");
  char tally[64];
  snprintf(tally, sizeof tally, "%d of %d rank(s) differ from rank 0", skipper != 0 ? 1 : n - 1, n);
  fp_expect_in(msg, tally, r, "skip");
  // No rank ran either call: the buffers are as they were.
  CHECK(x[0] == (float)(r + 1) && x[1023] == (float)(r + 1), "skip: rank %d's all-reduce buffer changed", r);
  CHECK(y[0] == r && y[7] == r, "skip: rank %d's broadcast buffer changed", r);
  fp_all_failed(c, st, "skip");
}

/* Rank 1 all-reduces 512 floats where the others reduce 1024, from the same
 * line; then rank n-1 all-gathers 5 doubles (asynchronously) where the
 * others gather 4.  Each is reported on every rank with both counts. */
static inline void fp_size_mismatch_is_caught(px_comm *c) {
  const int r = px_comm_rank(c), n = px_comm_size(c);
  px_comm_set_label(c, "DDP step 3, bucket 2");
  float x[1024];
  for (int i = 0; i < 1024; i++) x[i] = 1;
  const size_t count = r == 1 ? 512 : 1024;
  const int line_ar = __LINE__ + 1;
  px_status st = px_comm_allreduce(c, x, count, PX_F32, PX_SUM);
  char msg[1024], want[256];
  snprintf(msg, sizeof msg, "%s", px_last_error());
  CHECK(st == PX_ERR_COMM, "size: rank %d got %s (%s)", r, px_status_name(st), msg);
  snprintf(want, sizeof want,
           "differs between ranks (count): rank 0 allreduce 1024 F32 SUM 'DDP step 3, bucket 2' at " FP_SITE
           ":%d; rank 1 allreduce 512 F32 SUM 'DDP step 3, bucket 2' at " FP_SITE ":%d;",
           line_ar, line_ar);
  fp_expect_in(msg, want, r, "size");
  CHECK(x[0] == 1 && x[511] == 1 && x[1023] == 1, "size: rank %d's buffer changed (a wrong sum ran)", r);
  fp_all_failed(c, st, "size");

  px_comm_set_label(c, "ZeRO gather, unit 4");
  double part[5] = {1, 2, 3, 4, 5}, all[4 * 5];
  px_request *req = NULL;
  const int line_ag = __LINE__ + 1;
  st = px_comm_iallgather(c, part, all, r == n - 1 ? 5 : 4, PX_F64, &req);
  snprintf(msg, sizeof msg, "%s", px_last_error());
  CHECK(st == PX_ERR_COMM && req == NULL, "size (async): rank %d got %s (%s)", r, px_status_name(st), msg);
  snprintf(want, sizeof want,
           "rank 0 iallgather 4 F64 'ZeRO gather, unit 4' at " FP_SITE ":%d; rank %d iallgather 5 F64 "
           "'ZeRO gather, unit 4' at " FP_SITE ":%d;",
           line_ag, n - 1, line_ag);
  fp_expect_in(msg, want, r, "size (async)");
  if (req) CHECK_OK(px_request_wait(req));
  fp_all_failed(c, st, "size (async)");
}

#endif
