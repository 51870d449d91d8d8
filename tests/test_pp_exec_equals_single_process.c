/* Claim: a chain model cut into S = p·v pipeline stages and trained through
 * the generated GPipe, 1F1B and interleaved (v = 2) action tables, p = 2, 3
 * and 4 ranks as threads, gives the single process's loss at every one of
 * 20 AdamW steps and its parameters after them to 1e-5 relative, and its
 * evaluation loss; the stages start bit-for-bit equal to the single-process
 * model (tests/pp_cases.h).  The MLP has 14 units (not divisible by 3, 4, 6
 * or 8 stages), split by unit count, by parameter count and at named
 * units; one micro-batch and fewer micro-batches than stages run too.
 * And the GPT (8 units) with its embedding on the first stage and its tied
 * head on the last: the head's stage holds a copy of wte.weight, and the
 * two copies' gradients are summed, so both stay the single process's
 * wte.weight; gradient-norm clipping over all stages (the tied weight
 * counted once) gives the single process's norm at every step.
 * With dropout (0.2 in the MLP after every ReLU; 0.1 in the GPT's
 * embedding, attention and residuals) and m ≥ 2 micro-batches, every
 * schedule gives the losses and parameters of one process running the same
 * m micro-batches per step with gradient accumulation (pp_cases.h): the
 * stages draw the whole model's masks.
 * If this fails: a stage's modules draw other initial streams than in the
 * whole model, a micro-batch's activations were overwritten by another's
 * (slots), gradients are not summed over micro-batches or not scaled by
 * 1/m, or a message went to the wrong micro-batch (tags); with dropout
 * only: a module's mask stream is not its whole-model stream, or a
 * micro-batch's forward count is its slot's own instead of s·m + j + 1. */
#include "pp_cases.h"

typedef struct run_arg {
  bool gpt;
  px_pp_kind kind;
  int m, v;
  const px_pp_split *split;
  const char *split_name;
  float clip;
  float dropout;
} run_arg;

static int run(px_comm *c, void *varg) {
  const run_arg *a = varg;
  px_comm_set_timeout(c, 60);
  const int p = px_comm_size(c);
  px_pp_schedule *s;
  CHECK_OK(px_pp_schedule_make(a->kind, p, a->m, a->v, &s));
  char what[96];
  snprintf(what, sizeof what, "%s p %d m %d v %d, split %s%s", px_pp_kind_name(a->kind), p, a->m, a->v, a->split_name,
           a->dropout > 0 ? ", dropout" : "");
  if (a->gpt) ppg_case(c, s, a->dropout, what);
  else ppc_case(c, s, 6, a->split, a->clip, a->dropout, what);
  px_pp_schedule_free(s);
  return px_test_failures ? 1 : 0;
}

static void one(int p, run_arg a) {
  int code = 0;
  CHECK_OK(px_comm_run(p, run, &a, &code));
  CHECK(code == 0, "%s p %d m %d v %d: a rank failed (%d)", px_pp_kind_name(a.kind), p, a.m, a.v, code);
}

int main(void) {
  const px_pp_split by_params = {.kind = PX_PP_SPLIT_PARAMS};
  const char *const at3[] = {"2", "8"};  // stages: flatten 0 1 | 2 … 7 | 8 … 12
  const px_pp_split by_name = {.kind = PX_PP_SPLIT_AT, .at = at3, .n_at = 2};
  const int ps[] = {2, 3, 4}, ms[] = {1, 2, 4, 8};
  for (int i = 0; i < 3; i++) {
    const int p = ps[i];
    for (int k = 0; k < 4; k++) {
      one(p, (run_arg){false, PX_PP_GPIPE, ms[k], 1, NULL, "units", 0.0f, 0.0f});
      one(p, (run_arg){false, PX_PP_1F1B, ms[k], 1, NULL, "units", 0.0f, 0.0f});
    }
    one(p, (run_arg){false, PX_PP_INTERLEAVED, p, 2, NULL, "units", 0.0f, 0.0f});
    one(p, (run_arg){false, PX_PP_INTERLEAVED, 2 * p, 2, NULL, "units", 0.0f, 0.0f});
    one(p, (run_arg){false, PX_PP_1F1B, 4, 1, &by_params, "params", 0.0f, 0.0f});
  }
  one(3, (run_arg){false, PX_PP_1F1B, 6, 1, &by_name, "at 2, 8", 0.0f, 0.0f});
  // Gradient-norm clipping over every stage (0.3: acts on most steps).
  one(3, (run_arg){false, PX_PP_1F1B, 4, 1, NULL, "units, clip 0.3", 0.3f, 0.0f});
  one(2, (run_arg){false, PX_PP_INTERLEAVED, 4, 2, NULL, "units, clip 0.3", 0.3f, 0.0f});
  // One rank: every stage local (interleaved with v = 3: stages handed over in memory).
  one(1, (run_arg){false, PX_PP_INTERLEAVED, 2, 3, NULL, "units", 0.0f, 0.0f});
  // The GPT: wte on the first stage, its tied head on the last.
  for (int i = 0; i < 3; i++) {
    one(ps[i], (run_arg){true, PX_PP_GPIPE, 4, 1, NULL, "units", 0.0f, 0.0f});
    one(ps[i], (run_arg){true, PX_PP_1F1B, 8, 1, NULL, "units", 0.0f, 0.0f});
  }
  one(2, (run_arg){true, PX_PP_INTERLEAVED, 4, 2, NULL, "units", 0.0f, 0.0f});
  one(1, (run_arg){true, PX_PP_INTERLEAVED, 2, 2, NULL, "units", 0.0f, 0.0f});
  // Dropout: every schedule, several micro-batches in flight on a slot
  // pool (GPipe m, 1F1B p - rank), so a micro-batch runs on whichever slot
  // is free; and one rank with every stage local.
  for (int i = 0; i < 2; i++) {
    one(ps[i], (run_arg){false, PX_PP_GPIPE, 4, 1, NULL, "units", 0.0f, 0.2f});
    one(ps[i], (run_arg){false, PX_PP_1F1B, 8, 1, NULL, "units", 0.3f, 0.2f});
    one(ps[i], (run_arg){true, PX_PP_1F1B, 4, 1, NULL, "units", 0.0f, 0.1f});
  }
  one(2, (run_arg){false, PX_PP_INTERLEAVED, 4, 2, NULL, "units", 0.0f, 0.2f});
  one(2, (run_arg){true, PX_PP_INTERLEAVED, 4, 2, NULL, "units", 0.0f, 0.1f});
  one(1, (run_arg){true, PX_PP_INTERLEAVED, 2, 2, NULL, "units", 0.0f, 0.1f});
  return px_test_finish("test_pp_exec_equals_single_process");
}
