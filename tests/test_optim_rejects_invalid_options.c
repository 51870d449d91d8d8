/* Claim: px_optim_create refuses the options torch.optim refuses (negative
 * lr, momentum or weight decay; Nesterov without momentum or with
 * dampening; betas outside [0, 1)), plus eps <= 0, NaN options, missing or
 * overlapping buffers and unknown kinds, with PX_ERR_INVALID, a message that
 * names the problem, and no optimizer.  If this fails, a typo in a config
 * trains silently with nonsense (or NaN) instead of stopping with an error,
 * or an error leaks memory or a half-made optimizer. */
#include "px_test.h"

#include <string.h>

static float params[8], grads[8];
static px_optim not_null;  // a stale *out that create must clear

// Expects rejection; `needle` must appear in the message.
static void expect_invalid(const char *label, px_optim_opts opts, const char *needle) {
  px_optim *o = &not_null;
  px_clear_error();
  px_status st = px_optim_create(&o, params, grads, 8, &opts);
  CHECK(st == PX_ERR_INVALID, "%s: returned %s, expected PX_ERR_INVALID", label, px_status_name(st));
  CHECK(o == NULL, "%s: *out not NULL after a failure", label);
  CHECK(px_last_error()[0] != '\0', "%s: empty error message", label);
  CHECK(strstr(px_last_error(), needle) != NULL, "%s: message \"%s\" does not mention \"%s\"", label, px_last_error(),
        needle);
  if (st == PX_OK) px_optim_free(o);
}

static void expect_ok(const char *label, px_optim_opts opts) {
  px_optim *o = NULL;
  px_status st = px_optim_create(&o, params, grads, 8, &opts);
  CHECK(st == PX_OK && o != NULL, "%s: rejected (%s: %s)", label, px_status_name(st), px_last_error());
  px_optim_free(o);
}

int main(void) {
  px_optim_opts o;

  o = px_sgd_defaults(-0.1f);
  expect_invalid("sgd lr < 0", o, "learning rate");
  o = px_sgd_defaults(NAN);
  expect_invalid("sgd lr NaN", o, "learning rate");
  o = px_sgd_defaults(0.1f);
  o.momentum = -0.5f;
  expect_invalid("sgd momentum < 0", o, "momentum");
  o = px_sgd_defaults(0.1f);
  o.weight_decay = -1e-4f;
  expect_invalid("sgd weight decay < 0", o, "weight_decay");
  o = px_sgd_defaults(0.1f);
  o.nesterov = true;
  expect_invalid("nesterov without momentum", o, "Nesterov");
  o.momentum = 0.9f;
  o.dampening = 0.1f;
  expect_invalid("nesterov with dampening", o, "Nesterov");

  o = px_adam_defaults(1e-3f);
  o.beta1 = 1.0f;
  expect_invalid("adam beta1 = 1", o, "beta1");
  o = px_adam_defaults(1e-3f);
  o.beta1 = -0.1f;
  expect_invalid("adam beta1 < 0", o, "beta1");
  o = px_adamw_defaults(1e-3f);
  o.beta2 = 1.5f;
  expect_invalid("adamw beta2 > 1", o, "beta2");
  o = px_adam_defaults(1e-3f);
  o.beta2 = 1.0f;
  expect_invalid("adam beta2 = 1", o, "beta2");
  o = px_adam_defaults(1e-3f);
  o.beta2 = NAN;
  expect_invalid("adam beta2 NaN", o, "beta2");
  o = px_adam_defaults(1e-3f);
  o.eps = 0.0f;
  expect_invalid("adam eps = 0", o, "eps");
  o = px_adamw_defaults(1e-3f);
  o.eps = -1e-8f;
  expect_invalid("adamw eps < 0", o, "eps");
  o = px_adam_defaults(-1e-3f);
  expect_invalid("adam lr < 0", o, "learning rate");
  o = px_adamw_defaults(1e-3f);
  o.weight_decay = -0.01f;
  expect_invalid("adamw weight decay < 0", o, "weight_decay");
  o = px_adam_defaults(1e-3f);
  o.kind = (px_optim_kind)7;
  expect_invalid("unknown kind", o, "kind");

  // Buffers: NULL out/opts, NULL arrays with n > 0, params overlapping grads.
  px_optim *opt = NULL;
  o = px_sgd_defaults(0.1f);
  px_clear_error();
  CHECK(px_optim_create(NULL, params, grads, 8, &o) == PX_ERR_INVALID && px_last_error()[0], "NULL out accepted");
  px_clear_error();
  CHECK(px_optim_create(&opt, params, grads, 8, NULL) == PX_ERR_INVALID && !opt && px_last_error()[0],
        "NULL opts accepted");
  px_clear_error();
  CHECK(px_optim_create(&opt, NULL, grads, 8, &o) == PX_ERR_INVALID && !opt && px_last_error()[0],
        "NULL params accepted");
  px_clear_error();
  CHECK(px_optim_create(&opt, params, NULL, 8, &o) == PX_ERR_INVALID && !opt && px_last_error()[0],
        "NULL grads accepted");
  px_clear_error();
  CHECK(px_optim_create(&opt, params, params + 4, 8, &o) == PX_ERR_INVALID && !opt &&
          strstr(px_last_error(), "overlap"),
        "overlapping params and grads accepted: %s", px_last_error());
  px_clear_error();
  CHECK(px_optim_step(NULL) == PX_ERR_INVALID && px_last_error()[0], "step on NULL accepted");

  // The edges PyTorch accepts stay accepted: lr 0, beta 0, momentum 0 with
  // dampening, Nesterov with momentum and no dampening.
  expect_ok("sgd lr 0", px_sgd_defaults(0.0f));
  o = px_sgd_defaults(0.1f);
  o.dampening = 0.5f;
  expect_ok("sgd dampening without momentum", o);
  o.momentum = 0.9f;
  o.dampening = 0.0f;
  o.nesterov = true;
  expect_ok("sgd nesterov", o);
  o = px_adam_defaults(1e-3f);
  o.beta1 = 0.0f;
  o.beta2 = 0.0f;
  expect_ok("adam betas 0", o);
  // SGD ignores Adam's fields, and Adam SGD's.
  o = px_sgd_defaults(0.1f);
  o.beta1 = 2.0f;
  o.eps = 0.0f;
  expect_ok("sgd with nonsense betas", o);
  o = px_adam_defaults(1e-3f);
  o.nesterov = true;
  expect_ok("adam with nesterov flag", o);

  return px_test_finish("test_optim_rejects_invalid_options");
}
