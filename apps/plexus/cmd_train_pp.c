// plexus train --pp P: the configured model of the zoo cut into P pipeline
// stages, one per rank (P = the world size: pipeline × data parallel is not
// built), trained with --schedule-pp over --micro-batches M per step.
//
//   plexus train --threads 2 --pp 2 --micro-batches 4 --model mlp ...
//   mpirun -n 4 plexus train --pp 4 --schedule-pp gpipe ...
//
// Every rank opens the data and walks the same batches (stage 0 reads the
// inputs, the last stage the targets), so no batch travels between ranks.
// What the data-parallel loop (px_train) has and this one does not yet:
// checkpoints, learning-rate schedules, accumulation,
// the JSONL/TensorBoard logs.  The options for them are refused or noted.
#include "app.h"

#include <stdio.h>
#include <string.h>

typedef struct build_arg {
  const px_config *c;
  px_data_shape    shape;
} build_arg;

static px_module *build(void *arg) {
  const build_arg *b = arg;
  px_module *root = NULL;
  return px_app_build_model(b->c, &b->shape, &root) == PX_OK ? root : NULL;
}

static int fail(px_comm *comm, const char *what) {
  fprintf(stderr, "plexus train: rank %d: %s%s%s\n", px_comm_rank(comm), what, *what ? ": " : "", px_last_error());
  return 1;
}

// Mean loss over the held-out split, forward only through the pipeline.
static px_status evaluate(px_pp *pp, px_dataset *set, const px_config *c, int m, double *loss, size_t *batches) {
  px_loader_opts lo = PX_LOADER_DEFAULTS;
  lo.batch_size = (size_t)c->batch_size;
  lo.shuffle = false;
  lo.drop_last_batch = true;  // equal micro-batches
  lo.seed = (uint64_t)c->seed;
  px_loader *ld;
  px_status st = px_loader_create(&ld, set, &lo);
  if (st != PX_OK) return st;
  st = px_loader_start_epoch(ld, 0, 0);
  double sum = 0;
  size_t n = 0;
  const px_batch *b;
  while (st == PX_OK && (c->eval_batches <= 0 || (int64_t)n < c->eval_batches)) {
    if ((st = px_loader_next(ld, &b)) != PX_OK || !b) break;
    px_pp_ce_targets tg = {.targets = b->y.data, .rows_per_micro = px_tensor_numel(&b->y) / m};
    float l;
    if ((st = px_pp_eval(pp, &b->x, px_pp_ce_loss, &tg, &l)) != PX_OK) break;
    sum += l;
    n++;
  }
  px_loader_free(ld);
  *loss = n ? sum / (double)n : 0;
  *batches = n;
  return st;
}

