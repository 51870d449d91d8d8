/* Claims about px_train's numeric guards, each on 1 rank, on 2 ranks with
 * DDP and on 2 ranks with ZeRO stage 1 (threads backend):
 *
 * 1. A NaN loss on one rank (one poisoned sample, read by whichever rank
 *    the sampler deals it to) stops every rank at the same step, before
 *    the update: each returns PX_ERR_INVALID with "the loss is not finite
 *    at step S", the same S, has taken S - 1 steps, and holds finite
 *    parameters (the last good ones).
 * 2. An infinite loss (every sample's logits ±3e38 against the class of
 *    the low one: the mean overflows float) does the same at step 1, and
 *    the message shows the inf.
 * 3. A finite loss whose gradient overflows (inputs of 1e38: the
 *    accumulated dW is inf) stops every rank at step 1 with "the gradient
 *    norm is inf" when the norm is computed (clipping on).
 * 4. Adam at a huge learning rate (lr 100 on the blobs) diverges: without
 *    the loss-spike guard the run trains on to its last step (the loss
 *    ends far above its start: the silent divergence, kept as the
 *    default).
 * 5. With loss_spike_factor 5, a jump inside the 10 warm-up steps is
 *    caught: Adam at lr 1e6 takes the loss from 1.3 to 2e13 at step 2
 *    (finite, so only the spike guard can see it) and every rank stops at
 *    step 2 with "loss spike at step 2" and "the mean of the 1 step before
 *    it" (before, the warm-up was not watched and the jump, inside the
 *    running mean, hid every later step: the run ended with status OK).
 * 6. A healthy run is not stopped in its warm-up, and a jump after it is
 *    still caught against the moving average: Adam at lr 0.01 learns the
 *    blobs (the loss falls from 1.3), then every label shifts by one class
 *    from the first sample of step SHIFT_STEP (21) on: every rank stops at
 *    the same step S >= 21 with "a moving average of".
 * 7. Bad guard options are refused (factor 1, warm-up 0).
 *
 * If it fails: a rank trains on past a non-finite step, the ranks stop at
 * different steps (the rest would hang in the next collective), or the
 * update of the bad step reached the parameters. */
#include "px_test.h"
#include "train_blobs.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { CASE_NAN_ONE, CASE_INF_LOSS, CASE_INF_GRAD, CASE_SPIKE_OFF, CASE_SPIKE_EARLY, CASE_SPIKE_LATE };
static const char *case_names[] = {"NaN loss on one rank", "inf loss",         "inf gradient norm",
                                   "lr 100, guard off",    "lr 1e6, guard on", "labels shift, guard on"};

/* ---- A dataset of 2-feature samples for the poison cases ----------------- */
typedef struct poison {
  int mode;   /* CASE_* */
  size_t bad; /* CASE_NAN_ONE: the poisoned sample */
} poison;

static px_status poison_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  (void)rng;
  const poison *p = d->impl;
  float *x = (float *)b->x.data + slot * 2;
  int32_t *y = (int32_t *)b->y.data + slot;
  if (p->mode == CASE_NAN_ONE) {
    px_rng r = px_rng_make(5, (uint64_t)i);
    x[0] = i == p->bad ? NAN : px_rng_normal(&r);
    x[1] = px_rng_normal(&r);
    *y = (int32_t)(i % 2);
  } else {  // every sample: a huge first feature, the class whose logit it drives down
    x[0] = 3e38f;
    x[1] = 0.0f;
    *y = 1;
  }
  return PX_OK;
}

static void poison_destroy(px_dataset *d) {
  free(d->impl);
  free(d);
}

static const px_dataset_ops poison_ops = {poison_get, poison_destroy};

