// Evaluation over a held-out split, exact over the whole split whatever
// the number of ranks: rank r takes the contiguous share
// [r·n/world, (r+1)·n/world) (no padding, no repeats, unlike training's
// sampler), and the sums of loss, correct predictions and rows are
// all-reduced.
//
//   loss       = Σ_rows ℓ / rows           (rows: samples, or tokens for a language model)
//   accuracy   = Σ [argmax logits = y] / rows          classifiers (y: one label per sample)
//   perplexity = exp(loss)                             language models (y: (T,) per sample)
//
// Every rank runs the same number of forward passes: a rank whose share
// has fewer batches repeats one whose results it drops.  A sharded model
// (ZeRO-3) all-gathers each unit's parameters inside forward, a collective
// that every rank must join; DDP loses nothing but a few forwards.
//
// A model on a GPU evaluates there: each batch is copied to the device, the
// loss comes from the device logits, and a classifier's logits come back to
// the host for the argmax count; the sums stay on the host (comm).
#include "train/internal.h"

#include <math.h>
#include <string.h>

// Rows of `logits` (C classes each) whose argmax is the target.
int64_t px_count_correct(const px_tensor *logits, const int32_t *y) {
  const int64_t C = logits->shape[logits->ndim - 1];
  const int64_t rows = px_tensor_numel(logits) / C;
  const float *z = px_f32(logits);
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; r++) {
    const float *row = z + r * C;
    int64_t best = 0;
    for (int64_t j = 1; j < C; j++)
      if (row[j] > row[best]) best = j;
    correct += best == y[r];
  }
  return correct;
}

// Runs `share` (at most max_batches batches), then forward passes that
// count for nothing until `target` passes were made; count false: all of
// them count for nothing (a rank with an empty share).
static px_status eval_share(px_model *model, px_dataset *share, size_t batch_size, int workers, int64_t max_batches,
                            int64_t target, bool count, px_tp_group *tp, int vocab, double sums[3]) {
  px_loader *l;
  px_loader_opts lo = PX_LOADER_DEFAULTS;
  lo.batch_size = batch_size;
  lo.workers = workers;
  lo.shuffle = false;
  px_status st = px_loader_create(&l, share, &lo);
  if (st != PX_OK) return px_error_wrap(st, "evaluate");
  st = px_loader_start_epoch(l, 0, 0);
  const px_ce_opts ce = PX_CE_DEFAULTS;
  px_dev_batch staged = {0};
  int64_t passes = 0;
  for (int64_t k = 0; st == PX_OK && count && (max_batches == 0 || k < max_batches); k++) {
    const px_batch *b;
    st = px_loader_next(l, &b);
    if (st != PX_OK || !b) break;
    if (b->n == 0) continue;
    px_tensor logits, x;
    const int32_t *targets;  // where the logits are
    st = px_dev_batch_stage(&staged, model, b, &x, &targets);
    if (st == PX_OK) st = px_model_forward(model, &x, &logits);
    if (st != PX_OK) break;
    passes++;
    const int64_t C = logits.shape[logits.ndim - 1];
    const int64_t rows = C ? px_tensor_numel(&logits) / C : 0;
    if (b->y.dtype != PX_I32 || px_tensor_numel(&b->y) != rows) {
      char a[PX_SHAPE_STR_MAX], c[PX_SHAPE_STR_MAX];
      st = px_error(PX_ERR_SHAPE, "evaluate: the model's output %s does not fit the targets %s",
                    px_shape_str(logits.ndim, logits.shape, a, sizeof a),
                    px_shape_str(b->y.ndim, b->y.shape, c, sizeof c));
      break;
    }
    float loss;
    // Tensor parallel: this rank's vocabulary columns (a language model).
    st = tp ? px_tp_cross_entropy(tp, &logits, vocab, targets, -100, &loss, NULL)
            : px_cross_entropy_loss(&logits, targets, &ce, &loss, NULL);
    if (st != PX_OK) break;
    sums[0] += (double)loss * (double)rows;
    // A language model's accuracy is not reported: on a GPU its logits stay there.
    if (!tp && (logits.device != PX_CUDA || b->y.ndim == 1)) {
      int64_t correct;
      st = px_device_count_correct(&logits, (const int32_t *)b->y.data, &correct);
      if (st != PX_OK) break;
      sums[1] += (double)correct;
    }
    sums[2] += (double)rows;
  }
  if (st == PX_OK && passes < target) {
    const px_batch *b = NULL;
    st = px_loader_start_epoch(l, 0, 0);
    while (st == PX_OK && (st = px_loader_next(l, &b)) == PX_OK && b && b->n == 0) {}
    if (st == PX_OK && !b) st = px_error(PX_ERR_INVALID, "evaluate: no batch to keep pace with the other ranks");
    px_tensor x;
    const int32_t *targets;
    if (st == PX_OK) st = px_dev_batch_stage(&staged, model, b, &x, &targets);
    for (px_tensor logits; st == PX_OK && passes < target; passes++) st = px_model_forward(model, &x, &logits);
  }
  px_dev_batch_free(&staged);
  px_loader_free(l);
  return st;
}

