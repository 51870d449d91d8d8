// The training loop (train.h): epochs of micro-batches from a sharded
// loader, DDP, accumulation, clipping, the schedule, evaluation,
// checkpoints and logging, in the order PyTorch users write them:
//
//   for epoch:                       sampler.set_epoch(epoch)
//     for each micro-batch:          zero_grad at the start of a step (DDP: done by the last opt.step)
//       logits = model(x)
//       loss, dlogits = CE(logits, y) / accum
//       backward(dlogits)            DDP all-reduces buckets as they fill (last micro-batch only)
//       on the step's last one:      ddp.sync; clip; lr = schedule(step); opt.step
//
// Under ZeRO (o.zero.stage >= 1) the same loop, shard-aware: zero_grad,
// no_sync, sync and clipping go through px_zero_*, the optimizer steps over
// this rank's shard (its step count and the schedule are the run's, as
// every rank steps every time), and px_zero_after_step all-gathers the
// updated parameters (stages 1-2) before the next forward.
//                                    log / eval / checkpoint at their intervals
//     eval / checkpoint at the epoch's end (interval 0)
#include "base/internal.h"
#include "train/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static px_status check_opts(const px_train_opts *o) {
  if (o->batch_size < 1) return px_error(PX_ERR_INVALID, "train: batch_size must be at least 1");
  if (o->accum_steps < 1)
    return px_error(PX_ERR_INVALID, "train: accum_steps must be at least 1, got %d", o->accum_steps);
  if (o->stop_at_step < 0) return px_error(PX_ERR_INVALID, "train: stop_at_step must be >= 0");
  if (o->max_steps < 0)
    return px_error(PX_ERR_INVALID, "train: max_steps must be >= 0, got %lld", (long long)o->max_steps);
  if (o->max_steps == 0 && o->epochs < 1)
    return px_error(PX_ERR_INVALID, "train: give epochs >= 1 or max_steps >= 1 (got epochs %lld, max_steps 0)",
                    (long long)o->epochs);
  if (o->eval_every < 0 || o->ckpt_every < 0 || o->log_every < 0)
    return px_error(PX_ERR_INVALID, "train: eval_every, ckpt_every and log_every must be >= 0");
  if (o->keep_last < 0) return px_error(PX_ERR_INVALID, "train: keep_last must be >= 0, got %d", o->keep_last);
  if (!(o->clip_grad_norm >= 0.0f)) return px_error(PX_ERR_INVALID, "train: clip_grad_norm must be >= 0");
  if (o->zero.stage < 0 || o->zero.stage > 3)
    return px_error(PX_ERR_INVALID,
                    "train: zero.stage is %d; expected 0 (DDP), 1 (optimizer state sharded), 2 (and "
                    "gradients) or 3 (and parameters)",
                    o->zero.stage);
  if (o->mesh && o->zero.stage == 3)
    return px_error(PX_ERR_UNSUPPORTED,
                    "train: ZeRO stage 3 over the dp ranks of a tensor-parallel mesh is not "
                    "built; use zero.stage 1 or 2 with tensor parallelism");
  if (o->mesh && o->label_smoothing != 0.0f)
    return px_error(PX_ERR_UNSUPPORTED,
                    "train: label smoothing with tensor parallelism (the vocabulary-parallel "
                    "loss has none)");
  if (o->mesh && o->tp_vocab < 1)
    return px_error(PX_ERR_INVALID, "train: a tensor-parallel run needs tp_vocab, the global vocabulary size");
  if (o->resume && !o->ckpt_dir && strcmp(o->resume, "auto") == 0)
    return px_error(PX_ERR_INVALID, "train: resume \"auto\" needs a checkpoint directory (ckpt_dir)");
  if (!(o->loss_spike_factor == 0.0 || (o->loss_spike_factor > 1.0 && isfinite(o->loss_spike_factor))))
    return px_error(PX_ERR_INVALID,
                    "train: loss_spike_factor is %g; expected 0 (off) or a finite factor above 1 (a "
                    "factor of 1 or less would stop on ordinary noise)",
                    o->loss_spike_factor);
  if (o->device != PX_CPU && o->device != PX_CUDA)
    return px_error(PX_ERR_INVALID, "train: device %d; expected PX_CPU or PX_CUDA", (int)o->device);
  if (o->precision != PX_F32 && o->precision != PX_BF16)
    return px_error(PX_ERR_INVALID, "train: precision %s; expected f32 or bf16 (--precision)",
                    px_dtype_name(o->precision));
  if (o->precision == PX_BF16 && o->device != PX_CUDA)
    return px_error(PX_ERR_UNSUPPORTED,
                    "train: --precision bf16 runs on the GPU only (--device cuda); on the CPU "
                    "plexus computes in f32 (--precision f32)");
  if (o->device == PX_CUDA && o->zero.stage > 0)
    return px_error(PX_ERR_UNSUPPORTED,
                    "train: --zero %d (ZeRO) with --device cuda is not built: on GPUs plexus "
                    "trains data parallel with DDP over NCCL (--zero 0)",
                    o->zero.stage);
  if (o->device == PX_CUDA && o->mesh)
    return px_error(PX_ERR_UNSUPPORTED,
                    "train: tensor parallelism (--tp, a device mesh) with --device cuda is not "
                    "built: on GPUs plexus trains data parallel with DDP over NCCL");
  if (o->loss_spike_factor > 0.0 && o->loss_spike_warmup < 1)
    return px_error(PX_ERR_INVALID,
                    "train: loss_spike_warmup is %lld; the loss-spike guard needs at least 1 step "
                    "to form the running mean",
                    (long long)o->loss_spike_warmup);
  return PX_OK;
}