static px_dataset *poison_open(int mode, size_t n, size_t bad) {
  px_dataset *d = calloc(1, sizeof *d);
  poison *p = calloc(1, sizeof *p);
  p->mode = mode;
  p->bad = bad;
  d->ops = &poison_ops;
  d->kind = "poison";
  d->length = n;
  d->x_dtype = PX_F32;
  d->y_dtype = PX_I32;
  d->x_ndim = 1;
  d->x_shape[0] = 2;
  d->y_ndim = 0;
  d->num_classes = 2;
  d->impl = p;
  return d;
}

#define LR 100.0f
#define LR_EARLY 1e6f /* the loss jumps at step 2, inside the warm-up */
#define LR_LATE 0.01f /* a healthy rate: the loss falls */
#define SHIFT_STEP 21 /* the first step whose labels are shifted */

/* ---- The blobs with every label shifted by one class from a rank's sample
 * shift_after on (workers 0: the loader reads on the training thread) ----- */
typedef struct shifted {
  px_dataset *inner;
  size_t read, shift_after;
} shifted;

static px_status shifted_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  shifted *s = d->impl;
  px_status st = s->inner->ops->get(s->inner, i, b, slot, rng);
  if (st != PX_OK) return st;
  int32_t *y = (int32_t *)b->y.data + slot;
  if (s->read++ >= s->shift_after) *y = (*y + 1) % (int32_t)d->num_classes;
  return PX_OK;
}

static void shifted_destroy(px_dataset *d) {
  shifted *s = d->impl;
  px_dataset_free(s->inner);
  free(s);
  free(d);
}

static const px_dataset_ops shifted_ops = {shifted_get, shifted_destroy};

static px_dataset *shifted_open(px_dataset *inner, size_t shift_after) {
  px_dataset *d = calloc(1, sizeof *d);
  shifted *s = calloc(1, sizeof *s);
  *d = *inner;
  s->inner = inner;
  s->shift_after = shift_after;
  d->ops = &shifted_ops;
  d->kind = "shifted blobs";
  d->impl = s;
  return d;
}

/* ---- One run on every rank ------------------------------------------------ */
#define MAX_RANKS 2
typedef struct run_arg {
  int mode, zero;
  double spike_factor;
  px_status st[MAX_RANKS];
  int64_t steps[MAX_RANKS];
  bool finite[MAX_RANKS];
  double train_loss[MAX_RANKS];
  char msg[MAX_RANKS][512];
} run_arg;

