/* zoo_runner — a model of the zoo (apps/plexus/zoo.h) loaded from a PyTorch
 * state_dict, run in eval and train mode and trained for a few SGD steps,
 * everything written out for tests/test_zoo_matches_torchvision.py to
 * compare with torchvision:
 *
 *   zoo_runner --model mlp|cnn|resnet_small|resnet18 --args A,B,... --init init.st
 *              --data data.st --steps S --out out.st [--lr 0.01] [--momentum 0.9]
 *              [--weight-decay 1e-4]
 *
 *   --args:   the builder's arguments in zoo.h's order: mlp in,hidden,depth,classes;
 *             cnn in_channels,height,width,channels,classes; resnet_small
 *             in_channels,classes,blocks,width; resnet18 in_channels,classes
 *   init.st:  the state_dict (torchvision's names; num_batches_tracked is skipped),
 *             loaded strictly: a missing, extra or misshapen tensor is refused
 *   data.st:  x_0 .. x_{S-1} F32 (B, C, H, W) inputs, y_0 .. y_{S-1} I32 (B,) classes
 *   out.st:   eval_logits     (B, classes): the loaded model in eval mode on x_0
 *             train_logits    (B, classes): step 0's forward in train mode
 *             losses          (S,): cross-entropy of each step (mean over the batch)
 *             grad0.<param>   step 0's gradient of every parameter
 *             dropout_<s>     (B, 128), cnn only: what step s's dropout multiplied
 *                             its input by (0 or 1/(1 - p)), for torch to apply
 *             decision_<s>_<k>  the k-th branch decision of step s's forward, in
 *                             call order: a ReLU's U8 mask y > 0 (shape of y), a
 *                             max-pool's I32 argmax (shape of y, index h·W + w in
 *                             the input plane: the first pixel of the window
 *                             equal to the output)
 *             then every tensor of the state dict after S steps (parameters and
 *             running statistics)
 *
 * Why the decisions: a ReLU whose input lies within float32 rounding of 0,
 * or a max-pool window whose two largest values do, may go either way in
 * two correct float32 programs, and a gradient element then jumps.  A
 * ResNet-18 at 224x224 takes millions of such decisions; some are that
 * close.  So every ReLU and max-pool of the model is wrapped (before
 * px_model_create, transparently in names) in a recorder that reports what
 * plexus decided, for torch to decide the same; the test checks separately
 * that plexus's decisions are those of exact arithmetic but for near-ties.
 *
 * One step is torch's `zero_grad; loss = cross_entropy(model(x), y);
 * loss.backward(); opt.step()` with SGD(lr, momentum, weight_decay), the
 * model in train mode.  Threads: PX_NUM_THREADS.  Any failure prints
 * px_last_error() and exits 1, writing nothing; a bad command line exits 2. */
#include <plexus/plexus.h>

#include <plexus/zoo.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 6
#define CNN_HIDDEN 128 /* zoo.h: the cnn's dropout acts on (N, 128) */

typedef struct run_opts {
  const char *model, *init_path, *data_path, *out_path;
  int args[MAX_ARGS], n_args;
  int steps;
  float lr, momentum, weight_decay;
} run_opts;

static int fail(const char *what) {
  fprintf(stderr, "zoo_runner: %s: %s\n", what, px_last_error());
  return 1;
}

static int usage(const char *why) {
  fprintf(stderr,
          "zoo_runner: %s\n"
          "usage: zoo_runner --model mlp|cnn|resnet_small|resnet18 --args A,B,... --init FILE --data FILE\n"
          "                  --steps N --out FILE [--lr F] [--momentum F] [--weight-decay F]\n",
          why);
  return 2;
}

