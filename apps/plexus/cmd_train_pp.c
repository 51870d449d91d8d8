// plexus train --pp P: the configured model of the zoo cut into P pipeline
// stages, one per rank (P = the world size: pipeline × data parallel is not
// built), trained with --schedule-pp over --micro-batches M per step.
//
//   plexus train --threads 2 --pp 2 --micro-batches 4 --model mlp ...
//   mpirun -n 4 plexus train --pp 4 --schedule-pp gpipe ...
//
// Every rank opens the data and walks the same batches (stage 0 reads the
// inputs, the last stage the targets), so no batch travels between ranks.
// The run is the normal one's (px_train's) in what a user sees: the same
// px_train_opts (learning-rate schedule with warm-up, length, evaluation
// every N steps or per epoch, clipping, the stop signal), the same logger
// (console lines or bar, metrics.jsonl, TensorBoard) and the same
// px_train_result, which cmd_train.c reports as for any run.  A step is one
// loader batch of --batch-size samples in M micro-batches, so its losses are
// those of one process with --batch-size B/M --accum-steps M (dropout
// included: pipeline.h).  Not here yet: checkpoints and resume,
// --accum-steps on top of the micro-batches, ZeRO, the memory report.
#include "app.h"

#include <math.h>
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

// Evaluation's loss function: px_pp_ce_loss, and on the last stage the sums
// px_evaluate keeps (loss × rows, rows whose argmax is the target, rows).
typedef struct eval_sums {
  px_pp_ce_targets tg;
  double           sums[3];
} eval_sums;

static px_status eval_loss(void *user, const px_tensor *out, int micro, float *loss, float *dout) {
  eval_sums *e = user;
  px_status st = px_pp_ce_loss(&e->tg, out, micro, loss, dout);
  if (st != PX_OK) return st;
  const int64_t rows = px_tensor_numel(out) / out->shape[out->ndim - 1];
  e->sums[0] += (double)*loss * (double)rows;
  e->sums[1] += (double)px_count_correct(out, e->tg.targets + (size_t)micro * (size_t)e->tg.rows_per_micro);
  e->sums[2] += (double)rows;
  return PX_OK;
}

// px_evaluate's figures over the held-out split's whole batches (each must
// split into the m micro-batches: a short last batch is left out), forward
// only through the pipeline.  The sums live on the last stage's rank.
static px_status evaluate(px_pp *pp, px_comm *comm, px_dataset *set, const px_train_opts *o, int m,
                          px_eval_metrics *out) {
  px_loader_opts lo = PX_LOADER_DEFAULTS;
  lo.batch_size = o->eval_batch_size ? o->eval_batch_size : o->batch_size;
  lo.workers = o->workers;
  lo.shuffle = false;
  lo.drop_last_batch = true;
  px_loader *ld;
  px_status st = px_loader_create(&ld, set, &lo);
  if (st != PX_OK) return st;
  st = px_loader_start_epoch(ld, 0, 0);
  eval_sums e = {.sums = {0, 0, 0}};
  const px_batch *b;
  for (int64_t n = 0; st == PX_OK && (o->eval_max_batches <= 0 || n < o->eval_max_batches); n++) {
    if ((st = px_loader_next(ld, &b)) != PX_OK || !b) break;
    e.tg = (px_pp_ce_targets){.targets = b->y.data, .rows_per_micro = px_tensor_numel(&b->y) / m};
    st = px_pp_eval(pp, &b->x, eval_loss, &e, NULL);
  }
  px_loader_free(ld);
  if (st == PX_OK) st = px_comm_allreduce(comm, e.sums, 3, PX_F64, PX_SUM);
  if (st != PX_OK) return px_error_wrap(st, "evaluation");
  memset(out, 0, sizeof *out);
  out->loss = out->accuracy = out->perplexity = NAN;
  out->samples = (int64_t)e.sums[2];
  if (e.sums[2] > 0) {
    out->loss = e.sums[0] / e.sums[2];
    if (set->y_ndim == 0) out->accuracy = e.sums[1] / e.sums[2];
    else out->perplexity = exp(out->loss);
  }
  return PX_OK;
}

typedef struct pp_run {
  px_comm             *comm;
  const px_config     *c;
  const px_train_opts *o;
  px_logger           *log;
  px_pp               *pp;
  px_dataset          *val;
  int                  m;
  int64_t              step, epoch, last_eval_step;
  int64_t              per_epoch;  /* steps an epoch (evaluations carry the epoch of their step) */
  px_eval_metrics      last_eval;
} pp_run;

