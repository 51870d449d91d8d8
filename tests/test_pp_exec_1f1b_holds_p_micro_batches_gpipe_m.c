/* Claim: activation memory follows the schedule.  With p = 4 ranks as
 * threads and m = 8 micro-batches, stage 0 keeps m micro-batches of
 * activations in flight under GPipe and p under 1F1B (its slots), and its
 * arenas' high-water mark (the activations actually held) under 1F1B is p/m
 * of GPipe's (within 10%); rank r under 1F1B keeps p - r.  With m = 2 < p,
 * 1F1B keeps m.
 * If this fails: the executor keeps a slot per micro-batch whatever the
 * schedule (memory of GPipe for every schedule), or frees a micro-batch's
 * activations before its backward. */
#include "px_test.h"

static px_module *mlp(void *arg) {
  (void)arg;
  px_module *c = px_chain();
  for (int i = 0; i < 8; i++) {
    px_chain_add(c, px_linear(32, 32, true));
    px_chain_add(c, px_relu());
  }
  return c;
}

static px_status loss(void *user, const px_tensor *out, int micro, float *l, float *d) {
  (void)user;
  (void)micro;
  int32_t t[16] = {0};
  return px_cross_entropy_loss(out, t, NULL, l, d);
}

typedef struct res {
  int slots[4];
  size_t bytes[4];
} res;

typedef struct arg {
  px_pp_kind kind;
  int m;
  res *out;
} arg;

static int run(px_comm *c, void *varg) {
  const arg *a = varg;
  px_comm_set_timeout(c, 60);
  px_pp_schedule *s;
  CHECK_OK(px_pp_schedule_make(a->kind, px_comm_size(c), a->m, 1, &s));
  px_pp_opts o = {.build = mlp, .seed = 2};
  px_pp *pp;
  CHECK_OK(px_pp_create(&pp, c, s, &o));
  float x[16 * 8 * 32];
  for (int i = 0; i < 16 * 8 * 32; i++) x[i] = (float)(i % 7) - 3.0f;
  px_tensor xt = px_tensor_view(x, PX_F32, 2, (int64_t[]){(int64_t)2 * a->m, 32});
  for (int k = 0; k < 2; k++) CHECK_OK(px_pp_step(pp, &xt, loss, NULL, NULL));
  px_pp_stats ps;
  px_pp_stats_get(pp, &ps);
  a->out->slots[px_comm_rank(c)] = ps.slots;
  a->out->bytes[px_comm_rank(c)] = ps.arena_high;
  px_pp_free(pp);
  px_pp_schedule_free(s);
  return px_test_failures ? 1 : 0;
}

static res one(px_pp_kind kind, int m) {
  res r = {0};
  arg a = {kind, m, &r};
  int code = 0;
  CHECK_OK(px_comm_run(4, run, &a, &code));
  CHECK(code == 0, "%s m %d: a rank failed (%d)", px_pp_kind_name(kind), m, code);
  return r;
}

int main(void) {
  const int p = 4, m = 8;
  res g = one(PX_PP_GPIPE, m), f = one(PX_PP_1F1B, m), f2 = one(PX_PP_1F1B, 2);
  CHECK(g.slots[0] == m, "GPipe stage 0 keeps %d micro-batches, expected m = %d", g.slots[0], m);
  for (int r = 0; r < p; r++)
    CHECK(f.slots[r] == p - r, "1F1B rank %d keeps %d micro-batches, expected p - r = %d", r, f.slots[r], p - r);
  CHECK(f2.slots[0] == 2, "1F1B with m = 2 < p: stage 0 keeps %d micro-batches, expected 2", f2.slots[0]);
  const double ratio = (double)f.bytes[0] / (double)g.bytes[0];
  CHECK(fabs(ratio - (double)p / m) <= 0.1 * p / m,
        "stage 0's activations: 1F1B %zu bytes, GPipe %zu: ratio %.3f, "
        "expected p/m = %.3f",
        f.bytes[0], g.bytes[0], ratio, (double)p / m);
  printf("  stage 0, p %d m %d: GPipe %d micro-batches, %zu bytes; 1F1B %d, %zu bytes (ratio %.3f)\n", p, m, g.slots[0],
         g.bytes[0], f.slots[0], f.bytes[0], ratio);
  return px_test_finish("test_pp_exec_1f1b_holds_p_micro_batches_gpipe_m");
}
