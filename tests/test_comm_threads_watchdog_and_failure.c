/* Claim: under the threads backend no failure hangs the job.
 *   - A rank that skips an all-reduce: the others get PX_ERR_TIMEOUT within
 *     about the timeout, with a message naming the collective, the label
 *     and the missing rank.
 *   - A rank whose function returns non-zero: peers stuck in a collective
 *     (or waiting on an async one) fail with PX_ERR_COMM at once, naming
 *     that rank and its exit code, and px_comm_run reports the code.
 *   - A rank that returns 0 while the others wait for it: they fail at
 *     once (it can never arrive), without waiting for the watchdog.
 *   - px_comm_abort, a receive that no one sends, and two ranks calling
 *     different collectives all end the same way.
 * If it failed, one crashed or diverging rank would leave the rest of a
 * training job blocked forever (or until the cluster's wall-clock limit)
 * with no hint of where. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

#define N 4

typedef struct outcome {
  px_status st[N];
  char msg[N][1024];
  double seconds[N];
} outcome;

static void record(outcome *o, int r, px_status st, double t0) {
  o->st[r] = st;
  snprintf(o->msg[r], sizeof o->msg[r], "%s", px_last_error());
  o->seconds[r] = px_time_now() - t0;
}

/* ---- 1: rank 1 skips an all-reduce ----------------------------------------- */
static int skip_main(px_comm *c, void *arg) {
  outcome *o = arg;
  int r = px_comm_rank(c);
  px_comm_set_timeout(c, 0.5);
  px_comm_set_label(c, "step 7, bucket 2");
  float x[16] = {0};
  CHECK_OK(px_comm_allreduce(c, x, 16, PX_F32, PX_SUM));
  if (r == 1) {
    // Busy elsewhere past the others' deadline, as a stuck rank would be
    // (returning at once would be caught sooner: see early_main).
    nanosleep(&(struct timespec){1, 0}, NULL);
    return 0;
  }
  double t0 = px_time_now();
  record(o, r, px_comm_allreduce(c, x, 16, PX_F32, PX_SUM), t0);
  return o->st[r] == PX_OK ? 0 : 5;
}

/* ---- 2: rank 1 fails after a step -------------------------------------------- */
static int exit_main(px_comm *c, void *arg) {
  outcome *o = arg;
  int r = px_comm_rank(c);
  px_comm_set_label(c, "step 3");
  double x[1000] = {0};
  CHECK_OK(px_comm_allreduce(c, x, 1000, PX_F64, PX_SUM));
  if (r == 1) {
    // Give the others time to be waiting in the next collective.
    nanosleep(&(struct timespec){0, 100000000}, NULL);
    return 3;
  }
  double t0 = px_time_now();
  // Default timeout (600 s): only the failure propagation can end this.
  if (r == 2) {
    px_request *req;
    CHECK_OK(px_comm_iallreduce(c, x, 1000, PX_F64, PX_SUM, &req));
    record(o, r, px_request_wait(req), t0);
  } else {
    record(o, r, px_comm_allreduce(c, x, 1000, PX_F64, PX_SUM), t0);
  }
  // Later calls fail at once too.
  CHECK(px_comm_barrier(c) == PX_ERR_COMM, "barrier after failure on rank %d", r);
  return 4;
}

/* ---- 2b: rank 1 returns 0 a step early (ran out of data) -------------------- */
static int early_main(px_comm *c, void *arg) {
  outcome *o = arg;
  int r = px_comm_rank(c);
  px_comm_set_label(c, "epoch 0, step 41");
  float x[4] = {0};
  if (r == 1) return 0;
  double t0 = px_time_now();
  // Default timeout (600 s): the verdict must not wait for it.
  record(o, r, px_comm_allreduce(c, x, 4, PX_F32, PX_SUM), t0);
  return 0;
}

/* ---- 3: px_comm_abort -------------------------------------------------------- */
static int abort_main(px_comm *c, void *arg) {
  outcome *o = arg;
  int r = px_comm_rank(c);
  double t0 = px_time_now();
  if (r == 2) {
    px_comm_abort(c, "loss is NaN at step 9");
    return 0;
  }
  record(o, r, px_comm_barrier(c), t0);
  return 0;
}