static px_status run_eval(pp_run *r) {
  if (!r->val || r->last_eval_step == r->step) return PX_OK;
  px_comm_set_label(r->comm, "evaluation");
  px_eval_metrics e;
  px_status st = evaluate(r->pp, r->comm, r->val, r->o, r->m, &e);
  if (st != PX_OK) return st;
  e.step = r->step;
  e.epoch = (r->step + r->per_epoch - 1) / r->per_epoch;  // as train.c: mid-epoch, the epoch under way (from 1)
  r->last_eval = e;
  r->last_eval_step = r->step;
  return px_log_eval(r->log, &e);
}

static bool due(int64_t step, int64_t every) { return every > 0 && step % every == 0; }

// The loop of px_train (train.c) with one pipeline step per optimizer step.
static px_status train_loop(pp_run *r, px_loader *ld, px_train_result *res) {
  const px_train_opts *o = r->o;
  px_lr_schedule sched = o->schedule;
  const int64_t per_epoch = (int64_t)px_loader_num_batches(ld);
  if (per_epoch < 1)
    return px_error(PX_ERR_INVALID, "--pp: the training split has no whole batch of %zu samples", o->batch_size);
  r->per_epoch = per_epoch;
  const int64_t total = o->max_steps > 0 ? o->max_steps : o->epochs * per_epoch;
  const int64_t end = o->stop_at_step > 0 && o->stop_at_step < total ? o->stop_at_step : total;
  if (sched.base_lr == 0.0f) sched.base_lr = o->optim.lr;
  if (sched.total_steps == 0) sched.total_steps = total;
  const double t_start = px_time_now();
  double t_log = t_start, loss_sum = 0, loss_n = 0;
  int64_t samples_log = 0, samples_run = 0;
  bool stopped = false;
  px_status st = PX_OK;
  while (st == PX_OK && r->step < end && !stopped) {
    if ((st = px_loader_start_epoch(ld, (uint64_t)r->epoch, 0)) != PX_OK) break;
    int64_t b_idx = 0;
    const px_batch *b;
    while (st == PX_OK && r->step < end && !stopped) {
      if ((st = px_loader_next(ld, &b)) != PX_OK || !b) break;
      b_idx++;
      const bool log_now = due(r->step + 1, o->log_every) || r->step + 1 == total;
      const float lr = px_lr_at(&sched, r->step);
      px_pp_set_lr(r->pp, lr);
      px_pp_measure_grad_norm(r->pp, log_now);
      px_pp_ce_targets tg = {.targets = b->y.data, .rows_per_micro = px_tensor_numel(&b->y) / r->m};
      float l;
      if ((st = px_pp_step(r->pp, &b->x, px_pp_ce_loss, &tg, &l)) != PX_OK) break;
      if (!isfinite(l))
        return px_error(PX_ERR_INVALID, "train: the loss is %g at step %lld (epoch %lld, batch %lld): lower the "
                        "learning rate or clip gradients (--clip-grad)", (double)l, (long long)r->step,
                        (long long)r->epoch, (long long)b_idx - 1);
      r->step++;
      loss_sum += l;
      loss_n += 1;
      samples_log += (int64_t)b->n;
      samples_run += (int64_t)b->n;
      if (log_now) {
        px_pp_stats ps;
        px_pp_stats_get(r->pp, &ps);
        const double now = px_time_now();
        px_step_metrics sm = {.step = r->step, .total_steps = total, .epoch = r->epoch + 1,
                              .total_epochs = (total + per_epoch - 1) / per_epoch, .loss = loss_sum / loss_n,
                              .lr = lr, .grad_norm = ps.grad_norm,
                              .samples_per_s = now > t_log ? (double)samples_log / (now - t_log) : NAN,
                              .eta_s = (double)(total - r->step) * (now - t_start) / (double)r->step};
        if ((st = px_log_step(r->log, &sm)) != PX_OK) break;
        res->train_loss = sm.loss;
        loss_sum = loss_n = 0;
        samples_log = 0;
        t_log = now;
      }
      if (due(r->step, o->eval_every) && (st = run_eval(r)) != PX_OK) break;
      if (o->stop_flag) {  // any rank's signal stops all of them after the same step
        int32_t stop = *o->stop_flag != 0;
        if ((st = px_comm_allreduce(r->comm, &stop, 1, PX_I32, PX_MAX)) != PX_OK) break;
        stopped = stop != 0;
      }
    }
    if (st == PX_OK && b_idx == per_epoch) {
      r->epoch++;
      res->epochs++;
      st = px_log_epoch(r->log, r->epoch, r->step);
      if (st == PX_OK && o->eval_every == 0) st = run_eval(r);
    }
  }
  res->seconds = px_time_now() - t_start;
  res->samples_per_s = res->seconds > 0 ? (double)samples_run / res->seconds : NAN;
  res->stopped = r->step < total;
  if (st == PX_OK && !res->stopped) st = run_eval(r);  // the run's end, unless just evaluated
  if (st == PX_OK && res->stopped)
    st = px_log_text(r->log, "stopped at step %lld of %lld (--pp writes no checkpoint: nothing to resume from)",
                     (long long)r->step, (long long)total);
  res->steps = r->step;
  res->eval = r->last_eval;
  return st;
}