px_status px_train_total_steps(const px_train_opts *o, size_t batches_per_epoch, int64_t *steps_per_epoch,
                               int64_t *total_steps) {
  const size_t accum = o->accum_steps > 0 ? (size_t)o->accum_steps : 1;
  const size_t per_epoch = batches_per_epoch / accum + (batches_per_epoch % accum != 0);
  if (per_epoch > (size_t)INT64_MAX)
    return px_error(PX_ERR_INVALID, "train: %zu steps per epoch do not fit in a 64-bit step count", per_epoch);
  int64_t total = o->max_steps;
  if (total <= 0 && __builtin_mul_overflow(o->epochs, (int64_t)per_epoch, &total))
    return px_error(PX_ERR_INVALID,
                    "train: epochs %lld × %zu steps per epoch is more than %lld steps (a 64-bit "
                    "count would wrap): give fewer epochs, or the steps (max_steps, --steps)",
                    (long long)o->epochs, per_epoch, (long long)INT64_MAX);
  if (steps_per_epoch) *steps_per_epoch = (int64_t)per_epoch;
  if (total_steps) *total_steps = total;
  return PX_OK;
}

px_status px_train_schedule(const px_train_opts *o, int64_t total_steps, px_lr_schedule *out) {
  *out = o->schedule;
  // Bits, not ==: a NaN in either is a mismatch too.
  if (o->schedule.base_lr != 0.0f && memcmp(&o->schedule.base_lr, &o->optim.lr, sizeof(float)) != 0)
    return px_error(PX_ERR_INVALID,
                    "train: schedule.base_lr is %g but optim.lr is %g: the base learning rate has one "
                    "source, optim.lr (--lr); leave schedule.base_lr 0",
                    (double)o->schedule.base_lr, (double)o->optim.lr);
  out->base_lr = o->optim.lr;
  if (out->total_steps == 0) out->total_steps = total_steps;
  return PX_OK;
}

