// plexus train --pp C: the configured model of the zoo cut into C pipeline
// stages, trained with --schedule-pp over --micro-batches M per step, on a
// dp × tp × pp mesh (px_mesh_create: rank = (pp_rank · dp + dp_rank) · tp +
// tp_rank) — "3D" parallelism:
//   --dp A    A pipeline replicas (inferred: world / (tp · pp)), each on its
//             own shard of the data (a step is A × --batch-size samples);
//             their gradients are averaged at the optimizer step (as DDP),
//             or with --zero 1|2 reduce-scattered, each dp rank stepping its
//             slice of the optimizer state, parameters all-gathered;
//   --tp B    every stage of the GPT in tensor-parallel form (px_tp_gpt's
//             modules over the mesh's tp group), the last stage's loss the
//             vocabulary-parallel cross-entropy;
//   --pp C    stages (with --schedule-pp interleaved, 2 per pipeline rank).
//
//   plexus train --threads 2 --pp 2 --micro-batches 4 --model mlp ...
//   plexus train --threads 8 --dp 2 --tp 2 --pp 2 --micro-batches 4 --model gpt ...
//   mpirun -n 8 plexus train --dp 2 --tp 2 --pp 2 --schedule-pp gpipe ...
//
// Every rank of a replica opens the data and walks the same batches (stage
// 0 reads the inputs, the last stage the targets), so no batch travels
// between ranks.  The run is the normal one's (px_train's) in what a user
// sees: the same px_train_opts (learning-rate schedule with warm-up, length,
// evaluation every N steps or per epoch, clipping, the stop signal), the
// same logger (console lines or bar, metrics.jsonl, TensorBoard) and the
// same px_train_result, which cmd_train.c reports as for any run.  A step is
// one loader batch of --batch-size samples per replica in M micro-batches,
// so its losses are those of one process with --batch-size A·B/M
// --accum-steps M (dropout included: pipeline.h).  Refused (config.c):
// --zero 3, --accum-steps (use more --micro-batches), --sequence-parallel.
// Checkpoints, --resume and --init: pp_checkpoint.c (any layout loads, and
// a pipeline checkpoint loads into any layout).  Not here yet: the memory
// report.
#include "app.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct build_arg {
  const px_config *c;
  px_data_shape shape;
  px_mesh *mesh;  // tp > 1: the GPT in tensor-parallel form over its tp group
} build_arg;

// The GPT over the mesh's tp group (as cmd_train.c's build_tp_gpt): the zoo
// GPT's tree, names and streams, per rank boxes of its parameters.
static px_module *build_tp(const build_arg *b) {
  const px_config *c = b->c;
  px_tp_gpt_config g = {.vocab_size = (int)b->shape.vocab_size,
                        .context = (int)c->context,
                        .n_layer = (int)c->n_layer,
                        .n_head = (int)c->n_head,
                        .n_embd = (int)c->n_embd,
                        .dropout = (float)c->dropout};
  px_module *m = px_tp_gpt(&b->mesh->tp_group, &g);
  if (!m) return NULL;
  px_recompute r = {0};
  px_status st = c->recompute ? px_recompute_parse(c->recompute, &r) : PX_OK;
  if (st == PX_OK && r.kind != PX_RECOMPUTE_NONE) st = px_zoo_gpt_recompute(m, r);
  if (st != PX_OK) {
    px_module_free(m);
    return NULL;
  }
  return m;
}

static px_module *build(void *arg) {
  const build_arg *b = arg;
  if (b->mesh && b->mesh->tp > 1) return build_tp(b);
  px_module *root = NULL;
  return px_app_build_model(b->c, &b->shape, &root) == PX_OK ? root : NULL;
}

// The last stage's loss: cross-entropy against the micro-batch's targets;
// with tp the logits are this rank's vocabulary columns, so the
// vocabulary-parallel cross-entropy (-100: ignored, as px_train's).
typedef struct pp_targets {
  px_pp_ce_targets ce;
  px_tp_group *tp;  // NULL: tp 1
  int vocab;
} pp_targets;