static int parse_args(int argc, char **argv, run_opts *o) {
  *o = (run_opts){.steps = 1, .lr = 0.01f};
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) return usage("every option takes a value");
    const char *a = argv[i], *v = argv[++i];
    char *end;
    if (strcmp(a, "--model") == 0) o->model = v;
    else if (strcmp(a, "--init") == 0) o->init_path = v;
    else if (strcmp(a, "--data") == 0) o->data_path = v;
    else if (strcmp(a, "--out") == 0) o->out_path = v;
    else if (strcmp(a, "--steps") == 0) {
      o->steps = (int)strtol(v, &end, 10);
      if (*end || o->steps < 1) return usage("--steps must be a positive integer");
    } else if (strcmp(a, "--lr") == 0 || strcmp(a, "--momentum") == 0 || strcmp(a, "--weight-decay") == 0) {
      float f = strtof(v, &end);
      if (end == v || *end) return usage("a numeric option has a value that is not a number");
      *(a[2] == 'l' ? &o->lr : a[2] == 'm' ? &o->momentum : &o->weight_decay) = f;
    } else if (strcmp(a, "--args") == 0) {
      for (const char *p = v; *p; p = *end ? end + 1 : end) {
        if (o->n_args == MAX_ARGS) return usage("--args: too many values");
        o->args[o->n_args++] = (int)strtol(p, &end, 10);
        if (end == p || (*end && *end != ',')) return usage("--args takes integers separated by commas");
      }
    } else {
      fprintf(stderr, "zoo_runner: unknown option %s\n", a);
      return usage("unknown option");
    }
  }
  if (!o->model || !o->init_path || !o->data_path || !o->out_path)
    return usage("--model, --init, --data and --out are required");
  return 0;
}

// The zoo builder named by --model with --args.
static px_module *build(const run_opts *o) {
  const int *a = o->args, n = o->n_args;
  if (strcmp(o->model, "mlp") == 0 && n == 4) return px_zoo_mlp(a[0], a[1], a[2], a[3]);
  if (strcmp(o->model, "cnn") == 0 && n == 5) return px_zoo_cnn(a[0], a[1], a[2], a[3], a[4]);
  if (strcmp(o->model, "resnet_small") == 0 && n == 4) return px_zoo_resnet_small(a[0], a[1], a[2], a[3]);
  if (strcmp(o->model, "resnet18") == 0 && n == 2) return px_zoo_resnet18(a[0], a[1]);
  px_error(PX_ERR_INVALID, "no zoo model \"%s\" taking %d arguments", o->model, n);
  return NULL;
}

// Copies tensor `name` out of the data file (its views need not be aligned).
static px_status copy_tensor(const px_safetensors *f, const char *name, px_dtype want, px_tensor *out) {
  const px_named_tensor *nt = px_safetensors_find(f, name);
  if (!nt) return px_error(PX_ERR_NOT_FOUND, "tensor \"%s\" is missing from %s", name, px_safetensors_path(f));
  if (nt->tensor.dtype != want)
    return px_error(PX_ERR_FORMAT, "tensor \"%s\" in %s has dtype %s, expected %s", name, px_safetensors_path(f),
                    px_dtype_name(nt->tensor.dtype), px_dtype_name(want));
  px_status st = px_tensor_new(out, want, nt->tensor.ndim, nt->tensor.shape);
  if (st == PX_OK) memcpy(out->data, nt->tensor.data, px_tensor_nbytes(out));
  return st;
}

static px_status load_batch(const px_safetensors *f, int step, px_tensor *x, px_tensor *y) {
  char xn[32], yn[32];
  snprintf(xn, sizeof xn, "x_%d", step);
  snprintf(yn, sizeof yn, "y_%d", step);
  *x = (px_tensor){0};
  *y = (px_tensor){0};
  px_status st = copy_tensor(f, xn, PX_F32, x);
  if (st == PX_OK) st = copy_tensor(f, yn, PX_I32, y);
  if (st == PX_OK && (x->ndim < 1 || y->ndim != 1 || y->shape[0] != x->shape[0]))
    st = px_error(PX_ERR_SHAPE, "step %d: %s and %s do not hold one class per sample", step, xn, yn);
  return st;
}

// ---- Recording ReLU and max-pool decisions --------------------------------

typedef struct recorder {
  px_module base; /* one child: the ReLU or max-pool, named "" */
  bool is_pool;
  int k, s, p; /* the pool's window, stride, padding */
} recorder;

static struct {
  px_tensor *items; /* owned copies, in call order */
  int *steps;       /* the step of each */
  int count, cap;
  int step; /* the training step running now; -1: record nothing */
} rec = {.step = -1};

static px_status rec_push(px_tensor *t) {
  if (rec.count == rec.cap) {
    int cap = rec.cap ? 2 * rec.cap : 64;
    px_tensor *items = realloc(rec.items, (size_t)cap * sizeof *items);
    if (items) rec.items = items;
    int *steps = realloc(rec.steps, (size_t)cap * sizeof *steps);
    if (steps) rec.steps = steps;
    if (!items || !steps) {
      px_tensor_free(t);
      return px_error(PX_ERR_NOMEM, "recorder: out of memory");
    }
    rec.cap = cap;
  }
  rec.steps[rec.count] = rec.step;
  rec.items[rec.count++] = *t;
  return PX_OK;
}

