/* Claim: pipeline parallelism combined with data and tensor parallelism
 * over one px_mesh (tests/pp3d_cases.h) trains as one process on the whole
 * global batch: dp 2 × pp 2 (the MLP, 4 ranks), tp 2 × pp 2 and
 * dp 2 × tp 2 × pp 2 (the tensor-parallel GPT, 4 and 8 ranks as threads),
 * each with GPipe, 1F1B and the interleaved schedule (v = 2), give the
 * single process's loss at every one of 20 steps, its gradient norm (with
 * clipping acting; the tied wte counted once, tp-replicated parameters
 * once, dp not at all) and its parameters after them (this rank's boxes)
 * to 1e-5 relative, starting bit for bit from them.  ZeRO 1 and 2 over dp
 * (and dp 3 × pp 2, 6 ranks, whose slices are padded) give DDP-over-dp's
 * parameters and losses to 1e-6.  ZeRO stage 3, and a
 * ZeRO stage without a dp group, are refused by px_pp_create with a
 * message that names the stage.
 * If this fails: the dp average is missing or not a mean (the loss and the
 * norm differ by a factor), the dp replicas did not read different rows,
 * the norm counts a replicated tp parameter twice or sums over dp, the
 * tied head's tp copy does not take its box of the single process's wte
 * (initial values) or its gradient is not summed with the embedding's of
 * the same tp rank, or ZeRO's slices / all-gather lose elements. */
#include "pp3d_cases.h"

static int run(px_comm *c, void *arg) {
  px_comm_set_timeout(c, 120);
  p3d_run(c, arg);
  return px_test_failures ? 1 : 0;
}

static void one(p3d_case k) {
  int code = 0;
  CHECK_OK(px_comm_run(k.dp * k.tp * k.pp, run, &k, &code));
  CHECK(code == 0, "dp %d tp %d pp %d %s m %d: a rank failed (%d)", k.dp, k.tp, k.pp, px_pp_kind_name(k.kind), k.m,
        code);
}

// px_pp_create refuses ZeRO 3 and ZeRO without dp, naming the stage.
static int refuse(px_comm *c, void *arg) {
  (void)arg;
  px_pp_schedule *sched;
  CHECK_OK(px_pp_schedule_make(PX_PP_1F1B, 1, 2, 1, &sched));
  ppc_mlp marg = {.depth = 1};
  const px_optim_opts oo = ppc_optim();
  px_pp_opts po = {.build = ppc_build, .build_arg = &marg, .seed = 5, .optim = &oo, .dp = c, .zero_stage = 3};
  px_pp *pp = NULL;
  px_status st = px_pp_create(&pp, c, sched, &po);
  CHECK(st == PX_ERR_INVALID && !pp && strstr(px_last_error(), "ZeRO stage 3") &&
          strstr(px_last_error(), "does not combine"),
        "ZeRO 3 with the pipeline: %s", px_last_error());
  po.dp = NULL;
  po.zero_stage = 1;
  st = px_pp_create(&pp, c, sched, &po);
  CHECK(st == PX_ERR_INVALID && !pp && strstr(px_last_error(), "ZeRO stage 1 without a dp group"),
        "ZeRO 1 without dp: %s", px_last_error());
  px_pp_free(pp);
  px_pp_schedule_free(sched);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, refuse, NULL, &code));
  CHECK(code == 0, "the refusals failed");
  // dp × pp: the MLP (14 units), the global batch of 24 rows, 12 per replica.
  one((p3d_case){2, 1, 2, PX_PP_GPIPE, 2, 1, false, 0, 0.0f});
  one((p3d_case){2, 1, 2, PX_PP_1F1B, 4, 1, false, 0, 0.3f});
  one((p3d_case){2, 1, 2, PX_PP_INTERLEAVED, 4, 2, false, 0, 0.3f});
  // ZeRO 1 and 2 over dp, against DDP over dp beside them.
  one((p3d_case){2, 1, 2, PX_PP_1F1B, 4, 1, false, 1, 0.3f});
  one((p3d_case){2, 1, 2, PX_PP_GPIPE, 2, 1, false, 2, 0.0f});
  // dp 3: slices of unequal length (the chunks' sizes are not multiples of 3: padding).
  one((p3d_case){3, 1, 2, PX_PP_1F1B, 4, 1, false, 1, 0.3f});
  // tp × pp: the GPT, wte (vocabulary-parallel) on stage 0, its tied head on the last.
  one((p3d_case){1, 2, 2, PX_PP_GPIPE, 4, 1, true, 0, PPG_CLIP});
  one((p3d_case){1, 2, 2, PX_PP_1F1B, 4, 1, true, 0, PPG_CLIP});
  one((p3d_case){1, 2, 2, PX_PP_INTERLEAVED, 4, 2, true, 0, PPG_CLIP});
  // dp × tp × pp: 8 ranks, 4 sequences per replica.
  one((p3d_case){2, 2, 2, PX_PP_GPIPE, 2, 1, true, 0, PPG_CLIP});
  one((p3d_case){2, 2, 2, PX_PP_1F1B, 4, 1, true, 0, PPG_CLIP});
  one((p3d_case){2, 2, 2, PX_PP_INTERLEAVED, 2, 2, true, 0, PPG_CLIP});
  one((p3d_case){2, 2, 2, PX_PP_1F1B, 2, 1, true, 1, PPG_CLIP});
  return px_test_finish("test_pp_3d_equals_single_process");
}
