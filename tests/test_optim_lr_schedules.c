/* Claim: px_lr_at gives the documented learning rate at each step: a linear
 * warm-up base_lr·(step+1)/warmup_steps, then constant, step decay
 * base_lr·gamma^floor(step/step_size) (step counted from 0 including
 * warm-up), or cosine from base_lr to min_lr over (warmup_steps,
 * total_steps] and min_lr after.  If this fails, a schedule is off by one
 * step at a boundary, warm-up starts at 0 (a wasted step) or overshoots,
 * decay happens at the wrong step, or cosine does not end at min_lr, so runs
 * do not match the same schedule in PyTorch. */
#include "px_test.h"

static const double PI = 3.14159265358979323846;

int main(void) {
  const double tol = 1e-6;  // relative; px_lr_at returns float
  px_lr_schedule s;

  // Constant, no warm-up.
  s = (px_lr_schedule){.kind = PX_LR_CONSTANT, .base_lr = 0.3f};
  CHECK_CLOSE(px_lr_at(&s, 0), 0.3, tol);
  CHECK_CLOSE(px_lr_at(&s, 123456789), 0.3, tol);

  // Warm-up ramp over 10 steps: 0.01, 0.02, ..., 0.1, then base_lr.
  s = (px_lr_schedule){.kind = PX_LR_CONSTANT, .base_lr = 0.1f, .warmup_steps = 10};
  CHECK_CLOSE(px_lr_at(&s, 0), 0.01, tol);
  CHECK_CLOSE(px_lr_at(&s, 4), 0.05, tol);
  CHECK_CLOSE(px_lr_at(&s, 9), 0.1, tol);
  CHECK_CLOSE(px_lr_at(&s, 10), 0.1, tol);
  CHECK_CLOSE(px_lr_at(&s, 1000), 0.1, tol);
  for (int64_t t = 1; t < 10; t++)
    CHECK(px_lr_at(&s, t) > px_lr_at(&s, t - 1), "warm-up not increasing at step %lld", (long long)t);
  CHECK_CLOSE(px_lr_at(&s, -5), 0.01, tol);  // a negative step reads as step 0

  // Step decay: halve every 3 steps; boundaries at 3, 6, ...
  s = (px_lr_schedule){.kind = PX_LR_STEP, .base_lr = 1.0f, .step_size = 3, .gamma = 0.5f};
  CHECK_CLOSE(px_lr_at(&s, 0), 1.0, tol);
  CHECK_CLOSE(px_lr_at(&s, 2), 1.0, tol);
  CHECK_CLOSE(px_lr_at(&s, 3), 0.5, tol);
  CHECK_CLOSE(px_lr_at(&s, 5), 0.5, tol);
  CHECK_CLOSE(px_lr_at(&s, 6), 0.25, tol);
  CHECK_CLOSE(px_lr_at(&s, 30), 1.0 / 1024, tol);
  // With warm-up, the step count still starts at 0: steps 0-1 ramp, 2 is
  // base_lr, 3 is the first decay.
  s.warmup_steps = 2;
  CHECK_CLOSE(px_lr_at(&s, 0), 0.5, tol);
  CHECK_CLOSE(px_lr_at(&s, 1), 1.0, tol);
  CHECK_CLOSE(px_lr_at(&s, 2), 1.0, tol);
  CHECK_CLOSE(px_lr_at(&s, 3), 0.5, tol);
  // step_size <= 0: no decay.
  s = (px_lr_schedule){.kind = PX_LR_STEP, .base_lr = 1.0f, .step_size = 0, .gamma = 0.1f};
  CHECK_CLOSE(px_lr_at(&s, 50), 1.0, tol);

  // Cosine from 1.0 to 0.1 over 100 steps: endpoints, midpoint, quarter, after.
  s = (px_lr_schedule){.kind = PX_LR_COSINE, .base_lr = 1.0f, .total_steps = 100, .min_lr = 0.1f};
  CHECK_CLOSE(px_lr_at(&s, 0), 1.0, tol);
  CHECK_CLOSE(px_lr_at(&s, 50), 0.55, tol);
  CHECK_CLOSE(px_lr_at(&s, 25), 0.1 + 0.45 * (1 + cos(PI / 4)), tol);
  CHECK_CLOSE(px_lr_at(&s, 100), 0.1, tol);
  CHECK_CLOSE(px_lr_at(&s, 150), 0.1, tol);
  for (int64_t t = 1; t <= 100; t++)
    CHECK(px_lr_at(&s, t) < px_lr_at(&s, t - 1), "cosine not decreasing at step %lld", (long long)t);
  // With 10 warm-up steps the cosine spans steps 10..110.
  s.warmup_steps = 10;
  s.total_steps = 110;
  CHECK_CLOSE(px_lr_at(&s, 0), 0.1, tol);
  CHECK_CLOSE(px_lr_at(&s, 9), 1.0, tol);
  CHECK_CLOSE(px_lr_at(&s, 10), 1.0, tol);
  CHECK_CLOSE(px_lr_at(&s, 60), 0.55, tol);
  CHECK_CLOSE(px_lr_at(&s, 110), 0.1, tol);
  CHECK_CLOSE(px_lr_at(&s, 1000), 0.1, tol);
  // total_steps <= warmup_steps: nothing left to anneal, min_lr after warm-up.
  s.total_steps = 5;
  CHECK_CLOSE(px_lr_at(&s, 9), 1.0, tol);
  CHECK_CLOSE(px_lr_at(&s, 10), 0.1, tol);
  // min_lr 0 (the usual setting): 0 at the end.
  s = (px_lr_schedule){.kind = PX_LR_COSINE, .base_lr = 3e-4f, .total_steps = 1000};
  CHECK(px_lr_at(&s, 1000) == 0.0f, "cosine to 0 ends at %g", (double)px_lr_at(&s, 1000));
  CHECK_CLOSE(px_lr_at(&s, 500), 1.5e-4, tol);

  CHECK(px_lr_at(NULL, 3) == 0.0f, "NULL schedule");
  return px_test_finish("test_optim_lr_schedules");
}