int px_app_train_pp(px_comm *comm, const px_config *c, const px_optim_opts *optim) {
  const int rank = px_comm_rank(comm), p = px_comm_size(comm), m = (int)c->micro_batches;
  if (c->pp != p) {
    px_error(PX_ERR_INVALID, "--pp %lld needs exactly %lld ranks, one per stage (this run has %d): pipeline × data "
             "parallel is not built yet", (long long)c->pp, (long long)c->pp, p);
    return fail(comm, "");
  }
  if (c->batch_size % m != 0) {
    px_error(PX_ERR_INVALID, "--batch-size %lld does not split into --micro-batches %d equal micro-batches",
             (long long)c->batch_size, m);
    return fail(comm, "");
  }
  if (c->zero != 0 || c->accum_steps > 1 || *c->resume) {
    px_error(PX_ERR_INVALID, "--pp does not combine with --zero, --accum-steps or --resume yet");
    return fail(comm, "");
  }
  px_pp_kind kind;
  if (px_pp_kind_parse(c->schedule_pp, &kind) != PX_OK) return fail(comm, "--schedule-pp");
  const int v = kind == PX_PP_INTERLEAVED ? 2 : 1;
  px_app_data train = {0}, val = {0};
  px_pp_schedule *sched = NULL;
  px_pp *pp = NULL;
  px_loader *ld = NULL;
  int rc = 0;
  build_arg ba = {.c = c};
  if (px_app_open_data(c, true, NULL, &train) != PX_OK) { rc = fail(comm, "training data"); goto done; }
  if (px_app_open_data(c, false, NULL, &val) != PX_OK) { rc = fail(comm, "held-out data"); goto done; }
  if (px_app_data_shape(c, &train, &ba.shape) != PX_OK) { rc = fail(comm, "data"); goto done; }
  if (px_pp_schedule_make(kind, p, m, v, &sched) != PX_OK) { rc = fail(comm, "schedule"); goto done; }
  px_pp_opts po = {.build = build, .build_arg = &ba, .seed = (uint64_t)c->seed, .optim = optim,
                   .clip_grad_norm = (float)c->clip_grad};
  if (px_pp_create(&pp, comm, sched, &po) != PX_OK) { rc = fail(comm, "pipeline"); goto done; }
  px_pp_stats ps;
  px_pp_stats_get(pp, &ps);
  double held = (double)ps.param_elems;
  if (px_comm_allreduce(comm, &held, 1, PX_F64, PX_SUM) != PX_OK) { rc = fail(comm, ""); goto done; }
  if (rank == 0) {
    printf("plexus train: pipeline of %d stages over %d ranks, schedule %s, %d micro-batches of %lld samples; "
           "model %s: %.0f parameters, %zu on rank 0\n", p * v, p, px_pp_kind_name(kind), m,
           (long long)c->batch_size / m, c->model, held, ps.param_elems);
    if (*c->out || *c->ckpt_dir)
      fprintf(stderr, "plexus train: note: --pp writes no checkpoints yet\n");
    px_pp_plan_print(px_pp_plan_of(pp), stdout);
    fflush(stdout);
  }
  px_loader_opts lo = PX_LOADER_DEFAULTS;
  lo.batch_size = (size_t)c->batch_size;
  lo.drop_last_batch = true;  // every step the same shapes
  lo.seed = (uint64_t)c->seed;
  lo.workers = (int)c->workers;
  if (px_loader_create(&ld, train.set, &lo) != PX_OK) { rc = fail(comm, "loader"); goto done; }
  const double t0 = px_time_now();
  int64_t step = 0;
  double last = 0;
  bool more = true;
  for (int64_t e = 0; more && (c->steps > 0 || e < c->epochs); e++) {
    if (px_loader_start_epoch(ld, (uint64_t)e, 0) != PX_OK) { rc = fail(comm, "loader"); goto done; }
    const px_batch *b;
    while (more) {
      if (px_loader_next(ld, &b) != PX_OK) { rc = fail(comm, "data"); goto done; }
      if (!b) break;
      px_pp_ce_targets tg = {.targets = b->y.data, .rows_per_micro = px_tensor_numel(&b->y) / m};
      float l;
      if (px_pp_step(pp, &b->x, px_pp_ce_loss, &tg, &l) != PX_OK) { rc = fail(comm, "step"); goto done; }
      last = l;
      step++;
      if (rank == 0 && !c->quiet && (step % c->log_every == 0 || step == 1)) {
        printf("step %lld (epoch %lld): loss %.4f\n", (long long)step, (long long)e + 1, l);
        fflush(stdout);
      }
      if (c->steps > 0 && step >= c->steps) more = false;
    }
  }
  const double secs = px_time_now() - t0;
  double eval_loss = 0;
  size_t eval_batches = 0;
  if (val.set && evaluate(pp, val.set, c, m, &eval_loss, &eval_batches) != PX_OK) {
    rc = fail(comm, "evaluation");
    goto done;
  }
  if (rank == 0) {
    printf("plexus train: done: %lld steps in %.1f s (pipeline %d × %s, %d micro-batches); last loss %.4f",
           (long long)step, secs, p, px_pp_kind_name(kind), m, last);
    if (eval_batches) printf("; held-out loss %.4f", eval_loss);
    printf("\n");
    fflush(stdout);
  }
done:
  px_loader_free(ld);
  px_pp_free(pp);
  px_pp_schedule_free(sched);
  px_app_data_free(&val);
  px_app_data_free(&train);
  return rc;
}
