/* Claim: a run on 4 ranks (threads backend), stopped mid-epoch and resumed
 * on 2 or on 3 ranks with the same global batch (per-rank batch 6 or 4
 * instead of 3), ends within 1e-6 relative of the 4-rank run that never
 * stopped, under DDP and under ZeRO stages 1 and 3 (AdamW, clipping, a
 * cosine schedule): the data position, the step counter, the optimizer's
 * state and update count and the schedule all carry over.  With another
 * global batch (2 ranks × batch 3: 6 instead of 12) the resumed run goes on
 * from the same sample count: its step counter is counted in its own steps
 * (3 steps of 12 samples = step 6 of 6), and it ends at the end of the last
 * epoch (step 16), not past it.
 *
 * If this failed, a resume on another world size would skip or repeat
 * samples, restart the schedule, or train past the run's last epoch. */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_test_util.h"
#include "px_test.h"
#include "train_blobs.h"

#include <math.h>
#include <string.h>

#define D 16
#define K 8
#define N_PARAMS 167

typedef struct run_arg {
  int stage;
  size_t batch;
  const char *ckpt_dir, *resume;
  int64_t stop_at;
  float final[N_PARAMS];
  int64_t steps, start_step;
} run_arg;

static int run_rank(px_comm *comm, void *argp) {
  run_arg *a = argp;
  px_dataset *train = blobs_open(48, D, K, 1.0f, 3, 100);
  px_model *m;
  CHECK_OK(px_model_create(&m,
                           px_chain_of(5, px_linear(D, 7, true), px_tanh(), px_linear(7, 3, true), px_tanh(),
                                       px_linear(3, K, false)),
                           5));
  px_train_opts o = PX_TRAIN_DEFAULTS;
  o.batch_size = a->batch;
  o.workers = 0;
  o.epochs = 2;
  o.optim = px_adamw_defaults(1e-2f);
  o.schedule = (px_lr_schedule){.kind = PX_LR_COSINE, .warmup_steps = 2, .min_lr = 1e-4f};
  o.clip_grad_norm = 1.0f;
  o.seed = 7;
  o.log_every = 1000;
  o.zero.stage = a->stage;
  o.zero.bucket_bytes = o.zero.first_bucket_bytes = 64;
  o.ckpt_dir = a->ckpt_dir;
  o.resume = a->resume;
  o.stop_at_step = a->stop_at;
  px_logger *log;
  px_logger_opts lo = {.rank = px_comm_rank(comm), .console = false};
  CHECK_OK(px_logger_create(&log, &lo));
  px_train_result r;
  px_status st = px_train(comm, m, train, NULL, &o, log, &r);
  CHECK(st == PX_OK, "rank %d: %s", px_comm_rank(comm), px_last_error());
  px_logger_free(log);
  if (px_comm_rank(comm) == 0) {
    memcpy(a->final, m->param_data, sizeof a->final);
    a->steps = r.steps;
    a->start_step = r.start_step;
  }
  px_model_free(m);
  px_dataset_free(train);
  return 0;
}

static void run(int world, run_arg *a) {
  int code = 0;
  CHECK_OK(px_comm_run(world, run_rank, a, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
}

static double rel_diff(const float *x, const float *y) {
  double scale = 0, diff = 0;
  for (int i = 0; i < N_PARAMS; i++) {
    scale = fmax(scale, fabs(y[i]));
    diff = fmax(diff, fabs((double)x[i] - y[i]));
  }
  return diff / scale;
}

int main(void) {
  char root[64];
  snprintf(root, sizeof root, "/tmp/px_resume_worlds_XXXXXX");
  CHECK(mkdtemp(root) != NULL, "mkdtemp");
  static const int stages[3] = {0, 1, 3};
  for (int s = 0; s < 3; s++) {
    const int stage = stages[s];
    // 48 samples, global batch 12: 4 steps an epoch, 8 in all.
    run_arg straight = {.stage = stage, .batch = 3};
    run(4, &straight);
    CHECK(straight.steps == 8, "the 4-rank run took %lld steps", (long long)straight.steps);
    char dir[128], ck[160];
    snprintf(dir, sizeof dir, "%s/z%d", root, stage);
    run_arg stop = {.stage = stage, .batch = 3, .ckpt_dir = dir, .stop_at = 3};
    run(4, &stop);
    snprintf(ck, sizeof ck, "%s/step_00000003", dir);
    for (int world = 2; world <= 3; world++) {
      run_arg on = {.stage = stage, .batch = 12 / (size_t)world, .resume = ck};
      run(world, &on);
      CHECK(on.start_step == 3 && on.steps == 8, "stage %d, 4 -> %d ranks: steps %lld..%lld, expected 3..8", stage,
            world, (long long)on.start_step, (long long)on.steps);
      const double d = rel_diff(on.final, straight.final);
      printf("stage %d: 4 ranks stopped at step 3, resumed on %d: %.3g relative from the unstopped run\n", stage, world,
             d);
      CHECK(d <= 1e-6, "stage %d, 4 -> %d ranks: %g relative from the unstopped run", stage, world, d);
    }
    // Another global batch: from the same sample count, to the last epoch's end.
    run_arg half = {.stage = stage, .batch = 3, .resume = ck};
    run(2, &half);
    CHECK(half.start_step == 6 && half.steps == 16, "stage %d, 4 x 3 -> 2 x 3: steps %lld..%lld, expected 6..16", stage,
          (long long)half.start_step, (long long)half.steps);
  }
  ckpt_rm_rf(root);
  return px_test_finish("test_train_resumes_across_world_sizes");
}
