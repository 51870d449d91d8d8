/* Claim: listeners come and go (DESIGN decision 7).  A removed listener's
 * slot is reused, so DDP and ZeRO (stages 1-3) can each be wrapped and
 * freed 20 times on one model, more than PX_MAX_HOOKS, and each step then
 * reaches only the live listeners (a freed one would be a use after free,
 * which the ASan build reports); after px_zero_free the model trains alone; two listeners attached at once both hear every
 * hook, in slot order; a stale handle removes nothing.  If it fails, a
 * model can be wrapped only PX_MAX_HOOKS times in its life, or a freed
 * strategy is still called (a use after free). */
#include "px_test.h"

#include <string.h>

typedef struct counter {
  int pre_forward, post_forward, pre_backward, grads_ready;
  int order_seen; /* what `order` read when this listener heard the root's pre_forward */
  int *order;
} counter;

static void c_pf(void *u, px_module *m) {
  counter *c = u;
  c->pre_forward++;
  if (!m->parent) c->order_seen = (*c->order)++;
}
static void c_qf(void *u, px_module *m) {
  (void)m;
  ((counter *)u)->post_forward++;
}
static void c_pb(void *u, px_module *m) {
  (void)m;
  ((counter *)u)->pre_backward++;
}
static void c_gr(void *u, px_module *m) {
  (void)m;
  ((counter *)u)->grads_ready++;
}

static px_hooks counting(counter *c) {
  return (px_hooks){.user = c, .pre_forward = c_pf, .post_forward = c_qf, .pre_backward = c_pb, .grads_ready = c_gr};
}

static void one_step(px_model *md) {
  float xs[2 * 3] = {0.1f, -0.2f, 0.3f, 0.5f, 0.4f, -0.6f};
  px_tensor x = px_tensor_f32(xs, 2, 2, 3, 0, 0), y;
  CHECK_OK(px_model_forward(md, &x, &y));
  px_tensor dy = y;
  dy.data = px_model_scratch(md, (size_t)px_tensor_numel(&y));
  px_fill(px_f32(&dy), (size_t)px_tensor_numel(&y), 1.0f);
  CHECK_OK(px_model_backward(md, &dy, NULL));
}

static px_model *make(void) {
  px_model *md;
  CHECK_OK(px_model_create(&md, px_chain_of(3, px_linear(3, 4, true), px_tanh(), px_linear(4, 2, true)), 7));
  return md;
}

// 4 modules (chain + 3 children): each step fires every hook 4 times.
enum { N_MODULES = 4 };