// argmax (N, C, H', W') of a pool given its input x (N, C, H, W) and output
// y: the first pixel of each (clipped) window, in scan order, equal to y.
static px_status pool_argmax(const recorder *r, const px_tensor *x, const px_tensor *y, int32_t *A) {
  const int64_t planes = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
  const int64_t Ho = y->shape[2], Wo = y->shape[3];
  const float *X = px_f32(x), *Y = px_f32(y);
  for (int64_t pl = 0; pl < planes; pl++)
    for (int64_t oh = 0; oh < Ho; oh++)
      for (int64_t ow = 0; ow < Wo; ow++) {
        const float v = Y[(pl * Ho + oh) * Wo + ow];
        int32_t at = -1;
        for (int i = 0; i < r->k && at < 0; i++)
          for (int j = 0; j < r->k && at < 0; j++) {
            const int64_t h = oh * r->s - r->p + i, w = ow * r->s - r->p + j;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            const float u = X[pl * H * W + h * W + w];
            if (u == v || (u != u && v != v)) at = (int32_t)(h * W + w);
          }
        if (at < 0)
          return px_error(PX_ERR_INVALID,
                          "recorder: max-pool output [%lld, %lld] of plane %lld is in none of "
                          "the pixels of its %dx%d window (stride %d, padding %d): the pool is not the one the "
                          "model should have",
                          (long long)oh, (long long)ow, (long long)pl, r->k, r->k, r->s, r->p);
        A[(pl * Ho + oh) * Wo + ow] = at;
      }
  return PX_OK;
}

static px_status recorder_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  recorder *r = (recorder *)m;
  px_status st = px_module_forward(m->children[0], ctx, x, y);
  if (st != PX_OK || !ctx->training || rec.step < 0) return st;
  px_tensor d;
  if ((st = px_tensor_new(&d, r->is_pool ? PX_I32 : PX_U8, y->ndim, y->shape)) != PX_OK) return st;
  if (r->is_pool) {
    if ((st = pool_argmax(r, x, y, (int32_t *)d.data)) != PX_OK) {
      px_tensor_free(&d);
      return st;
    }
  } else {
    const float *Y = px_f32(y);
    uint8_t *D = d.data;
    for (int64_t i = 0; i < px_tensor_numel(y); i++) D[i] = Y[i] > 0.0f;
  }
  return rec_push(&d);
}

static px_status recorder_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  return px_module_backward(m->children[0], ctx, dy, dx);
}

static const px_module_ops recorder_ops = {
  .type = "DecisionRecorder",
  .forward = recorder_forward,
  .backward = recorder_backward,
};

// Puts a recorder around every ReLU and MaxPool2d under m; pools have the
// window (k, s, p).  The recorder takes the module's place and name.
static px_status wrap_decisions(px_module *m, int k, int s, int p) {
  for (int i = 0; i < m->n_children; i++) {
    px_module *c = m->children[i];
    const bool relu = strcmp(c->ops->type, "ReLU") == 0, pool = strcmp(c->ops->type, "MaxPool2d") == 0;
    if (!relu && !pool) {
      px_status st = wrap_decisions(c, k, s, p);
      if (st != PX_OK) return st;
      continue;
    }
    recorder *r = (recorder *)px_module_alloc(sizeof *r, &recorder_ops);
    if (!r) return PX_ERR_NOMEM;
    r->is_pool = pool;
    r->k = k;
    r->s = s;
    r->p = p;
    memcpy(r->base.name, c->name, sizeof r->base.name);
    c->parent = NULL;
    if (px_module_add_child(&r->base, "", c) != PX_OK) {
      c->parent = m;
      px_module_free(&r->base);
      return PX_ERR_NOMEM;
    }
    r->base.parent = m;
    m->children[i] = &r->base;
  }
  return PX_OK;
}

static px_module *find_dropout(const px_model *model) {
  for (int i = 0; i < model->n_modules; i++)
    if (strcmp(model->modules[i]->ops->type, "Dropout") == 0) return model->modules[i];
  return NULL;
}