// The split is shared over `world` shares (rank's is this rank's: the ranks
// of a tensor-parallel group take the same share and sum only over
// sum_comm, the dp ranks); every rank of comm makes the same passes.
static px_status evaluate(px_comm *comm, int rank, int world, px_comm *sum_comm, px_tp_group *tp, int vocab,
                          px_model *model, px_dataset *data, size_t batch_size, int workers, int64_t max_batches,
                          px_eval_metrics *out) {
  memset(out, 0, sizeof *out);
  out->loss = out->accuracy = out->perplexity = NAN;
  if (!model || !data || batch_size < 1)
    return px_error(PX_ERR_INVALID, "evaluate: NULL model or dataset, or batch size 0");
  const size_t n = data->length;
  const size_t lo = n * (size_t)rank / (size_t)world, hi = n * (size_t)(rank + 1) / (size_t)world;
  double sums[3] = {0, 0, 0};  // loss × rows, correct rows, rows
  const bool was_training = model->ctx.training;
  px_model_train(model, false);
  // The most batches any rank has: every rank makes that many passes.
  int64_t target = (int64_t)((hi - lo + batch_size - 1) / batch_size);
  if (max_batches > 0 && target > max_batches) target = max_batches;
  px_status st = px_comm_size(comm) > 1 ? px_comm_allreduce(comm, &target, 1, PX_I64, PX_MAX) : PX_OK;
  if (st != PX_OK) {
    px_model_train(model, was_training);
    return st;
  }
  if (target > 0) {
    px_dataset *share;
    const bool empty = hi == lo;
    // An empty share keeps pace on the split's first samples.
    st = px_dataset_subset(&share, data, empty ? 0 : lo, empty ? (n < batch_size ? n : batch_size) : hi - lo);
    if (st == PX_OK) {
      st = eval_share(model, share, batch_size, workers, max_batches, target, !empty, tp, vocab, sums);
      px_dataset_free(share);
    }
  }
  px_model_train(model, was_training);
  // Every rank takes part in the all-reduce, also one that failed, so the
  // others do not wait on it; the flag makes all of them fail together.
  double v[4] = {sums[0], sums[1], sums[2], st == PX_OK ? 0.0 : 1.0};
  px_status cst = px_comm_allreduce(sum_comm, v, 4, PX_F64, PX_SUM);
  if (st != PX_OK) return st;
  if (cst != PX_OK) return cst;
  if (v[3] > 0) return px_error(PX_ERR_COMM, "evaluate: %g other rank(s) failed to evaluate their share", v[3]);
  out->samples = (int64_t)v[2];
  if (v[2] > 0) {
    out->loss = v[0] / v[2];
    if (data->y_ndim == 0) out->accuracy = v[1] / v[2];
    else out->perplexity = exp(out->loss);
  }
  return PX_OK;
}

px_status px_evaluate(px_comm *comm, px_model *model, px_dataset *data, size_t batch_size, int workers,
                      int64_t max_batches, px_eval_metrics *out) {
  return evaluate(comm, px_comm_rank(comm), px_comm_size(comm), comm, NULL, 0, model, data, batch_size, workers,
                  max_batches, out);
}

px_status px_evaluate_tp(px_mesh *mesh, int vocab, px_model *model, px_dataset *data, size_t batch_size, int workers,
                         int64_t max_batches, px_eval_metrics *out) {
  return evaluate(mesh->world_comm, mesh->dp_rank, mesh->dp, mesh->dp_comm, &mesh->tp_group, vocab, model, data,
                  batch_size, workers, max_batches, out);
}
