/* cuda_train_cases.h — what the GPU training tests share: a small GPT on a
 * synthetic token dataset, trained by px_train on a device, with the loss
 * of every step recorded.
 *
 * The data: sample i is a walk over V tokens, next = (7·prev + 3 + bit) mod V
 * with bit a fixed pseudo-random function of (i, t): learnable, and the same
 * on every run.  The model: GPT, 2 layers, width 64, 4 heads, context 32,
 * vocabulary 96, dropout 0.1 (so the dropout counter matters). */
#ifndef CUDA_TRAIN_CASES_H
#define CUDA_TRAIN_CASES_H

#include "px_test.h"
#include <plexus/zoo.h>

#include <stdlib.h>
#include <string.h>

enum { CT_V = 96, CT_T = 32, CT_SAMPLES = 512, CT_MAX_STEPS = 64 };

static px_status ct_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  (void)d;
  (void)rng;
  int32_t *x = (int32_t *)b->x.data + slot * CT_T, *y = (int32_t *)b->y.data + slot * CT_T;
  uint64_t h = (uint64_t)i * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  h ^= h >> 29;
  int32_t prev = (int32_t)(h % CT_V);
  for (int t = 0; t < CT_T; t++) {
    const int32_t next = (int32_t)((prev * 7 + 3 + (int32_t)((h >> (t + 3)) & 1)) % CT_V);
    x[t] = prev;
    y[t] = next;
    prev = next;
  }
  return PX_OK;
}

static void ct_destroy(px_dataset *d) { free(d); }

static px_dataset *ct_dataset(void) {
  static const px_dataset_ops ops = {.get = ct_get, .destroy = ct_destroy};
  px_dataset *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->ops = &ops;
  d->kind = "walks";
  d->length = CT_SAMPLES;
  d->x_dtype = d->y_dtype = PX_I32;
  d->x_ndim = d->y_ndim = 1;
  d->x_shape[0] = d->y_shape[0] = CT_T;
  d->num_classes = CT_V;
  return d;
}

typedef struct ct_losses {
  double loss[CT_MAX_STEPS + 1], norm[CT_MAX_STEPS + 1];
  int64_t n;
} ct_losses;

static void ct_on_step(const px_step_metrics *m, void *user) {
  ct_losses *l = user;
  if (m->step >= 1 && m->step <= CT_MAX_STEPS) {
    l->loss[m->step] = m->loss;
    l->norm[m->step] = m->grad_norm;
    if (m->step > l->n) l->n = m->step;
  }
}

typedef struct ct_run {
  px_device device;
  px_dtype precision;
  int64_t steps, stop_at, ckpt_every;
  int accum;
  const char *ckpt_dir, *resume;
} ct_run;

/* Train a fresh model (seed 11) as r says; losses per step into *l (may be
 * NULL), the last checkpoint's path into last (may be NULL). */
static px_status ct_train(const ct_run *r, ct_losses *l, char *last, size_t cap) {
  px_comm *comm;
  px_status st = px_comm_init_self(&comm);
  if (st != PX_OK) return st;
  px_gpt_config cfg = {.vocab_size = CT_V, .context = CT_T, .n_layer = 2, .n_head = 4, .n_embd = 64, .dropout = 0.1f};
  px_model *md = NULL;
  px_dataset *data = ct_dataset();
  px_logger *log = NULL;
  px_logger_opts lo = {.rank = 0, .console = false};
  if (!data) st = px_error(PX_ERR_NOMEM, "out of memory");
  if (st == PX_OK) st = px_model_create(&md, px_zoo_gpt(&cfg), 11);
  if (st == PX_OK) st = px_logger_create(&log, &lo);
  if (st == PX_OK && l) {
    memset(l, 0, sizeof *l);
    px_log_hooks h = {.on_step = ct_on_step, .user = l};
    st = px_log_add_hooks(log, &h);
  }
  px_train_opts o = PX_TRAIN_DEFAULTS;
  o.batch_size = 8;
  o.workers = 0;
  o.optim = px_adamw_defaults(2e-3f);
  o.clip_grad_norm = 1.0f;
  o.accum_steps = r->accum > 0 ? r->accum : 1;
  o.max_steps = r->steps;
  o.stop_at_step = r->stop_at;
  o.seed = 5;
  o.log_every = 1;
  o.ckpt_dir = r->ckpt_dir;
  o.ckpt_every = r->ckpt_every;
  o.keep_last = 0;
  o.resume = r->resume;
  o.device = r->device;
  o.precision = r->precision;
  px_train_result res;
  if (st == PX_OK) st = px_train(comm, md, data, NULL, &o, log, &res);
  if (st == PX_OK && last) snprintf(last, cap, "%s", res.last_checkpoint);
  px_logger_free(log);
  px_model_free(md);
  px_dataset_free(data);
  px_comm_free(comm);
  return st;
}

/* Exit 77 (ctest's skip) where px_train cannot use a GPU. */
static void ct_skip_without_gpu(const char *name) {
  const int n = px_train_cuda_devices();
  if (n > 0) return;
  printf("%s: skipped: %s\n", name, n < 0 ? "plexus was built without CUDA" : "no CUDA device is visible");
  exit(77);
}

#endif
