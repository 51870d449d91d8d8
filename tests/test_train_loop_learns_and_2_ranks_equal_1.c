/* Claims about px_train, the training loop:
 *
 * 1. It learns: an MLP on 8 Gaussian blobs reaches >= 0.9 held-out
 *    accuracy, and the held-out loss falls below its first value (eval
 *    every 20 steps, accumulation of 2 micro-batches, cosine schedule with
 *    warm-up, clipping).
 * 2. N ranks give the answer of one: 2 ranks (threads backend) with batch B
 *    end with the weights of 1 rank with batch 2B, to 1e-5 relative: the
 *    sampler deals each step's global batch out so the two runs average
 *    the same samples' gradients.
 * 3. Evaluation is exact over ranks: px_evaluate on 1, 2 and 3 ranks gives
 *    the same loss and accuracy over the whole held-out split (1001
 *    samples: uneven shares, nothing padded or repeated).
 * 4. Bad options are refused with a message (accum_steps 0, no length).
 *
 * If 2 failed, the loop would mis-scale accumulated or averaged gradients,
 * step the schedule on the wrong count, or let ranks drift apart. */
#include "px_test.h"
#include "train_blobs.h"

#include <string.h>

#define D 16
#define K 8

static px_model *make_mlp(uint64_t seed) {
  px_model *m;
  px_module *root = px_chain_of(5, px_linear(D, 64, true), px_relu(), px_linear(64, 64, true), px_relu(),
                                px_linear(64, K, true));
  CHECK_OK(px_model_create(&m, root, seed));
  return m;
}

static px_train_opts base_opts(size_t batch) {
  px_train_opts o = PX_TRAIN_DEFAULTS;
  o.batch_size = batch;
  o.workers = 1;
  o.epochs = 3;
  o.accum_steps = 2;
  o.optim = px_adamw_defaults(3e-3f);
  o.schedule = (px_lr_schedule){.kind = PX_LR_COSINE, .warmup_steps = 5, .min_lr = 1e-4f};
  o.clip_grad_norm = 5.0f;
  o.seed = 11;
  o.log_every = 1000;
  return o;
}

typedef struct run_arg {
  size_t batch;
  float *final; /* rank 0 copies the final parameters here */
  size_t n_final;
  double first_eval_loss, last_eval_loss, last_acc;
  bool eval_every;
} run_arg;

static int first_eval_hook_loss_set;
static double first_eval_hook_loss;
static void on_eval(const px_eval_metrics *m, void *user) {
  (void)user;
  if (!first_eval_hook_loss_set) {
    first_eval_hook_loss = m->loss;
    first_eval_hook_loss_set = 1;
  }
}

static int run_rank(px_comm *comm, void *argp) {
  run_arg *a = argp;
  px_dataset *train = blobs_open(2000, D, K, 1.0f, 3, 100);
  px_dataset *val = blobs_open(1001, D, K, 1.0f, 3, 200);
  px_model *m = make_mlp(5);
  px_train_opts o = base_opts(a->batch);
  if (a->eval_every) o.eval_every = 20;
  px_logger *log;
  px_logger_opts lo = {.rank = px_comm_rank(comm), .console = false};
  CHECK_OK(px_logger_create(&log, &lo));
  px_log_hooks h = {.on_eval = on_eval};
  CHECK_OK(px_log_add_hooks(log, &h));
  px_train_result r;
  CHECK_OK(px_train(comm, m, train, val, &o, log, &r));
  if (px_comm_rank(comm) == 0) {
    a->n_final = m->n_param_elems;
    a->final = malloc(a->n_final * sizeof(float));
    memcpy(a->final, m->param_data, a->n_final * sizeof(float));
    a->last_eval_loss = r.eval.loss;
    a->last_acc = r.eval.accuracy;
    const size_t world = (size_t)px_comm_size(comm), per_rank = (2000 + world - 1) / world;
    const int64_t batches = (int64_t)((per_rank + a->batch - 1) / a->batch);
    CHECK(r.steps == 3 * ((batches + 1) / 2), "%lld steps, expected %lld", (long long)r.steps,
          (long long)(3 * ((batches + 1) / 2)));
    CHECK(r.eval.samples == 1001, "evaluated %lld samples, expected all 1001", (long long)r.eval.samples);
  }
  px_logger_free(log);
  px_model_free(m);
  px_dataset_free(train);
  px_dataset_free(val);
  return 0;
}