static int run_rank(px_comm *comm, void *argp) {
  run_arg *a = argp;
  const int rank = px_comm_rank(comm);
  px_model *md;
  px_dataset *ds;
  px_train_opts o = PX_TRAIN_DEFAULTS;
  o.workers = 0;
  o.seed = 3;
  o.log_every = 1000;
  o.zero.stage = a->zero;
  if (a->mode == CASE_SPIKE_OFF || a->mode == CASE_SPIKE_EARLY || a->mode == CASE_SPIKE_LATE) {
    CHECK_OK(px_model_create(&md, px_chain_of(3, px_linear(8, 32, true), px_relu(), px_linear(32, 4, true)), 9));
    ds = blobs_open(256, 8, 4, 0.5f, 1, 2);
    if (a->mode == CASE_SPIKE_LATE) ds = shifted_open(ds, (size_t)(SHIFT_STEP - 1) * 8);
    o.batch_size = 8;
    o.max_steps = 60;
    o.log_every = 60;  // train_loss: the mean over all 60 steps
    o.optim = px_adam_defaults(a->mode == CASE_SPIKE_EARLY ? LR_EARLY : a->mode == CASE_SPIKE_LATE ? LR_LATE : LR);
    o.loss_spike_factor = a->mode == CASE_SPIKE_OFF ? 0.0 : a->spike_factor;
  } else {
    // z = W2 (W1 x + b1) + b2, x = (3e38, 0), class 1.  Inf loss: W1 = [[1, 0], [-1, 0]], W2 = I, so
    // z = (3e38, -3e38) and the loss 6e38 overflows float.  Inf gradient: W1 = that / 1e6, W2 = 1000 I:
    // z = (3e35, -3e35), a finite loss, but dW1 = (W2ᵀ dz) xᵀ ~ 250 × 3e38 overflows.
    CHECK_OK(px_model_create(&md, px_chain_of(2, px_linear(2, 2, true), px_linear(2, 2, true)), 9));
    if (a->mode != CASE_NAN_ONE) {
      const float s = a->mode == CASE_INF_LOSS ? 1.0f : 1e-6f, g = a->mode == CASE_INF_LOSS ? 1.0f : 1e3f;
      const float w[12] = {s, 0, -s, 0, 0, 0, g, 0, 0, g, 0, 0};  // W1 (2, 2), b1, W2 (2, 2), b2
      CHECK(md->n_param_elems == 12, "linear(2, 2) twice has %zu parameters", md->n_param_elems);
      memcpy(md->param_data, w, sizeof w);
    }
    ds = poison_open(a->mode, 64, 37);
    o.batch_size = 4;
    o.max_steps = 30;
    o.optim = px_sgd_defaults(0.01f);
    o.clip_grad_norm = a->mode == CASE_INF_GRAD ? 1.0f : 0.0f;
  }
  px_logger *log;
  px_logger_opts lo = {.rank = rank, .console = false};
  CHECK_OK(px_logger_create(&log, &lo));
  px_train_result r;
  a->st[rank] = px_train(comm, md, ds, NULL, &o, log, &r);
  snprintf(a->msg[rank], sizeof a->msg[rank], "%s", a->st[rank] == PX_OK ? "" : px_last_error());
  a->steps[rank] = r.steps;
  a->train_loss[rank] = r.train_loss;
  a->finite[rank] = true;
  for (size_t k = 0; k < md->n_param_elems; k++) a->finite[rank] &= isfinite(md->param_data[k]) != 0;
  px_logger_free(log);
  px_dataset_free(ds);
  px_model_free(md);
  return 0;
}

/* The step a message names after `what` ("... at step 12 ..."), or -1. */
static long named_step(const char *msg, const char *what) {
  const char *p = strstr(msg, what);
  if (!p) return -1;
  p = strstr(p, "at step ");
  return p ? strtol(p + 8, NULL, 10) : -1;
}