// The batch's targets as one i32 per row of the logits (tensor parallel:
// this rank's vocabulary columns of every row).
// targets: b->y's data where the logits are (on a GPU, its device copy).
static px_status loss_of(const px_trainer *t, const px_tensor *logits, const px_batch *b, const int32_t *targets,
                         const px_ce_opts *ce, float *loss, float *dlogits) {
  const int64_t C = logits->shape[logits->ndim - 1];
  const int64_t rows = C ? px_tensor_numel(logits) / C : 0;
  if (b->y.dtype != PX_I32 || px_tensor_numel(&b->y) != rows) {
    char a[PX_SHAPE_STR_MAX], c[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE,
                    "train: the model's output %s does not fit the batch's targets %s %s: expected one i32 "
                    "class id per row of logits (classifier: (N, classes) for (N,); language model: (N, T, "
                    "vocab) for (N, T))",
                    px_shape_str(logits->ndim, logits->shape, a, sizeof a), px_dtype_name(b->y.dtype),
                    px_shape_str(b->y.ndim, b->y.shape, c, sizeof c));
  }
  if (t->o.mesh) return px_tp_cross_entropy(&t->o.mesh->tp_group, logits, t->o.tp_vocab, targets, -100, loss, dlogits);
  return px_cross_entropy_loss(logits, targets, ce, loss, dlogits);
}

static px_status run_eval(px_trainer *t) {
  if (!t->val || t->last_eval_step == t->step) return PX_OK;
  px_eval_metrics m;
  size_t bs = t->o.eval_batch_size ? t->o.eval_batch_size : t->o.batch_size;
  px_trainer_label(t, "evaluation");
  if (t->o.mesh)
    TRY(px_evaluate_tp(t->o.mesh, t->o.tp_vocab, t->model, t->val, bs, t->o.workers, t->o.eval_max_batches, &m));
  else TRY(px_evaluate(t->comm, t->model, t->val, bs, t->o.workers, t->o.eval_max_batches, &m));
  m.step = t->step;
  // At an epoch's end t->epoch counts the epochs done; mid-epoch
  // (--eval-every) the evaluation belongs to the epoch under way, numbered
  // from 1 as the step records number it.
  m.epoch = (int64_t)t->epoch + (t->next_batch > 0 ? 1 : 0);
  t->last_eval = m;
  t->last_eval_step = t->step;
  return px_log_eval(t->log, &m);
}

static px_status save(px_trainer *t) {
  if (!t->o.ckpt_dir || t->last_ckpt_step == t->step) return PX_OK;
  char label[64];
  snprintf(label, sizeof label, "checkpoint of step %lld", (long long)t->step);
  px_trainer_label(t, label);
  TRY(px_trainer_save(t));
  t->last_ckpt_step = t->step;
  return px_log_text(t->log, "checkpoint %s (step %lld)", t->last_checkpoint, (long long)t->step);
}

static bool due(int64_t step, int64_t every) { return every > 0 && step % every == 0; }

// A gradient norm that is not finite: the same on every rank (it is taken
// after the all-reduce), so every rank stops here, before the update.
static px_status check_norm(const px_trainer *t, double norm) {
  if (isfinite(norm)) return PX_OK;
  return px_error(PX_ERR_INVALID,
                  "train: the gradient norm is %g at step %lld (epoch %llu); every rank stops here, "
                  "before the update: lower the learning rate or clip gradients (--clip-grad), and resume from the "
                  "last checkpoint",
                  norm, (long long)t->step + 1, (unsigned long long)t->epoch + 1);
}

