/* Claim: a training checkpoint saved under any layout — world size 1, 2,
 * 3 or 4 × DDP or ZeRO stage 1, 2, 3 — loads under every layout of that
 * matrix (px_train's resume, threads backend), by intersecting the saved
 * pieces with the pieces each rank needs now:
 *
 * 1. the parameters after the resume are bitwise those that were saved;
 * 2. the optimizer state came along too (SGD momentum, whose buffer moves
 *    the next step): one more step after the resume ends within 1e-5 of
 *    the saving layout's own run to that step (the same global batch of
 *    12: per-rank batch 12, 6, 4, 3; only the reduction order differs).
 *
 * The model has 167 parameters (not a multiple of 2, 3 or 4) and a bias of
 * 3 elements, fewer than 4 ranks: pieces cut inside tensors, ranks holding
 * none of a tensor.  If this failed, a checkpoint would load only into the
 * layout that wrote it, or load with holes, shifted ranges or lost state. */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_test_util.h"
#include "px_test.h"
#include "train_blobs.h"

#include <math.h>
#include <string.h>

#define D 16
#define K 8
#define GLOBAL_BATCH 12
#define N_PARAMS 167

typedef struct run_arg {
  int stage;
  const char *ckpt_dir; /* NULL: no checkpoints */
  const char *resume;   /* NULL: fresh */
  int64_t stop_at;
  float final[N_PARAMS]; /* rank 0's parameters at the end */
  int64_t steps;
} run_arg;

static int run_rank(px_comm *comm, void *argp) {
  run_arg *a = argp;
  const int world = px_comm_size(comm);
  px_dataset *train = blobs_open(48, D, K, 1.0f, 3, 100);
  px_model *m;
  CHECK_OK(px_model_create(&m,
                           px_chain_of(5, px_linear(D, 7, true), px_tanh(), px_linear(7, 3, true), px_tanh(),
                                       px_linear(3, K, false)),
                           5));
  CHECK(m->n_param_elems == N_PARAMS, "the model has %zu parameters", m->n_param_elems);
  px_train_opts o = PX_TRAIN_DEFAULTS;
  o.batch_size = GLOBAL_BATCH / (size_t)world;
  o.workers = 0;
  o.epochs = 1;
  o.optim = px_sgd_defaults(0.1f);
  o.optim.momentum = 0.9f;
  o.seed = 7;
  o.log_every = 1000;
  o.zero.stage = a->stage;
  o.zero.bucket_bytes = o.zero.first_bucket_bytes = 64;  // several groups: more pieces
  o.ddp.bucket_bytes = o.ddp.first_bucket_bytes = 64;
  o.ckpt_dir = a->ckpt_dir;
  o.resume = a->resume;
  o.stop_at_step = a->stop_at;
  o.keep_last = 0;
  px_logger *log;
  px_logger_opts lo = {.rank = px_comm_rank(comm), .console = false};
  CHECK_OK(px_logger_create(&log, &lo));
  px_train_result r;
  px_status st = px_train(comm, m, train, NULL, &o, log, &r);
  px_logger_free(log);
  CHECK(st == PX_OK, "rank %d of %d, stage %d, resume %s: %s", px_comm_rank(comm), world, a->stage,
        a->resume ? a->resume : "-", px_last_error());
  if (px_comm_rank(comm) == 0) {
    memcpy(a->final, m->param_data, sizeof a->final);
    a->steps = r.steps;
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

int main(void) {
  char root[64];
  snprintf(root, sizeof root, "/tmp/px_reshard_XXXXXX");
  CHECK(mkdtemp(root) != NULL, "mkdtemp");
  // Each saving layout: its checkpoint at step 2, its parameters there,
  // and its own run on to step 3 (the reference for the resumed step).
  enum { LAYOUTS = 16 };
  static char ckpt[LAYOUTS][160];
  static float saved[LAYOUTS][N_PARAMS], ref3[LAYOUTS][N_PARAMS];
  for (int l = 0; l < LAYOUTS; l++) {
    const int world = 1 + l / 4, stage = l % 4;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/w%d_z%d", root, world, stage);
    run_arg a = {.stage = stage, .ckpt_dir = dir, .stop_at = 2};
    run(world, &a);
    CHECK(a.steps == 2, "world %d stage %d stopped at step %lld", world, stage, (long long)a.steps);
    snprintf(ckpt[l], sizeof ckpt[l], "%s/step_00000002", dir);
    memcpy(saved[l], a.final, sizeof a.final);
    run_arg b = {.stage = stage, .resume = ckpt[l], .stop_at = 3};
    run(world, &b);
    memcpy(ref3[l], b.final, sizeof b.final);
  }
  double worst = 0;
  for (int from = 0; from < LAYOUTS; from++)
    for (int to = 0; to < LAYOUTS; to++) {
      const int wf = 1 + from / 4, sf = from % 4, wt = 1 + to / 4, stt = to % 4;
      // 1. Loaded, not stepped: the saved parameters, bit for bit.
      run_arg a = {.stage = stt, .resume = ckpt[from], .stop_at = 2};
      run(wt, &a);
      CHECK(a.steps == 2, "resumed at step %lld", (long long)a.steps);
      CHECK(memcmp(a.final, saved[from], sizeof a.final) == 0,
            "saved on %d rank(s) stage %d, loaded on %d rank(s) stage %d: parameters differ", wf, sf, wt, stt);
      // 2. One step on: the optimizer state carried over.
      run_arg b = {.stage = stt, .resume = ckpt[from], .stop_at = 3};
      run(wt, &b);
      double scale = 0, diff = 0, moved = 0;
      for (int i = 0; i < N_PARAMS; i++) {
        scale = fmax(scale, fabs(ref3[from][i]));
        diff = fmax(diff, fabs((double)b.final[i] - ref3[from][i]));
        moved = fmax(moved, fabs((double)ref3[from][i] - saved[from][i]));
      }
      CHECK(moved > 1e-3 * scale, "the reference step moved nothing (%g): the check would be vacuous", moved);
      CHECK(diff <= 1e-5 * scale,
            "saved on %d rank(s) stage %d, resumed on %d rank(s) stage %d: step 3 differs by "
            "%g (of %g)",
            wf, sf, wt, stt, diff, scale);
      worst = fmax(worst, diff / scale);
    }
  printf("16 x 16 layouts: parameters bitwise equal after every load; step 3 after a resume within %.2g relative\n",
         worst);
  ckpt_rm_rf(root);
  return px_test_finish("test_checkpoint_reshards_any_layout_into_any");
}
