/* Claim: the base learning rate of a px_train run has one source, optim.lr:
 * px_train_schedule sets the schedule's base_lr to it (so px_lr_at of every
 * step scales optim.lr), fills total_steps 0 with the run's length, keeps a
 * total given, accepts a base_lr equal to optim.lr, and refuses one that
 * differs -- before, px_train silently trained at schedule.base_lr and
 * ignored optim.lr whenever both were set. */
#include "px_test.h"

#include <string.h>

int main(void) {
  px_train_opts o = PX_TRAIN_DEFAULTS;
  o.optim.lr = 0.25f;
  o.schedule = (px_lr_schedule){.kind = PX_LR_COSINE, .warmup_steps = 4, .min_lr = 0.01f};
  px_lr_schedule s;
  CHECK_OK(px_train_schedule(&o, 100, &s));
  CHECK(s.base_lr == 0.25f, "base_lr %g, expected optim.lr 0.25", (double)s.base_lr);
  CHECK(s.total_steps == 100, "total_steps %lld, expected the run's 100", (long long)s.total_steps);
  CHECK(s.kind == PX_LR_COSINE && s.warmup_steps == 4 && s.min_lr == 0.01f, "the schedule's shape changed");
  // Warm-up's last step and the step after are the base rate, optim.lr's.
  CHECK(px_lr_at(&s, 3) == 0.25f && px_lr_at(&s, 4) == 0.25f, "lr at 3, 4: %g %g", (double)px_lr_at(&s, 3),
        (double)px_lr_at(&s, 4));

  o.schedule.total_steps = 40;  // a length given is kept
  CHECK_OK(px_train_schedule(&o, 100, &s));
  CHECK(s.total_steps == 40, "total_steps %lld, expected 40 as given", (long long)s.total_steps);

  o.schedule.base_lr = 0.25f;  // the same rate twice: accepted
  CHECK_OK(px_train_schedule(&o, 100, &s));
  CHECK(s.base_lr == 0.25f, "base_lr %g", (double)s.base_lr);

  o.schedule.base_lr = 0.5f;  // two rates: refused, naming both
  CHECK(px_train_schedule(&o, 100, &s) == PX_ERR_INVALID, "a base_lr other than optim.lr was accepted");
  CHECK(strstr(px_last_error(), "schedule.base_lr is 0.5") && strstr(px_last_error(), "optim.lr is 0.25"),
        "message: %s", px_last_error());
  if (px_test_failures) return 1;
  printf("ok: the base learning rate comes from optim.lr only; a second, different one is refused\n");
  return 0;
}