// One optimizer step's tail, the gradients already averaged (px_ddp_sync,
// px_zero_sync in the loop): clip, schedule, update.
// lr: this step's rate, px_lr_at(schedule, step), computed once by the loop.
static px_status optimizer_step(px_trainer *t, float lr, bool want_norm, double *grad_norm) {
  *grad_norm = NAN;
  if (t->zero) {
    // The norm is global: each shard's sum of squares, all-reduced once.
    if ((t->o.clip_grad_norm > 0.0f || want_norm) && t->o.mesh) {  // max_norm ∞: the norm only
      float norm;
      TRY(px_tp_zero_clip_grad_norm(t->o.mesh, t->zero, t->model,
                                    t->o.clip_grad_norm > 0.0f ? t->o.clip_grad_norm : INFINITY, &norm));
      *grad_norm = norm;
    } else if (t->o.clip_grad_norm > 0.0f || want_norm) {
      TRY(px_zero_clip_grad_norm(t->zero, t->o.clip_grad_norm, grad_norm));
    }
    if (t->o.clip_grad_norm > 0.0f || want_norm) TRY(check_norm(t, *grad_norm));
    px_optim_set_lr(t->opt, lr);
    TRY(px_optim_step(t->opt));
    return px_zero_after_step(t->zero);
  }
  px_model *md = t->model;
  if (t->o.mesh && (t->o.clip_grad_norm > 0.0f || want_norm)) {
    // A split parameter counts with every tp rank's box, a replicated one once.
    float norm;
    TRY(px_tp_clip_grad_norm(&t->o.mesh->tp_group, md, t->o.clip_grad_norm > 0.0f ? t->o.clip_grad_norm : INFINITY,
                             &norm));
    *grad_norm = norm;
  } else if (t->o.clip_grad_norm > 0.0f || want_norm) {
    TRY(px_device_grad_norm(md, t->o.clip_grad_norm, grad_norm));  // on the model's device
  }
  if (t->o.clip_grad_norm > 0.0f || want_norm) TRY(check_norm(t, *grad_norm));
  px_optim_set_lr(t->opt, lr);
  // The optimizer covers the model's whole gradient buffer (setup_parallel):
  // its pass leaves them zero, and the next step's zero_grad is skipped.
  TRY(px_optim_step_zero_grads(t->opt));
  t->grads_zero = true;
  return PX_OK;
}

// What each rank holds, once a step has shown the activations' size: on
// the console (rank 0's and the maximum over ranks) and in the metrics log.
static px_status report_memory(px_trainer *t, px_train_result *res) {
  TRY(px_trainer_memory(t, &res->memory, &res->memory_max, &res->peak_rss));
  const px_zero_memory *a = &res->memory, *m = &res->memory_max;
  char b[10][32], rss[32];
  const size_t total = a->params + a->grads + a->optim_state + a->gathered + a->arena_peak;
  const size_t total_max = m->params + m->grads + m->optim_state + m->gathered + m->arena_peak;
  char layout[48];
  if (t->zero) snprintf(layout, sizeof layout, "ZeRO stage %d", t->o.zero.stage);
  else snprintf(layout, sizeof layout, "%s", t->dp > 1 ? "DDP" : "one process");
  if (t->o.mesh) {
    const size_t used = strlen(layout);
    snprintf(layout + used, sizeof layout - used, ", dp %d × tp %d", t->dp, t->o.mesh->tp);
  }
  TRY(px_log_text(t->log,
                  "memory per rank (%s, %d rank%s; rank 0 / max over ranks): params %s / %s, grads %s / %s, "
                  "optimizer %s / %s, gathered %s / %s, activations %s / %s; peak RSS %s",
                  layout, t->world, t->world == 1 ? "" : "s", px_train_bytes_str(a->params, b[0], 32),
                  px_train_bytes_str(m->params, b[1], 32), px_train_bytes_str(a->grads, b[2], 32),
                  px_train_bytes_str(m->grads, b[3], 32), px_train_bytes_str(a->optim_state, b[4], 32),
                  px_train_bytes_str(m->optim_state, b[5], 32), px_train_bytes_str(a->gathered, b[6], 32),
                  px_train_bytes_str(m->gathered, b[7], 32), px_train_bytes_str(a->arena_peak, b[8], 32),
                  px_train_bytes_str(m->arena_peak, b[9], 32), px_train_bytes_str(res->peak_rss, rss, sizeof rss)));
  static const char *tags[6] = {"memory/params_bytes",   "memory/grads_bytes",       "memory/optim_state_bytes",
                                "memory/gathered_bytes", "memory/activations_bytes", "memory/total_bytes"};
  const double mine[6] = {(double)a->params,   (double)a->grads,      (double)a->optim_state,
                          (double)a->gathered, (double)a->arena_peak, (double)total};
  const double most[6] = {(double)m->params,   (double)m->grads,      (double)m->optim_state,
                          (double)m->gathered, (double)m->arena_peak, (double)total_max};
  for (int k = 0; k < 6; k++) {
    char tag[64];
    TRY(px_log_scalar(t->log, tags[k], t->step, mine[k]));
    snprintf(tag, sizeof tag, "%s_max", tags[k]);
    TRY(px_log_scalar(t->log, tag, t->step, most[k]));
  }
  return px_log_scalar(t->log, "memory/peak_rss_bytes_max", t->step, (double)res->peak_rss);
}