static int wrap_many(px_comm *c, void *arg) {
  (void)arg;
  px_model *md = make();
  int order = 0;
  counter always = {.order = &order};
  int h_always;
  px_hooks hk = counting(&always);
  CHECK_OK(px_model_attach_hooks(md, &hk, &h_always));
  for (int i = 0; i < 20; i++) {
    px_ddp *d;
    CHECK_OK(px_ddp_wrap(&d, md, c, NULL));
    CHECK(md->ctx.n_hooks == 2, "wrap %d: %d hook slots in use, expected 2", i, md->ctx.n_hooks);
    px_model_zero_grad(md);
    one_step(md);
    CHECK_OK(px_ddp_sync(d));
    px_ddp_free(d);
    CHECK(md->ctx.n_hooks == 1, "free %d: %d hook slots in use, expected 1", i, md->ctx.n_hooks);
  }
  CHECK(always.pre_forward == 20 * N_MODULES && always.grads_ready == 20 * N_MODULES,
        "the listener beside DDP heard %d pre_forward and %d grads_ready, expected %d each", always.pre_forward,
        always.grads_ready, 20 * N_MODULES);
  // ZeRO, every stage, 20 times each; after each free the model is whole
  // again (stage 3 gathers param_data back) and trains alone.
  for (int stage = 1; stage <= 3; stage++)
    for (int i = 0; i < 20; i++) {
      px_zero_opts o = PX_ZERO_DEFAULTS;
      o.stage = stage;
      px_zero *z;
      CHECK_OK(px_zero_wrap(&z, md, c, &o));
      CHECK(md->ctx.n_hooks == 2, "ZeRO-%d wrap %d: %d hook slots in use, expected 2", stage, i, md->ctx.n_hooks);
      px_zero_zero_grad(z);
      one_step(md);
      CHECK_OK(px_zero_sync(z));
      CHECK_OK(px_zero_after_step(z));
      CHECK_OK(px_zero_free(z));
      CHECK(md->ctx.n_hooks == 1 && md->param_data && md->grad_data,
            "ZeRO-%d free %d: %d slots in use, param_data %p, grad_data %p", stage, i, md->ctx.n_hooks,
            (void *)md->param_data, (void *)md->grad_data);
      px_model_zero_grad(md);
      one_step(md);  // alone: no listener but `always`
    }
  CHECK(always.pre_forward == (20 + 3 * 20 * 2) * N_MODULES,
        "the listener beside ZeRO heard %d pre_forward, expected %d", always.pre_forward, (20 + 120) * N_MODULES);
  px_model_remove_hooks(md, h_always);
  CHECK(md->ctx.n_hooks == 0, "%d slots after removing the last listener", md->ctx.n_hooks);
  px_model_free(md);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  px_model *md = make();

  // Two listeners at once: both hear every hook, in slot order.
  int order = 0;
  counter a = {.order = &order}, b = {.order = &order};
  int ha, hb;
  px_hooks hka = counting(&a), hkb = counting(&b);
  CHECK_OK(px_model_attach_hooks(md, &hka, &ha));
  CHECK_OK(px_model_attach_hooks(md, &hkb, &hb));
  CHECK(ha > 0 && hb > 0 && ha != hb, "handles %d and %d", ha, hb);
  one_step(md);
  CHECK(a.pre_forward == N_MODULES && a.post_forward == N_MODULES && a.pre_backward == N_MODULES &&
          a.grads_ready == N_MODULES,
        "listener a heard %d/%d/%d/%d, expected %d of each", a.pre_forward, a.post_forward, a.pre_backward,
        a.grads_ready, N_MODULES);
  CHECK(memcmp(&a, &b, offsetof(counter, order_seen)) == 0, "listeners a and b heard different hooks");
  CHECK(a.order_seen == 0 && b.order_seen == 1, "slot order: a saw %d, b saw %d", a.order_seen, b.order_seen);

  // Remove a: only b hears; a's slot is then reused by c, and the stale
  // handle ha removes nothing.
  px_model_remove_hooks(md, ha);
  one_step(md);
  CHECK(a.pre_forward == N_MODULES, "a removed but heard %d pre_forward", a.pre_forward);
  CHECK(b.pre_forward == 2 * N_MODULES, "b heard %d pre_forward, expected %d", b.pre_forward, 2 * N_MODULES);
  counter c = {.order = &order};
  int hc;
  px_hooks hkc = counting(&c);
  CHECK_OK(px_model_attach_hooks(md, &hkc, &hc));
  CHECK(md->ctx.n_hooks == 2, "c should reuse a's slot: %d slots in use", md->ctx.n_hooks);
  px_model_remove_hooks(md, ha);  // stale
  px_model_remove_hooks(md, 0);
  one_step(md);
  CHECK(c.pre_forward == N_MODULES && b.pre_forward == 3 * N_MODULES,
        "after a stale remove: c heard %d (expected %d), b %d (expected %d)", c.pre_forward, N_MODULES, b.pre_forward,
        3 * N_MODULES);
  px_model_remove_hooks(md, hb);
  px_model_remove_hooks(md, hc);

  // Full table: the (PX_MAX_HOOKS + 1)-th listener is refused with a message.
  counter many[PX_MAX_HOOKS];
  int hs[PX_MAX_HOOKS];
  for (int i = 0; i < PX_MAX_HOOKS; i++) {
    many[i] = (counter){.order = &order};
    px_hooks h = counting(&many[i]);
    CHECK_OK(px_model_attach_hooks(md, &h, &hs[i]));
  }
  int extra = -1;
  px_status st = px_model_attach_hooks(md, &hka, &extra);
  CHECK(st == PX_ERR_INVALID && extra == 0 && strstr(px_last_error(), "px_model_remove_hooks"),
        "a full table gives %s (handle %d): %s", px_status_name(st), extra, px_last_error());
  for (int i = 0; i < PX_MAX_HOOKS; i++) px_model_remove_hooks(md, hs[i]);
  px_model_free(md);

  // DDP wrapped and freed 20 times on one model, 1 and 2 ranks.
  for (int n = 1; n <= 2; n++) {
    int code = 0;
    CHECK_OK(px_comm_run(n, wrap_many, NULL, &code));
    CHECK(code == 0, "%d ranks: a rank failed (%d)", n, code);
  }
  return px_test_finish("test_model_hooks_attach_remove_reuse_slots");
}