static px_status train_loss(void *user, const px_tensor *out, int micro, float *loss, float *dout) {
  const pp_targets *t = user;
  if (!t->tp) return px_pp_ce_loss((void *)&t->ce, out, micro, loss, dout);
  return px_tp_cross_entropy(t->tp, out, t->vocab, t->ce.targets + (size_t)micro * (size_t)t->ce.rows_per_micro, -100,
                             loss, dout);
}

// Evaluation's loss function: px_pp_ce_loss, and on the last stage the sums
// px_evaluate keeps (loss × rows, rows whose argmax is the target, rows).
typedef struct eval_sums {
  pp_targets tg;
  double sums[3];
} eval_sums;

static px_status eval_loss(void *user, const px_tensor *out, int micro, float *loss, float *dout) {
  eval_sums *e = user;
  px_status st = train_loss(&e->tg, out, micro, loss, dout);
  if (st != PX_OK) return st;
  const int64_t rows = px_tensor_numel(out) / out->shape[out->ndim - 1];
  e->sums[0] += (double)*loss * (double)rows;
  if (!e->tg.tp)  // (a GPT's figure is the perplexity: no accuracy over sharded logits)
    e->sums[1] += (double)px_count_correct(out, e->tg.ce.targets + (size_t)micro * (size_t)e->tg.ce.rows_per_micro);
  e->sums[2] += (double)rows;
  return PX_OK;
}

// px_evaluate's figures over the held-out split's whole batches (each must
// split into the m micro-batches: a short last batch is left out), forward
// only through the pipeline.  The sums live on the last stage's rank; every
// dp replica evaluates the whole split and the tp ranks of the last stage
// compute the same loss, so only (dp 0, tp 0)'s sums count.
static px_status evaluate(px_pp *pp, px_comm *comm, const px_mesh *mesh, const pp_targets *proto, px_dataset *set,
                          const px_train_opts *o, int m, px_eval_metrics *out) {
  px_loader_opts lo = PX_LOADER_DEFAULTS;
  lo.batch_size = o->eval_batch_size ? o->eval_batch_size : o->batch_size;
  lo.workers = o->workers;
  lo.shuffle = false;
  lo.drop_last_batch = true;
  px_loader *ld;
  px_status st = px_loader_create(&ld, set, &lo);
  if (st != PX_OK) return st;
  st = px_loader_start_epoch(ld, 0, 0);
  eval_sums e = {.tg = *proto, .sums = {0, 0, 0}};
  const px_batch *b;
  for (int64_t n = 0; st == PX_OK && (o->eval_max_batches <= 0 || n < o->eval_max_batches); n++) {
    if ((st = px_loader_next(ld, &b)) != PX_OK || !b) break;
    e.tg.ce = (px_pp_ce_targets){.targets = b->y.data, .rows_per_micro = px_tensor_numel(&b->y) / m};
    st = px_pp_eval(pp, &b->x, eval_loss, &e, NULL);
  }
  px_loader_free(ld);
  if (mesh->dp_rank != 0 || mesh->tp_rank != 0) e.sums[0] = e.sums[1] = e.sums[2] = 0;
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
  px_comm *comm;
  const px_config *c;
  const px_train_opts *o;
  px_logger *log;
  px_pp *pp;
  px_mesh *mesh;
  pp_targets tg;  // the loss's tp group and vocabulary (targets set per batch)
  px_dataset *val;
  int m;
  int64_t step, epoch, last_eval_step;
  int64_t per_epoch; /* steps an epoch (evaluations carry the epoch of their step) */
  px_eval_metrics last_eval;
  px_app_pp_ckpt ck;  // checkpoints: the position, the last one (pp_checkpoint.c)
} pp_run;