static px_status train_loop(px_trainer *t, px_train_result *res) {
  px_model *md = t->model;
  const px_ce_opts ce = {.ignore_index = -100, .label_smoothing = t->o.label_smoothing};
  const int accum = t->o.accum_steps;
  double t_start = px_time_now(), t_log = t_start;
  double loss_sum = 0, loss_n = 0;  // every rank's micro-batch losses since the last log (the agreements')
  int64_t samples_log = 0;          // this rank's samples since the last log
  int64_t samples_run = 0;
  double step_loss = 0, step_n = 0;  // this step's finite micro-batch losses and micro-batches
  float bad_loss = 0;                // a loss of this step that is not finite (0: none)
  double spike_mean = 0;             // the loss-spike guard's running mean, over spike_n steps
  int64_t spike_n = 0;
  char label[96];

  while (t->step < t->end_step && !t->stopped) {
    TRY(px_loader_start_epoch(t->loader, t->epoch, t->next_batch));
    size_t b_idx = t->next_batch;
    int micro = 0;
    while (t->step < t->end_step && !t->stopped) {
      const px_batch *b;
      TRY(px_loader_next(t->loader, &b));
      if (!b) break;
      b_idx++;
      const bool last_of_epoch = b_idx == t->batches_per_epoch;
      const bool last_micro = micro + 1 == accum || last_of_epoch;
      if (micro == 0) {
        if (t->zero) px_zero_zero_grad(t->zero);
        else if (!t->grads_zero) px_model_zero_grad(md);
      }
      t->grads_zero = false;
      if (t->ddp) px_ddp_set_sync(t->ddp, last_micro);
      if (t->zero) px_zero_set_sync(t->zero, last_micro);
      snprintf(label, sizeof label, "step %lld, epoch %llu, batch %zu", (long long)t->step,
               (unsigned long long)t->epoch, b_idx - 1);
      px_trainer_label(t, label);

      px_tensor logits;
      if (b->n == 0)
        return px_error(PX_ERR_FORMAT, "train: batch %zu of epoch %llu has no samples left (every record was bad)",
                        b_idx - 1, (unsigned long long)t->epoch);
      px_tensor x;
      const int32_t *targets;
      TRY(px_dev_batch_stage(&t->staged, md, b, &x, &targets));  // on a GPU: copied there
      TRY(px_model_forward(md, &x, &logits));
      float *dlogits = px_model_scratch(md, (size_t)px_tensor_numel(&logits));  // the model's device
      if (!dlogits) return PX_ERR_NOMEM;
      float loss;
      TRY(loss_of(t, &logits, b, targets, &ce, &loss, dlogits));
      // A loss that is not finite still goes through backward (DDP's
      // buckets are collectives every rank must join); the ranks stop
      // together at the step's agreement below, before any update.
      if (isfinite(loss)) step_loss += loss;
      else if (isfinite(bad_loss)) bad_loss = loss;
      if (accum > 1) TRY(px_device_scale(md, dlogits, (size_t)px_tensor_numel(&logits), 1.0f / (float)accum));
      px_tensor dy = logits;
      dy.data = dlogits;
      TRY(px_model_backward(md, &dy, NULL));
      step_n += 1;
      samples_log += (int64_t)b->n;
      samples_run += (int64_t)b->n;
      micro++;
      if (!last_micro) continue;

      micro = 0;
      // The gradients averaged first: the buckets' all-reduces are
      // complete before any rank can leave on the agreement's verdict.
      if (t->zero) TRY(px_zero_sync(t->zero));
      else if (t->ddp) TRY(px_ddp_sync(t->ddp));
      // The step's agreement: {finite losses' sum, micro-batches, ranks with a loss that is not finite,
      // ranks asked to stop}, summed over the ranks -- the same figures on every rank, so every rank
      // takes the same decision at the same step.
      double agree[4] = {step_loss, step_n, isfinite(bad_loss) ? 0.0 : 1.0,
                         t->o.stop_flag && *t->o.stop_flag != 0 ? 1.0 : 0.0};
      TRY(px_comm_allreduce(t->comm, agree, 4, PX_F64, PX_SUM));
      const double step_mean = agree[1] > 0 ? agree[0] / agree[1] : NAN;
      loss_sum += agree[0];  // the logged mean needs no collective of its own
      loss_n += agree[1];
      if (agree[2] > 0)
        return px_error(PX_ERR_INVALID,
                        "train: the loss is not finite at step %lld (epoch %llu, batch %zu) on %.0f "
                        "of %d rank%s (this rank's: %g); every rank stops here, before the update: lower the learning "
                        "rate or clip gradients (--clip-grad), and resume from the last checkpoint",
                        (long long)t->step + 1, (unsigned long long)t->epoch + 1, b_idx - 1, agree[2], t->world,
                        t->world == 1 ? "" : "s", isfinite(bad_loss) ? (double)step_loss / step_n : (double)bad_loss);
      if (t->o.loss_spike_factor > 0) {
        // Watched from this call's second step: during the warm-up against the mean of the warm-up steps
        // before it (a jump at step 2 is caught; before, the warm-up was not watched and the jump, inside
        // the mean, hid every later step), then against the moving average.  step_mean is the agreement's,
        // the same on every rank: every rank stops at the same step.
        const bool warm = spike_n < t->o.loss_spike_warmup;
        if (spike_n >= 1 && step_mean > t->o.loss_spike_factor * spike_mean)
          return px_error(
            PX_ERR_INVALID,
            "train: loss spike at step %lld (epoch %llu, batch %zu): the loss %g (mean "
            "over the ranks) is more than %g × its running mean %g (%s the %lld step%s before it; the loss-"
            "spike guard, --loss-spike-factor); every rank stops here, before the update: lower the learning "
            "rate or clip gradients (--clip-grad), and resume from the last checkpoint",
            (long long)t->step + 1, (unsigned long long)t->epoch + 1, b_idx - 1, step_mean, t->o.loss_spike_factor,
            spike_mean, warm ? "the mean of" : "a moving average of", (long long)spike_n, spike_n == 1 ? "" : "s");
        // The mean of the warm-up steps, then an exponential moving average.
        spike_mean += warm ? (step_mean - spike_mean) / (double)(spike_n + 1) : 0.1 * (step_mean - spike_mean);
        spike_n++;
      }
      const bool stop_asked = agree[3] > 0;
      step_loss = step_n = 0;
      const bool log_now = due(t->step + 1, t->o.log_every) || t->step + 1 == t->total_steps;
      double grad_norm;
      const float lr = px_lr_at(&t->o.schedule, t->step);  // once a step: the update's and the log's
      TRY(optimizer_step(t, lr, log_now, &grad_norm));
      t->step++;
      t->next_batch = b_idx;
      if (t->step == t->start_step + 1) TRY(report_memory(t, res));
      if (log_now) {
        double now = px_time_now();
        double mean = loss_n > 0 ? loss_sum / loss_n : NAN;
        double samples = (double)samples_log * t->dp;  // the tp ranks of a group share their samples
        double per_s = now > t_log ? samples / (now - t_log) : NAN;
        double eta = (double)(t->total_steps - t->step) * (now - t_start) / (double)(t->step - t->start_step);
        px_step_metrics m = {.step = t->step,
                             .total_steps = t->total_steps,
                             .epoch = (int64_t)t->epoch + 1,
                             .total_epochs = (t->total_steps + t->steps_per_epoch - 1) / t->steps_per_epoch,
                             .loss = mean,
                             .lr = lr,
                             .grad_norm = grad_norm,
                             .samples_per_s = per_s,
                             .eta_s = eta};
        TRY(px_log_step(t->log, &m));
        res->train_loss = mean;
        loss_sum = loss_n = 0;
        samples_log = 0;
        t_log = now;
      } else {
        // The bar (a terminal) moves every step; the loss, rate and norm
        // stay the last record's (no collective between records).
        const double el = px_time_now() - t_start;
        px_step_metrics m = {.step = t->step,
                             .total_steps = t->total_steps,
                             .epoch = (int64_t)t->epoch + 1,
                             .total_epochs = (t->total_steps + t->steps_per_epoch - 1) / t->steps_per_epoch,
                             .loss = NAN,
                             .lr = lr,
                             .grad_norm = NAN,
                             .samples_per_s = el > 0 ? (double)samples_run * t->dp / el : NAN,
                             .eta_s = (double)(t->total_steps - t->step) * el / (double)(t->step - t->start_step)};
        TRY(px_log_progress(t->log, &m));
      }
      if (due(t->step, t->o.eval_every)) TRY(run_eval(t));
      if (due(t->step, t->o.ckpt_every)) TRY(save(t));
      if (stop_asked) t->stopped = true;  // any rank's signal (the agreement) stops all after the same step
    }
    if (b_idx == t->batches_per_epoch) {  // the epoch is complete (also when a stop fell on its last step)
      t->epoch++;
      t->next_batch = 0;
      t->epochs_done++;
      size_t skipped = px_loader_skipped(t->loader);
      res->skipped += skipped;
      TRY(px_log_epoch(t->log, (int64_t)t->epoch, t->step));
      if (t->o.eval_every == 0) TRY(run_eval(t));
      if (t->o.ckpt_every == 0) TRY(save(t));
    }
  }
  double dt = px_time_now() - t_start;
  res->seconds = dt;
  res->samples_per_s = dt > 0 ? (double)samples_run * t->dp / dt : NAN;
  return PX_OK;
}

