// Learning rate as a function of the optimizer step (0-based).
//
// Warm-up (every kind), when warmup_steps > 0 and step < warmup_steps:
//   lr = base_lr · (step + 1) / warmup_steps
// a linear ramp from base_lr/warmup_steps at step 0 to base_lr at the last
// warm-up step.  Afterwards:
//   CONSTANT: lr = base_lr
//   STEP:     lr = base_lr · gamma^floor(step / step_size)
//             step counts from 0 including the warm-up steps (as a
//             StepLR that runs from the start); step_size <= 0 means constant.
//   COSINE:   p  = (step - warmup_steps) / (total_steps - warmup_steps),
//             clamped to [0, 1] (p = 1 when total_steps <= warmup_steps)
//             lr = min_lr + ½·(base_lr - min_lr)·(1 + cos(π·p))
//             so base_lr right after warm-up, min_lr from total_steps on.
// A negative step is read as step 0.  Computed in double, returned as float.
#include "plexus/optim.h"

#include <math.h>

static const double PX_PI = 3.14159265358979323846;

float px_lr_at(const px_lr_schedule *s, int64_t step) {
  if (!s) return 0.0f;
  if (step < 0) step = 0;
  const double base = s->base_lr;
  if (s->warmup_steps > 0 && step < s->warmup_steps)
    return (float)(base * (double)(step + 1) / (double)s->warmup_steps);

  switch (s->kind) {
  case PX_LR_CONSTANT: return (float)base;
  case PX_LR_STEP:
    if (s->step_size <= 0) return (float)base;
    return (float)(base * pow((double)s->gamma, (double)(step / s->step_size)));
  case PX_LR_COSINE: {
    const int64_t warmup = s->warmup_steps > 0 ? s->warmup_steps : 0;
    const int64_t span = s->total_steps - warmup;
    double p = span > 0 ? (double)(step - warmup) / (double)span : 1.0;
    p = p < 0.0 ? 0.0 : (p > 1.0 ? 1.0 : p);
    const double min_lr = s->min_lr;
    return (float)(min_lr + 0.5 * (base - min_lr) * (1.0 + cos(PX_PI * p)));
  }
  }
  return (float)base;
}
