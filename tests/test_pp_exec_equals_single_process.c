/* Claim: a chain model cut into p pipeline stages (threads backend, p = 2,
 * 3, 4; an MLP of 14 units, not divisible by 3 or 4) and trained through a
 * GPipe action table with m micro-batches gives the single process's loss
 * at every one of 20 AdamW steps and its parameters after them, to 1e-5
 * relative, and its evaluation loss; the stages start bit-for-bit equal to
 * the single-process model (tests/pp_cases.h).
 * If this fails: a stage's modules draw other initial streams than in the
 * whole model, a micro-batch's activations were overwritten by another's
 * (slots), gradients are not summed over micro-batches or not scaled by
 * 1/m, or a message went to the wrong micro-batch (tags). */
#include "pp_cases.h"

// A GPipe table (until the schedule generators land): all forwards, then
// all backwards.
static px_pp_schedule *gpipe(int p, int m) {
  px_pp_schedule *s = calloc(1, sizeof *s);
  s->kind = PX_PP_GPIPE;
  s->p = p, s->m = m, s->v = 1;
  s->n_actions = calloc((size_t)p, sizeof *s->n_actions);
  s->actions = calloc((size_t)p, sizeof *s->actions);
  for (int r = 0; r < p; r++) {
    px_pp_action *a = calloc((size_t)(6 * m + 1), sizeof *a);
    int n = 0;
    for (int j = 0; j < m; j++) {
      if (r > 0) a[n++] = (px_pp_action){PX_PP_RECV_ACT, r, j, r - 1};
      a[n++] = (px_pp_action){PX_PP_FORWARD, r, j, -1};
      if (r < p - 1) a[n++] = (px_pp_action){PX_PP_SEND_ACT, r, j, r + 1};
    }
    for (int j = 0; j < m; j++) {
      if (r < p - 1) a[n++] = (px_pp_action){PX_PP_RECV_GRAD, r, j, r + 1};
      a[n++] = (px_pp_action){PX_PP_BACKWARD, r, j, -1};
      if (r > 0) a[n++] = (px_pp_action){PX_PP_SEND_GRAD, r, j, r - 1};
    }
    a[n++] = (px_pp_action){PX_PP_OPTIM_STEP, -1, -1, -1};
    s->actions[r] = a;
    s->n_actions[r] = n;
  }
  return s;
}

static void free_sched(px_pp_schedule *s) {
  for (int r = 0; r < s->p; r++) free(s->actions[r]);
  free(s->actions);
  free(s->n_actions);
  free(s);
}

typedef struct run_arg { int m; } run_arg;

static int run(px_comm *c, void *varg) {
  const run_arg *a = varg;
  px_comm_set_timeout(c, 60);
  const int p = px_comm_size(c);
  px_pp_schedule *s = gpipe(p, a->m);
  char what[64];
  snprintf(what, sizeof what, "GPipe p %d m %d", p, a->m);
  ppc_case(c, s, 6, NULL, what);
  free_sched(s);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  const int ps[] = {2, 3, 4}, ms[] = {1, 2, 4, 8};
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) {
      run_arg a = {.m = ms[k]};
      int code = 0;
      CHECK_OK(px_comm_run(ps[i], run, &a, &code));
      CHECK(code == 0, "p %d m %d: a rank failed (%d)", ps[i], ms[k], code);
    }
  return px_test_finish("test_pp_exec_equals_single_process");
}