// Stage 3 gathers the whole model back on free (collective): the model
// is usable alone afterwards.
static px_status trainer_free(px_trainer *t) {
  px_loader_free(t->loader);
  px_ddp_free(t->ddp);
  px_optim_free(t->opt);
  px_status st = t->zero ? px_zero_free(t->zero) : PX_OK;
  t->zero = NULL;
  px_trainer_device_free(t);
  return st;
}

// The optimizer over what this rank updates, and the wrap: DDP (world > 1)
// or ZeRO.  Resume goes between, as each needs (internal.h).
static px_status setup_parallel(px_trainer *t, px_model *model, bool *resumed) {
  *resumed = false;
  if (t->o.zero.stage == 0) {
    t->shard_params = model->param_data;
    t->shard_grads = model->grad_data;
    t->shard_n = model->n_param_elems;
    TRY(px_optim_create(&t->opt, model->param_data, model->grad_data, model->n_param_elems, &t->o.optim));
    TRY(px_trainer_optim_to_device(t));  // on a GPU: its state there, a host mirror for checkpoints
    TRY(px_trainer_resume(t, resumed));
    if (t->dp > 1) TRY(px_ddp_wrap(&t->ddp, model, t->dp_comm, &t->o.ddp));
    return PX_OK;
  }
  TRY(px_trainer_resume(t, resumed));
  px_comm_set_label(t->comm, "ZeRO wrap");
  TRY(px_zero_wrap(&t->zero, model, t->dp_comm, &t->o.zero));
  px_zero_shard(t->zero, &t->shard_params, &t->shard_grads, &t->shard_n);
  TRY(px_zero_optim_create(t->zero, &t->opt, &t->o.optim));
  return px_trainer_resume_shards(t);
}