px_status px_app_train_pp(px_comm *comm, const px_config *c, const px_train_opts *o, const px_logger_opts *log_opts,
                          px_train_result *res) {
  memset(res, 0, sizeof *res);
  res->eval.loss = res->eval.accuracy = res->eval.perplexity = NAN;
  const int rank = px_comm_rank(comm), p = px_comm_size(comm), m = (int)c->micro_batches;
  if (c->pp != p)
    return px_error(PX_ERR_INVALID, "--pp %lld needs exactly %lld ranks, one per stage (this run has %d): pipeline "
                    "× data parallel is not built yet", (long long)c->pp, (long long)c->pp, p);
  if (c->batch_size % m != 0)
    return px_error(PX_ERR_INVALID, "--batch-size %lld does not split into --micro-batches %d equal micro-batches",
                    (long long)c->batch_size, m);
  if (c->zero != 0 || c->accum_steps > 1 || *c->resume)
    return px_error(PX_ERR_INVALID, "--pp does not combine with --zero, --accum-steps or --resume yet (a step is "
                    "already --micro-batches micro-batches with their gradients accumulated)");
  px_pp_kind kind;
  px_status st = px_pp_kind_parse(c->schedule_pp, &kind);
  if (st != PX_OK) return px_error_wrap(st, "--schedule-pp");
  const int v = kind == PX_PP_INTERLEAVED ? 2 : 1;
  px_app_data train = {0}, val = {0};
  px_pp_schedule *sched = NULL;
  px_logger *log = NULL;
  px_loader *ld = NULL;
  pp_run r = {.comm = comm, .c = c, .o = o, .m = m, .last_eval_step = -1};
  r.last_eval.loss = r.last_eval.accuracy = r.last_eval.perplexity = NAN;
  build_arg ba = {.c = c};
  const char *what = "training data";
  st = px_app_open_data(c, true, NULL, &train);
  if (st == PX_OK) { what = "held-out data"; st = px_app_open_data(c, false, NULL, &val); }
  if (st == PX_OK) { what = "data"; st = px_app_data_shape(c, &train, &ba.shape); }
  if (st == PX_OK) { what = "schedule"; st = px_pp_schedule_make(kind, p, m, v, &sched); }
  px_pp_opts po = {.build = build, .build_arg = &ba, .seed = o->seed, .optim = &o->optim,
                   .clip_grad_norm = o->clip_grad_norm};
  if (st == PX_OK) { what = "pipeline"; st = px_pp_create(&r.pp, comm, sched, &po); }
  if (st == PX_OK) { what = "logging"; st = px_logger_create(&log, log_opts); }
  r.log = log;
  r.val = val.set;
  px_pp_stats ps = {0};
  double held = 0;
  if (st == PX_OK) {
    px_pp_stats_get(r.pp, &ps);
    held = (double)ps.param_elems;
    what = "";
    st = px_comm_allreduce(comm, &held, 1, PX_F64, PX_SUM);
  }
  if (st == PX_OK && rank == 0 && !c->quiet) {
    px_log_text(log, "model %s: %.0f parameters (%zu on rank 0); data %s: %zu training samples, %zu held-out%s; "
                "pipeline of %d stages over %d ranks, schedule %s, %d micro-batches of %lld samples", c->model, held,
                ps.param_elems, c->data, train.set->length, val.set ? val.set->length : 0,
                val.set ? "" : " (no held-out split: --val-path)", p * v, p, px_pp_kind_name(kind), m,
                (long long)c->batch_size / m);
    if (o->ckpt_dir) px_log_text(log, "note: --pp writes no checkpoints yet");
    px_pp_plan_print(px_pp_plan_of(r.pp), stdout);
    fflush(stdout);
  }
  px_loader_opts lo = PX_LOADER_DEFAULTS;
  lo.batch_size = o->batch_size;
  lo.drop_last_batch = true;  // every step the same shapes
  lo.seed = o->seed;
  lo.workers = o->workers;
  lo.prefetch = o->prefetch;
  if (st == PX_OK) { what = "loader"; st = px_loader_create(&ld, train.set, &lo); }
  if (st == PX_OK) { what = ""; st = train_loop(&r, ld, res); }
  if (st != PX_OK && *what) st = px_error_wrap(st, what);
  px_loader_free(ld);
  px_pp_free(r.pp);
  px_pp_schedule_free(sched);
  px_logger_free(log);
  px_app_data_free(&val);
  px_app_data_free(&train);
  return st;
}
