/* Claim: the GPT in tensor-parallel form trains as the single-process GPT,
 * with and without sequence parallelism:
 * under the threads backend with tp = 2 and tp = 4 (vocabulary 37: split
 * unevenly by both), and with dp 2 × tp 2 (DDP, ZeRO-1 or ZeRO-2 over the dp
 * group; with sequence parallelism DDP and ZeRO-2), 20 AdamW
 * steps with dropout 0.1 and gradient-norm clipping give every step's loss,
 * every gradient norm and every parameter box of the single process to
 * 1e-5 relative (tests/tp_gpt_cases.h).  And a tp that does not divide the
 * heads is refused with one clear message.
 * If this fails: a dropout mask inside the split attention is not the
 * global head's, the q/k/v boxes mix heads, a replicated gradient is
 * counted more than once in the clipping norm (or a split one less than in
 * full), the vocabulary-parallel loss differs, or DDP over dp does not
 * compose with tp; with sequence parallelism only: a dropout part masks
 * other positions than the whole sequence's, a layer norm's or wpe's
 * gradient is not summed over the tp ranks' positions (or summed twice
 * under accumulation), or a gather/scatter puts positions out of order. */
#include "tp_gpt_cases.h"

static int run(px_comm *c, void *arg) {
  px_comm_set_timeout(c, 120);
  const int tp = *(const int *)arg;
  for (int sp = 0; sp <= 1; sp++) tpg_case(c, tp, 0, sp, true);
  if (px_comm_size(c) > tp) {  // dp > 1: ZeRO stages 1 and 2 over dp instead of DDP
    tpg_case(c, tp, 1, false, true);
    tpg_case(c, tp, 2, false, true);
    tpg_case(c, tp, 2, true, true);
  }
  return px_test_failures ? 1 : 0;
}

static int refuse(px_comm *c, void *arg) {
  (void)arg;
  px_tp_group g = px_tp_group_of(c);
  px_tp_gpt_config cfg = tpg_tp_cfg(false);
  px_module *m = px_tp_gpt(&g, &cfg);
  CHECK(m == NULL && strstr(px_last_error(), "tp 3 does not divide n_head 4"), "tp 3 with 4 heads: \"%s\"",
        px_last_error());
  if (px_comm_rank(c) == 0) printf("  refused: %s\n", px_last_error());
  return px_test_failures ? 1 : 0;
}

int main(void) {
  const int worlds[3] = {2, 4, 4}, tps[3] = {2, 4, 2};
  for (int i = 0; i < 3; i++) {
    int code = 0;
    CHECK_OK(px_comm_run(worlds[i], run, (void *)&tps[i], &code));
    CHECK(code == 0, "world %d, tp %d: a rank failed (%d)", worlds[i], tps[i], code);
  }
  int code = 0;
  CHECK_OK(px_comm_run(3, refuse, NULL, &code));
  CHECK(code == 0, "tp 3: a rank failed (%d)", code);
  return px_test_finish("test_tp_gpt_equals_single_process");
}