px_status px_train(px_comm *comm, px_model *model, px_dataset *train, px_dataset *val, const px_train_opts *opts,
                   px_logger *log, px_train_result *out) {
  px_train_result res;
  memset(&res, 0, sizeof res);
  res.eval.loss = res.eval.accuracy = res.eval.perplexity = NAN;
  if (out) *out = res;
  if (!model || !train || !opts) return px_error(PX_ERR_INVALID, "train: NULL model, dataset or options");
  TRY(check_opts(opts));
  px_trainer t;
  memset(&t, 0, sizeof t);
  t.comm = comm;
  t.rank = px_comm_rank(comm);
  t.world = px_comm_size(comm);
  t.model = model;
  t.train = train;
  t.val = val;
  t.o = *opts;
  t.log = log;
  t.last_eval_step = t.last_ckpt_step = -1;
  t.last_eval.loss = t.last_eval.accuracy = t.last_eval.perplexity = NAN;
  t.dp_comm = t.o.mesh ? t.o.mesh->dp_comm : comm;
  t.dp = t.o.mesh ? t.o.mesh->dp : t.world;
  t.dp_rank = t.o.mesh ? t.o.mesh->dp_rank : t.rank;

  px_loader_opts lo = PX_LOADER_DEFAULTS;
  lo.batch_size = t.o.batch_size;
  lo.workers = t.o.workers;
  lo.prefetch = t.o.prefetch;
  lo.shuffle = true;
  lo.seed = t.o.seed;
  lo.rank = t.dp_rank;  // the ranks of a tensor-parallel group read the same batches
  lo.world = t.dp;
  lo.skip_bad = t.o.skip_bad;
  // The global batch (batch × dp ranks × micro-batches) and the run's
  // length must fit their 64-bit counts (else they wrap: a run of 0 steps).
  int64_t global_batch;
  if (t.o.batch_size > (size_t)INT64_MAX ||
      __builtin_mul_overflow((int64_t)t.o.batch_size, (int64_t)t.dp, &global_batch) ||
      __builtin_mul_overflow(global_batch, (int64_t)t.o.accum_steps, &global_batch))
    return px_error(PX_ERR_INVALID,
                    "train: batch_size %zu × %d data-parallel ranks × accum_steps %d samples a step "
                    "is more than %lld (a 64-bit count would wrap)",
                    t.o.batch_size, t.dp, t.o.accum_steps, (long long)INT64_MAX);
  px_status st = px_loader_create(&t.loader, train, &lo);
  if (st != PX_OK) return px_error_wrap(st, "train");
  t.batches_per_epoch = px_loader_num_batches(t.loader);
  st = px_train_total_steps(&t.o, t.batches_per_epoch, &t.steps_per_epoch, &t.total_steps);
  if (st != PX_OK) {
    px_loader_free(t.loader);
    return st;
  }
  st = px_train_schedule(&t.o, t.total_steps, &t.o.schedule);
  if (st != PX_OK) {
    px_loader_free(t.loader);
    return st;
  }
  t.end_step = t.o.stop_at_step > 0 && t.o.stop_at_step < t.total_steps ? t.o.stop_at_step : t.total_steps;

  bool resumed = false;
  // The device first (the optimizer is created over its buffers); on GPUs
  // with more than one rank, DDP's communicator becomes NCCL's.
  st = px_trainer_device_setup(&t);
  if (st == PX_OK) st = setup_parallel(&t, model, &resumed);
  if (st == PX_OK) {
    t.start_step = t.step;
    if (resumed) t.last_ckpt_step = t.step;
    px_model_train(model, true);
    if (t.step >= t.total_steps)
      px_log_text(log, "nothing to do: the checkpoint is at step %lld of %lld", (long long)t.step,
                  (long long)t.total_steps);
    st = train_loop(&t, &res);
  }
  // The run's end: a last evaluation and checkpoint unless one was just
  // made; a call that stops early only checkpoints, to be resumed.
  if (st == PX_OK) t.stopped = t.step < t.total_steps;  // a stop on the last step is no stop
  if (st == PX_OK && !t.stopped) st = run_eval(&t);
  if (st == PX_OK) st = save(&t);
  if (st == PX_OK && t.stopped)
    px_log_text(log, "stopped at step %lld of %lld%s", (long long)t.step, (long long)t.total_steps,
                t.o.ckpt_dir ? ": resume to go on" : " (no checkpoint directory: nothing to resume from)");
  res.steps = t.step;
  res.start_step = t.start_step;
  res.epochs = (int64_t)t.epochs_done;
  res.stopped = t.stopped;
  res.eval = t.last_eval;
  snprintf(res.last_checkpoint, sizeof res.last_checkpoint, "%s", t.last_checkpoint);
  px_status fst = trainer_free(&t);
  if (st == PX_OK) st = fst;
  // On a GPU the model stays there; its host mirrors hold the final weights.
  if (st == PX_OK) st = px_trainer_pull(model, NULL);
  if (out) *out = res;
  px_model_train(model, true);
  return st;
}
