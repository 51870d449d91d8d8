/* Claim: when a stage stops in the middle of a schedule, its peer gives up
 * within the watchdog bound and says where it was: p = 2 ranks as threads,
 * GPipe with 4 micro-batches, a 1 s watchdog; the last stage hangs (3 s) in
 * the loss of micro-batch 1; stage 0, which waits for the gradient of
 * micro-batch 0, fails with PX_ERR_TIMEOUT within 2.5 s, and its message
 * names the step, stage 0, micro-batch 0 and the action RECV_GRAD that
 * posted the receive.
 * If this fails: the executor does not label its point-to-point calls (the
 * watchdog says "no label set"), or a wait is not under the watchdog. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <string.h>
#include <time.h>

static px_module *mlp(void *arg) {
  (void)arg;
  return px_chain_of(4, px_linear(4, 8, true), px_relu(), px_linear(8, 8, true), px_linear(8, 3, true));
}

static px_status loss(void *user, const px_tensor *out, int micro, float *l, float *d) {
  (void)user;
  if (micro == 1) {
    struct timespec t = {.tv_sec = 3, .tv_nsec = 0};
    while (nanosleep(&t, &t) != 0) {}
  }
  int32_t tg[8] = {0};
  return px_cross_entropy_loss(out, tg, NULL, l, d);
}

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 1.0);
  px_pp_schedule *s;
  CHECK_OK(px_pp_schedule_make(PX_PP_GPIPE, 2, 4, 1, &s));
  px_pp_opts o = {.build = mlp, .seed = 1};
  px_pp *pp;
  CHECK_OK(px_pp_create(&pp, c, s, &o));
  float x[8 * 4] = {0};
  px_tensor xt = px_tensor_view(x, PX_F32, 2, (int64_t[]){8, 4});
  const double t0 = px_time_now();
  px_status st = px_pp_step(pp, &xt, loss, NULL, NULL);
  const double took = px_time_now() - t0;
  CHECK(st != PX_OK, "rank %d: the step succeeded", px_comm_rank(c));
  if (px_comm_rank(c) == 0) {
    CHECK(st == PX_ERR_TIMEOUT && took < 2.5, "stage 0: %s after %.2f s", px_status_name(st), took);
    CHECK(strstr(px_last_error(), "pipeline step 0: stage 0, micro-batch 0, RECV_GRAD"),
          "stage 0's message does not say where: \"%s\"", px_last_error());
    printf("  stage 0 after %.2f s: %s\n", took, px_last_error());
  }
  px_pp_free(pp);
  px_pp_schedule_free(s);
  return 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(2, run, NULL, &code));
  return px_test_finish("test_pp_exec_watchdog_names_stage_micro_batch_and_action");
}