/* ---- 4: a receive nobody sends ------------------------------------------------- */
static int recv_main(px_comm *c, void *arg) {
  outcome *o = arg;
  int r = px_comm_rank(c);
  if (r != 0) {
    nanosleep(&(struct timespec){0, 800000000}, NULL);  // alive past rank 0's deadline
    return 0;
  }
  px_comm_set_timeout(c, 0.3);
  px_comm_set_label(c, "pipeline stage 0");
  int v;
  double t0 = px_time_now();
  record(o, r, px_comm_recv(c, &v, 1, PX_I32, 3, 11), t0);
  return 0;
}

/* ---- 4b: the sender returns without sending ------------------------------------ */
static int recv_gone_main(px_comm *c, void *arg) {
  outcome *o = arg;
  int r = px_comm_rank(c);
  if (r != 0) return 0;
  int v;
  double t0 = px_time_now();
  record(o, r, px_comm_recv(c, &v, 1, PX_I32, 3, 11), t0);
  return 0;
}

/* ---- 5: different collectives on different ranks ------------------------------- */
static int mismatch_main(px_comm *c, void *arg) {
  outcome *o = arg;
  int r = px_comm_rank(c);
  float x[8] = {0};
  double t0 = px_time_now();
  record(o, r, r == 1 ? px_comm_barrier(c) : px_comm_allreduce(c, x, 8, PX_F32, PX_SUM), t0);
  return 0;
}

static void expect(const outcome *o, int r, px_status st, double max_s, const char *const *needles) {
  CHECK(o->st[r] == st, "rank %d: %s, want %s (%s)", r, px_status_name(o->st[r]), px_status_name(st), o->msg[r]);
  CHECK(o->seconds[r] < max_s, "rank %d took %.2f s to fail (limit %.1f)", r, o->seconds[r], max_s);
  for (; *needles; needles++)
    CHECK(strstr(o->msg[r], *needles) != NULL, "rank %d: message lacks \"%s\": %s", r, *needles, o->msg[r]);
}

int main(void) {
  alarm(30);  // a backstop: a hang here must fail the test, not stall ctest
  int code = -1;

  outcome o1 = {0};
  CHECK_OK(px_comm_run(N, skip_main, &o1, &code));
  CHECK(code == 5, "skip: exit code %d, want 5", code);
  for (int r = 0; r < N; r++) {
    if (r == 1) continue;
    expect(&o1, r, PX_ERR_TIMEOUT, 2.0,
           (const char *const[]){"watchdog", "allreduce", "step 7, bucket 2", "waiting on ranks [1]", "0.5 s", NULL});
  }

  outcome o2 = {0};
  CHECK_OK(px_comm_run(N, exit_main, &o2, &code));
  CHECK(code == 3, "exit: px_comm_run reported %d, want rank 1's 3", code);
  for (int r = 0; r < N; r++) {
    if (r == 1) continue;
    expect(&o2, r, PX_ERR_COMM, 2.0, (const char *const[]){"rank 1 failed (exit code 3)", "allreduce", "step 3", NULL});
  }

  outcome o2b = {0};
  CHECK_OK(px_comm_run(N, early_main, &o2b, &code));
  for (int r = 0; r < N; r++)
    if (r != 1)
      expect(&o2b, r, PX_ERR_COMM, 2.0,
             (const char *const[]){"rank 1 returned from its function", "allreduce (epoch 0, step 41)", NULL});

  outcome o3 = {0};
  CHECK_OK(px_comm_run(N, abort_main, &o3, &code));
  CHECK(code == 0, "abort: exit code %d", code);
  for (int r = 0; r < N; r++)
    if (r != 2)
      expect(&o3, r, PX_ERR_COMM, 2.0, (const char *const[]){"rank 2 aborted: loss is NaN at step 9", "barrier", NULL});

  outcome o4 = {0};
  CHECK_OK(px_comm_run(N, recv_main, &o4, &code));
  expect(&o4, 0, PX_ERR_TIMEOUT, 2.0, (const char *const[]){"recv", "pipeline stage 0", "waiting on ranks [3]", NULL});

  outcome o4b = {0};
  CHECK_OK(px_comm_run(N, recv_gone_main, &o4b, &code));
  expect(&o4b, 0, PX_ERR_COMM, 2.0,
         (const char *const[]){"rank 3 returned from its function without sending", "tag 11", NULL});

  outcome o5 = {0};
  CHECK_OK(px_comm_run(N, mismatch_main, &o5, &code));
  for (int r = 0; r < N; r++)
    expect(&o5, r, PX_ERR_COMM, 2.0, (const char *const[]){"collective mismatch", "barrier", "allreduce", NULL});

  return px_test_finish("test_comm_threads_watchdog_and_failure");
}