typedef struct eval_arg {
  float *params;
  double loss, acc;
} eval_arg;

static int eval_rank(px_comm *comm, void *argp) {
  eval_arg *a = argp;
  px_dataset *val = blobs_open(1001, D, K, 1.0f, 3, 200);
  px_model *m = make_mlp(5);
  memcpy(m->param_data, a->params, m->n_param_elems * sizeof(float));
  px_eval_metrics e;
  CHECK_OK(px_evaluate(comm, m, val, 64, 0, 0, &e));
  CHECK(e.samples == 1001, "%lld samples", (long long)e.samples);
  if (px_comm_rank(comm) == 0) {
    a->loss = e.loss;
    a->acc = e.accuracy;
  }
  px_model_free(m);
  px_dataset_free(val);
  return 0;
}

int main(void) {
  int code;
  // 1: learning, with evaluation every 20 steps.
  run_arg one = {.batch = 32, .eval_every = true};
  CHECK_OK(px_comm_run(1, run_rank, &one, &code));
  CHECK(code == 0, "one rank failed");
  CHECK(one.last_acc >= 0.9, "held-out accuracy %.3f, expected >= 0.9", one.last_acc);
  CHECK(first_eval_hook_loss_set && one.last_eval_loss < 0.5 * first_eval_hook_loss,
        "held-out loss %.4f did not fall below half its first value %.4f", one.last_eval_loss, first_eval_hook_loss);

  // 2: two ranks of batch 16 = one rank of batch 32.
  run_arg two = {.batch = 16};
  CHECK_OK(px_comm_run(2, run_rank, &two, &code));
  CHECK(code == 0, "two ranks failed");
  run_arg single = {.batch = 32};
  CHECK_OK(px_comm_run(1, run_rank, &single, &code));
  double rel = px_max_rel_diff(two.final, single.final, single.n_final, 1e-2);
  CHECK(rel < 1e-5, "2 ranks x 16 vs 1 rank x 32: parameters differ by %.3g relative", rel);

  // 3: evaluation on 1, 2, 3 ranks.
  double loss[3], acc[3];
  for (int n = 1; n <= 3; n++) {
    eval_arg e = {.params = single.final};
    CHECK_OK(px_comm_run(n, eval_rank, &e, &code));
    loss[n - 1] = e.loss;
    acc[n - 1] = e.acc;
  }
  for (int n = 2; n <= 3; n++) {
    CHECK(fabs(loss[n - 1] - loss[0]) < 1e-6 * fabs(loss[0]), "eval loss on %d ranks %.9g vs 1 rank %.9g", n,
          loss[n - 1], loss[0]);
    CHECK(acc[n - 1] == acc[0], "eval accuracy on %d ranks %.6f vs 1 rank %.6f", n, acc[n - 1], acc[0]);
  }

  // 4: options.
  px_dataset *train = blobs_open(100, D, K, 1.0f, 3, 100);
  px_model *m = make_mlp(5);
  px_train_opts o = base_opts(8);
  o.accum_steps = 0;
  CHECK(px_train(NULL, m, train, NULL, &o, NULL, NULL) == PX_ERR_INVALID, "accum_steps 0 accepted");
  CHECK(strstr(px_last_error(), "accum_steps"), "message: %s", px_last_error());
  o = base_opts(8);
  o.epochs = 0;
  CHECK(px_train(NULL, m, train, NULL, &o, NULL, NULL) == PX_ERR_INVALID, "no length accepted");
  px_model_free(m);
  px_dataset_free(train);
  free(one.final);
  free(two.final);
  free(single.final);
  return px_test_finish("test_train_loop_learns_and_2_ranks_equal_1");
}