// What the dropout of this step multiplied by: its forward, run again in the
// same step (same mask) on ones.  (B, CNN_HIDDEN) into `mask`.
static px_status dropout_mask(px_model *model, px_module *d, int64_t B, float *ones, float *mask) {
  px_tensor in = px_tensor_f32(ones, 2, B, CNN_HIDDEN, 0, 0), out;
  px_status st = d->ops->forward(d, &model->ctx, &in, &out);
  if (st == PX_OK) memcpy(mask, out.data, (size_t)B * CNN_HIDDEN * sizeof *mask);
  return st;
}

// Step s: forward (train mode), loss, backward, SGD.  Keeps step 0's
// logits and gradients, and each step's dropout multiplier.
static px_status train_step(px_model *model, px_optim *opt, const px_tensor *x, const int32_t *y, int s, float *loss,
                            float *logits0, float *grad0, px_module *drop, float *ones, float *mask) {
  px_model_zero_grad(model);
  px_tensor out;
  px_status st = px_model_forward(model, x, &out);
  if (st != PX_OK) return px_error_wrap(st, "forward of step %d", s);
  const size_t n_out = (size_t)px_tensor_numel(&out);
  if (s == 0) memcpy(logits0, out.data, n_out * sizeof *logits0);
  if (drop && (st = dropout_mask(model, drop, x->shape[0], ones, mask)) != PX_OK) return st;
  px_tensor dout = out;
  dout.data = px_model_scratch(model, n_out);
  if (!dout.data) return px_error(PX_ERR_NOMEM, "no memory for the loss gradient");
  px_ce_opts ce = PX_CE_DEFAULTS;
  if ((st = px_cross_entropy_loss(&out, y, &ce, loss, px_f32(&dout))) != PX_OK)
    return px_error_wrap(st, "loss of step %d", s);
  if ((st = px_model_backward(model, &dout, NULL)) != PX_OK) return px_error_wrap(st, "backward of step %d", s);
  if (s == 0) memcpy(grad0, model->grad_data, model->n_param_elems * sizeof *grad0);
  if ((st = px_optim_step(opt)) != PX_OK) return px_error_wrap(st, "SGD step %d", s);
  return PX_OK;
}

static void add_item(px_state_dict *sd, const char *name, px_tensor t) {
  px_named_tensor *it = &sd->items[sd->count++];
  snprintf(it->name, sizeof it->name, "%s", name);
  it->tensor = t;
}