static void run_case(int mode, int world, int zero) {
  run_arg a;
  memset(&a, 0, sizeof a);
  a.mode = mode;
  a.zero = zero;
  a.spike_factor = 5.0;
  int code = 0;
  CHECK_OK(px_comm_run(world, run_rank, &a, &code));
  CHECK(code == 0, "a rank failed");
  char label[96];
  snprintf(label, sizeof label, "%s, %d rank%s%s", case_names[mode], world, world == 1 ? "" : "s",
           zero          ? ", ZeRO 1"
             : world > 1 ? ", DDP"
                         : "");
  if (mode == CASE_SPIKE_OFF) {
    for (int r = 0; r < world; r++) {
      CHECK(a.st[r] == PX_OK && a.steps[r] == 60, "%s: rank %d: status %d after %lld steps (%s)", label, r, a.st[r],
            (long long)a.steps[r], a.msg[r]);
      // ln 4 = 1.39 at the start: a mean over the run far above it is divergence.
      CHECK(a.train_loss[r] > 20.0, "%s: rank %d: mean loss %g: the run did not diverge", label, r, a.train_loss[r]);
    }
    printf("  %-34s trains on: 60 steps, mean loss %.3g\n", label, a.train_loss[0]);
    return;
  }
  const char *what = mode == CASE_INF_GRAD                ? "the gradient norm is inf"
    : mode == CASE_SPIKE_EARLY || mode == CASE_SPIKE_LATE ? "loss spike"
                                                          : "the loss is not finite";
  const long s0 = named_step(a.msg[0], what);
  for (int r = 0; r < world; r++) {
    const long s = named_step(a.msg[r], what);
    CHECK(a.st[r] == PX_ERR_INVALID && s >= 1,
          "%s: rank %d: status %d, message \"%s\" (expected \"%s ... at step "
          "S\")",
          label, r, a.st[r], a.msg[r], what);
    CHECK(s == s0, "%s: rank %d stopped at step %ld, rank 0 at %ld", label, r, s, s0);
    CHECK(a.steps[r] == s - 1, "%s: rank %d took %lld steps; it stopped at step %ld, before its update", label, r,
          (long long)a.steps[r], s);
    CHECK(a.finite[r], "%s: rank %d holds parameters that are not finite: the bad step's update went through", label,
          r);
  }
  if (mode == CASE_INF_LOSS || mode == CASE_INF_GRAD) CHECK(s0 == 1, "%s: stopped at step %ld, expected 1", label, s0);
  if (mode == CASE_NAN_ONE && world == 2)  // the poisoned sample is one rank's: the other's loss was finite
    CHECK(strstr(a.msg[0], "on 1 of 2 ranks") != NULL, "%s: \"%s\" does not say 1 of 2 ranks", label, a.msg[0]);
  if (mode == CASE_INF_LOSS)
    CHECK(strstr(a.msg[0], "inf") != NULL, "%s: \"%s\" does not show the inf", label, a.msg[0]);
  if (mode == CASE_SPIKE_LATE) {
    CHECK(s0 >= SHIFT_STEP, "%s: stopped at step %ld, before the labels shift (step %d)", label, s0, SHIFT_STEP);
    CHECK(strstr(a.msg[0], "a moving average of") != NULL, "%s: \"%s\" does not give the moving average", label,
          a.msg[0]);
  }
  if (mode == CASE_SPIKE_EARLY) {
    CHECK(s0 == 2, "%s: stopped at step %ld, expected 2 (the jump)", label, s0);
    CHECK(strstr(a.msg[0], "the mean of the 1 step before it") != NULL, "%s: \"%s\" does not give the warm-up's mean",
          label, a.msg[0]);
  }
  printf("  %-34s stops every rank at step %ld\n", label, s0);
  if ((mode == CASE_SPIKE_EARLY || mode == CASE_SPIKE_LATE) && world == 1) printf("    %s\n", a.msg[0]);
}

static int bad_opts_rank(px_comm *comm, void *argp) {
  (void)argp;
  px_model *md;
  CHECK_OK(px_model_create(&md, px_chain_of(1, px_linear(2, 2, true)), 1));
  px_dataset *ds = poison_open(CASE_NAN_ONE, 16, 99);
  px_train_opts o = PX_TRAIN_DEFAULTS;
  o.workers = 0;
  o.batch_size = 4;
  o.loss_spike_factor = 1.0;
  CHECK(px_train(comm, md, ds, NULL, &o, NULL, NULL) == PX_ERR_INVALID && strstr(px_last_error(), "loss_spike_factor"),
        "loss_spike_factor 1 accepted (%s)", px_last_error());
  o.loss_spike_factor = 4.0;
  o.loss_spike_warmup = 0;
  CHECK(px_train(comm, md, ds, NULL, &o, NULL, NULL) == PX_ERR_INVALID && strstr(px_last_error(), "loss_spike_warmup"),
        "loss_spike_warmup 0 accepted (%s)", px_last_error());
  px_dataset_free(ds);
  px_model_free(md);
  return 0;
}

int main(void) {
  for (int mode = CASE_NAN_ONE; mode <= CASE_SPIKE_LATE; mode++) {
    run_case(mode, 1, 0);
    run_case(mode, 2, 0);
    run_case(mode, 2, 1);
  }
  int code = 0;
  CHECK_OK(px_comm_run(1, bad_opts_rank, NULL, &code));
  return px_test_finish("test_train_stops_on_nonfinite_and_loss_spike");
}