static px_status run_eval(pp_run *r) {
  if (!r->val || r->last_eval_step == r->step) return PX_OK;
  px_comm_set_label(r->comm, "evaluation");
  px_eval_metrics e;
  px_status st = evaluate(r->pp, r->comm, r->mesh, &r->tg, r->val, r->o, r->m, &e);
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
  px_lr_schedule sched;  // resolved below, once the run's length is known
  const int64_t per_epoch = (int64_t)px_loader_num_batches(ld);
  if (per_epoch < 1)
    return px_error(PX_ERR_INVALID, "--pp: the training split has no whole batch of %zu samples", o->batch_size);
  r->per_epoch = per_epoch;
  int64_t total;  // max_steps, or epochs × per_epoch, refused when it overflows (train.h)
  if (px_train_total_steps(o, (size_t)per_epoch, NULL, &total) != PX_OK) return PX_ERR_INVALID;
  const int64_t end = o->stop_at_step > 0 && o->stop_at_step < total ? o->stop_at_step : total;
  if (px_train_schedule(o, total, &sched) != PX_OK) return PX_ERR_INVALID;
  const double t_start = px_time_now();
  double t_log = t_start, loss_sum = 0, loss_n = 0;
  int64_t samples_log = 0, samples_run = 0;
  bool stopped = false;
  px_status st = PX_OK;
  while (st == PX_OK && r->step < end && !stopped) {
    if ((st = px_loader_start_epoch(ld, (uint64_t)r->epoch, (size_t)r->ck.next_batch)) != PX_OK) break;
    int64_t b_idx = r->ck.next_batch;  // 0, or where a resumed run goes on
    const px_batch *b;
    while (st == PX_OK && r->step < end && !stopped) {
      if ((st = px_loader_next(ld, &b)) != PX_OK || !b) break;
      b_idx++;
      const bool log_now = due(r->step + 1, o->log_every) || r->step + 1 == total;
      const float lr = px_lr_at(&sched, r->step);
      px_pp_set_lr(r->pp, lr);
      px_pp_measure_grad_norm(r->pp, log_now);
      pp_targets tg = r->tg;
      tg.ce = (px_pp_ce_targets){.targets = b->y.data, .rows_per_micro = px_tensor_numel(&b->y) / r->m};
      float l;  // the dp replicas' mean
      if ((st = px_pp_step(r->pp, &b->x, train_loss, &tg, &l)) != PX_OK) break;
      if (!isfinite(l))
        return px_error(PX_ERR_INVALID,
                        "train: the loss is %g at step %lld (epoch %lld, batch %lld): lower the "
                        "learning rate or clip gradients (--clip-grad)",
                        (double)l, (long long)r->step, (long long)r->epoch, (long long)b_idx - 1);
      r->step++;
      r->ck.step = r->step, r->ck.epoch = r->epoch, r->ck.next_batch = b_idx;
      r->ck.samples += (int64_t)b->n * r->mesh->dp;  // the step's global batch
      loss_sum += l;
      loss_n += 1;
      samples_log += (int64_t)b->n * r->mesh->dp;  // every replica's batch
      samples_run += (int64_t)b->n * r->mesh->dp;
      if (log_now) {
        px_pp_stats ps;
        px_pp_stats_get(r->pp, &ps);
        const double now = px_time_now();
        px_step_metrics sm = {.step = r->step,
                              .total_steps = total,
                              .epoch = r->epoch + 1,
                              .total_epochs = (total + per_epoch - 1) / per_epoch,
                              .loss = loss_sum / loss_n,
                              .lr = lr,
                              .grad_norm = ps.grad_norm,
                              .samples_per_s = now > t_log ? (double)samples_log / (now - t_log) : NAN,
                              .eta_s = (double)(total - r->step) * (now - t_start) / (double)r->step};
        if ((st = px_log_step(r->log, &sm)) != PX_OK) break;
        res->train_loss = sm.loss;
        loss_sum = loss_n = 0;
        samples_log = 0;
        t_log = now;
      }
      if (due(r->step, o->eval_every) && (st = run_eval(r)) != PX_OK) break;
      if (due(r->step, o->ckpt_every) &&
          (st = px_app_pp_save(r->comm, r->mesh, r->c, o, r->pp, r->log, &r->ck)) != PX_OK)
        break;
      if (o->stop_flag) {  // any rank's signal stops all of them after the same step
        char label[128];   // what the watchdog names if a rank dies between steps
        snprintf(label, sizeof label, "pipeline step %lld done: stage %d, between steps, stop-signal check",
                 (long long)r->step, px_pp_chunk_stage(r->pp, 0));
        px_comm_set_label(r->comm, label);
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
      r->ck.epoch = r->epoch;
      r->ck.next_batch = 0;
      if (st == PX_OK && o->ckpt_every == 0) st = px_app_pp_save(r->comm, r->mesh, r->c, o, r->pp, r->log, &r->ck);
    }
  }
  res->seconds = px_time_now() - t_start;
  res->samples_per_s = res->seconds > 0 ? (double)samples_run / res->seconds : NAN;
  res->stopped = r->step < total;
  if (st == PX_OK && !res->stopped) st = run_eval(r);  // the run's end, unless just evaluated
  if (st == PX_OK) st = px_app_pp_save(r->comm, r->mesh, r->c, o, r->pp, r->log, &r->ck);  // unless just saved
  if (st == PX_OK && res->stopped)
    st = px_log_text(r->log, "stopped at step %lld of %lld%s", (long long)r->step, (long long)total,
                     o->ckpt_dir ? ": resume to go on" : " (no checkpoint directory: nothing to resume from)");
  snprintf(res->last_checkpoint, sizeof res->last_checkpoint, "%s", r->ck.path);
  res->steps = r->step;
  res->eval = r->last_eval;
  return st;
}

px_status px_app_train_pp(px_comm *comm, const px_config *c, const px_train_opts *o, const px_logger_opts *log_opts,
                          px_train_result *res) {
  memset(res, 0, sizeof *res);
  res->eval.loss = res->eval.accuracy = res->eval.perplexity = NAN;
  const int rank = px_comm_rank(comm), m = (int)c->micro_batches;
  if (c->batch_size % m != 0)
    return px_error(PX_ERR_INVALID, "--batch-size %lld does not split into --micro-batches %d equal micro-batches",
                    (long long)c->batch_size, m);
  if (c->zero == 3 || c->accum_steps > 1)  // (config.c says why)
    return px_error(PX_ERR_INVALID,
                    "--pp does not combine with --zero 3 or --accum-steps (a step is "
                    "already --micro-batches micro-batches with their gradients accumulated)");
  px_pp_kind kind;
  px_status st = px_pp_kind_parse(c->schedule_pp, &kind);
  if (st != PX_OK) return px_error_wrap(st, "--schedule-pp");
  // The mesh: dp × tp × pp over the world (dp 0: inferred).  A product that
  // is not the world's size fails on every rank alike, naming all four.
  px_mesh *mesh = NULL;
  if ((st = px_mesh_create(&mesh, comm, (int)c->dp, (int)c->tp, (int)c->pp)) != PX_OK)
    return px_error_wrap(st, "--dp %lld --tp %lld --pp %lld", (long long)c->dp, (long long)c->tp, (long long)c->pp);
  const int p = mesh->pp, A = mesh->dp;
  const int v = kind == PX_PP_INTERLEAVED ? 2 : 1;
  px_app_data train = {0}, val = {0};
  px_pp_schedule *sched = NULL;
  px_logger *log = NULL;
  px_loader *ld = NULL;
  pp_run r = {.comm = comm, .c = c, .o = o, .m = m, .mesh = mesh, .last_eval_step = -1};
  r.last_eval.loss = r.last_eval.accuracy = r.last_eval.perplexity = NAN;
  build_arg ba = {.c = c, .mesh = mesh};
  const char *what = "training data";
  st = px_app_open_data(c, true, NULL, &train);
  if (st == PX_OK) {
    what = "held-out data";
    st = px_app_open_data(c, false, NULL, &val);
  }
  if (st == PX_OK) {
    what = "data";
    st = px_app_data_shape(c, &train, &ba.shape);
  }
  if (st == PX_OK && mesh->tp > 1 && !ba.shape.tokens)
    st = px_error(PX_ERR_INVALID, "--tp %d: a GPT reads token data (--data tokens or text), not --data %s", mesh->tp,
                  c->data);
  if (mesh->tp > 1) {
    r.tg.tp = &mesh->tp_group;
    r.tg.vocab = (int)ba.shape.vocab_size;
  }
  if (st == PX_OK) {
    what = "schedule";
    st = px_pp_schedule_make(kind, p, m, v, &sched);
  }
  px_pp_opts po = {.build = build,
                   .build_arg = &ba,
                   .seed = o->seed,
                   .optim = &o->optim,
                   .clip_grad_norm = o->clip_grad_norm,
                   .dp = A > 1 ? mesh->dp_comm : NULL,
                   .tp = mesh->tp > 1 ? mesh->tp_comm : NULL,
                   .zero_stage = A > 1 ? (int)c->zero : 0};
  if (st == PX_OK) {
    what = "pipeline";
    st = px_pp_create(&r.pp, mesh->pp_comm, sched, &po);
  }
  if (st == PX_OK) {
    what = "logging";
    st = px_logger_create(&log, log_opts);
  }
  if (st == PX_OK && o->config_json) st = px_log_hparams(log, o->config_json, NULL);  // TensorBoard's HParams
  r.log = log;
  r.val = val.set;
  px_pp_stats ps = {0};
  double held = 0;
  if (st == PX_OK) {  // one pipeline's parameters (with tp: this tp rank's boxes)
    px_pp_stats_get(r.pp, &ps);
    held = (double)ps.param_elems;
    what = "";
    st = px_comm_allreduce(mesh->pp_comm, &held, 1, PX_F64, PX_SUM);
  }
  if (st == PX_OK && rank == 0 && !c->quiet) {
    char line[256];
    px_log_text(log, "%s", px_mesh_describe(mesh, line, sizeof line));
    px_log_text(log,
                "model %s: %.0f parameters%s (%zu on rank 0); data %s: %zu training samples, %zu held-out%s; "
                "pipeline of %d stages over %d ranks, schedule %s, %d micro-batches of %lld samples; %d replica%s "
                "(a step is %lld samples)%s",
                c->model, held, mesh->tp > 1 ? " per tp rank" : "", ps.param_elems, c->data, train.set->length,
                val.set ? val.set->length : 0, val.set ? "" : " (no held-out split: --val-path)", p * v, p,
                px_pp_kind_name(kind), m, (long long)c->batch_size / m, A, A == 1 ? "" : "s",
                (long long)c->batch_size * A,
                A > 1 && c->zero > 0
                  ? (c->zero == 1
                       ? ", ZeRO 1 over dp"
                       : ", ZeRO 2 over dp (gradients accumulate over the micro-batches in the whole buffer: stage 1's "
                         "gradient memory)")
                  : "");
    px_pp_plan_print(px_pp_plan_of(r.pp), stdout);
    fflush(stdout);
  }
  px_loader_opts lo = PX_LOADER_DEFAULTS;
  lo.batch_size = o->batch_size;
  lo.drop_last_batch = true;  // every step the same shapes
  lo.seed = o->seed;
  lo.workers = o->workers;
  lo.prefetch = o->prefetch;
  lo.rank = mesh->dp_rank;  // the dp replicas read different shards, the ranks of one replica the same batches
  lo.world = A;
  if (st == PX_OK) {
    what = "loader";
    st = px_loader_create(&ld, train.set, &lo);
  }
  if (st == PX_OK) {
    what = "";
    r.ck.batches_per_epoch = (int64_t)px_loader_num_batches(ld);
  }
  if (st == PX_OK && (st = px_app_pp_resume(comm, mesh, c, o, r.pp, log, &r.ck)) == PX_OK) {
    r.step = res->start_step = r.ck.step;
    r.epoch = r.ck.epoch;
  }
  if (st == PX_OK) {
    what = "";
    st = train_loop(&r, ld, res);
  }
  if (st != PX_OK && *what) st = px_error_wrap(st, "%s", what);
  px_loader_free(ld);
  px_pp_free(r.pp);
  px_pp_schedule_free(sched);
  px_logger_free(log);
  px_app_data_free(&val);
  px_app_data_free(&train);
  px_mesh_free(mesh);  // after the stages: their tp layers point at its group
  return st;
}