int main(int argc, char **argv) {
  run_opts o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;

  px_model *model = NULL;
  px_module *root = build(&o);
  // The max-pools of the zoo: resnet18's stem 3/2 pad 1, the cnn's 2/2.
  const bool resnet18 = strcmp(o.model, "resnet18") == 0;
  if (root && wrap_decisions(root, resnet18 ? 3 : 2, 2, resnet18 ? 1 : 0) != PX_OK) {
    px_module_free(root);
    root = NULL;
  }
  if (px_model_create(&model, root, /*seed=*/0) != PX_OK) return fail("building the model");
  px_state_dict sd = {0};
  px_safetensors *data = NULL;
  px_optim *opt = NULL;
  px_tensor x = {0}, y = {0};
  const int S = o.steps;
  // Results: (B, K) eval and train logits, S losses, step 0's gradients, S dropout masks.
  float *eval_logits = NULL, *train_logits = NULL, *losses = calloc((size_t)S, sizeof(float));
  float *grad0 = malloc((model->n_param_elems + 1) * sizeof(float)), *masks = NULL, *ones = NULL;
  px_module *drop = find_dropout(model);
  int64_t B = 0, K = 0;
  px_status st = losses && grad0 ? PX_OK : px_error(PX_ERR_NOMEM, "out of memory");
  if (st == PX_OK && (st = px_model_state_dict(model, &sd)) != PX_OK) rc = fail("state dict");
  if (st == PX_OK && (st = px_safetensors_load(o.init_path, &sd, /*strict=*/true)) != PX_OK)
    rc = fail("loading the weights");
  if (st == PX_OK && (st = px_safetensors_open(o.data_path, &data)) != PX_OK) rc = fail("opening the batches");

  // Eval mode on x_0: running statistics, no dropout.
  if (st == PX_OK && (st = load_batch(data, 0, &x, &y)) != PX_OK) rc = fail("reading batch 0");
  if (st == PX_OK) {
    px_tensor out;
    px_model_train(model, false);
    if ((st = px_model_forward(model, &x, &out)) != PX_OK) {
      rc = fail("eval forward");
    } else {
      B = out.shape[0];
      K = out.shape[out.ndim - 1];
      eval_logits = malloc((size_t)(B * K) * sizeof(float));
      train_logits = malloc((size_t)(B * K) * sizeof(float));
      masks = drop ? malloc((size_t)(S * B * CNN_HIDDEN) * sizeof(float)) : NULL;
      ones = drop ? malloc((size_t)(B * CNN_HIDDEN) * sizeof(float)) : NULL;
      if (!eval_logits || !train_logits || (drop && (!masks || !ones))) {
        st = px_error(PX_ERR_NOMEM, "out of memory");
        rc = fail("results");
      } else {
        memcpy(eval_logits, out.data, (size_t)(B * K) * sizeof(float));
        for (int64_t i = 0; drop && i < B * CNN_HIDDEN; i++) ones[i] = 1.0f;
      }
    }
    px_model_train(model, true);
  }

  px_optim_opts oo = px_sgd_defaults(o.lr);
  oo.momentum = o.momentum;
  oo.weight_decay = o.weight_decay;
  if (st == PX_OK && (st = px_optim_create(&opt, model->param_data, model->grad_data, model->n_param_elems, &oo)))
    rc = fail("optimizer");
  for (int s = 0; st == PX_OK && s < S; s++) {
    if (s > 0) {
      px_tensor_free(&x);
      px_tensor_free(&y);
      if ((st = load_batch(data, s, &x, &y)) != PX_OK) {
        rc = fail("reading a batch");
        break;
      }
    }
    if (x.shape[0] != B) {
      st = px_error(PX_ERR_SHAPE, "batch %d has %lld samples, batch 0 had %lld", s, (long long)x.shape[0],
                    (long long)B);
      rc = fail("reading a batch");
      break;
    }
    rec.step = s;
    st = train_step(model, opt, &x, (const int32_t *)y.data, s, &losses[s], train_logits, grad0, drop, ones,
                    drop ? masks + (size_t)s * B * CNN_HIDDEN : NULL);
    rec.step = -1;
    if (st != PX_OK) rc = fail("training");
  }

  if (st == PX_OK) {
    // The final state dict plus the records, in one file.
    px_state_dict all = {calloc((size_t)(sd.count + model->n_params + S + 3 + rec.count), sizeof(px_named_tensor)), 0};
    if (!all.items) {
      px_error(PX_ERR_NOMEM, "out of memory");
      rc = fail("writing the results");
    } else {
      add_item(&all, "eval_logits", px_tensor_f32(eval_logits, 2, B, K, 0, 0));
      add_item(&all, "train_logits", px_tensor_f32(train_logits, 2, B, K, 0, 0));
      add_item(&all, "losses", px_tensor_f32(losses, 1, S, 0, 0, 0));
      for (int k = 0; k < model->n_params; k++) {
        const px_param *p = model->params[k];
        char name[PX_NAME_MAX + 8];
        snprintf(name, sizeof name, "grad0.%s", p->name);
        add_item(&all, name, px_tensor_view(grad0 + p->offset, PX_F32, p->ndim, p->shape));
      }
      for (int s = 0; drop && s < S; s++) {
        char name[32];
        snprintf(name, sizeof name, "dropout_%d", s);
        add_item(&all, name, px_tensor_f32(masks + (size_t)s * B * CNN_HIDDEN, 2, B, CNN_HIDDEN, 0, 0));
      }
      for (int i = 0, k = 0; i < rec.count; i++, k++) {
        char name[48];
        if (i > 0 && rec.steps[i] != rec.steps[i - 1]) k = 0;
        snprintf(name, sizeof name, "decision_%d_%d", rec.steps[i], k);
        add_item(&all, name, rec.items[i]);
      }
      for (int i = 0; i < sd.count; i++) add_item(&all, sd.items[i].name, sd.items[i].tensor);
      px_kv meta[2] = {{"model", o.model}, {"producer", "plexus zoo_runner"}};
      if (px_safetensors_save(o.out_path, &all, meta, 2) != PX_OK) rc = fail("writing the results");
      px_state_dict_free(&all);
    }
  }
  for (int i = 0; i < rec.count; i++) px_tensor_free(&rec.items[i]);
  free(rec.items);
  free(rec.steps);
  px_tensor_free(&x);
  px_tensor_free(&y);
  free(eval_logits);
  free(train_logits);
  free(losses);
  free(grad0);
  free(masks);
  free(ones);
  px_optim_free(opt);
  px_safetensors_close(data);
  px_state_dict_free(&sd);
  px_model_free(model);
  return rc;
}
