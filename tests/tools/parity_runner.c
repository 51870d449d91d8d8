/* parity_runner — the plexus half of tests/test_parity_with_pytorch.py.
 *
 * Builds one of the parity models, loads its initial weights (and batchnorm
 * buffers) from a safetensors file written by PyTorch, trains it for a few
 * steps on the batches of a second safetensors file, and writes the losses
 * and the final state dict for the Python side to compare:
 *
 *   parity_runner --model mlp|mlp_cls|cnn --optim sgd|adam|adamw
 *                 --init init.st --data data.st --steps 20 --out out.st
 *                 [--lr 0.05] [--momentum 0.9] [--dampening 0] [--nesterov]
 *                 [--weight-decay 1e-4] [--beta1 0.9 --beta2 0.999 --eps 1e-8]
 *                 [--label-smoothing 0.1]
 *                 [--schedule constant|cosine --warmup 5 --total 20 --min-lr 0]
 *                 [--clip 1.0]
 *
 *   data.st:  x_0 .. x_{S-1}  F32 model inputs: mlp (B,1), mlp_cls (B,20),
 *                             cnn (B,1,28,28)
 *             y_0 .. y_{S-1}  mlp: F32 (B,1) regression targets (MSE loss);
 *                             mlp_cls, cnn: I32 (B,) class ids (cross-entropy)
 *   out.st:   every tensor of px_model_state_dict (parameters and buffers)
 *             plus losses (S,), lrs (S,) (the lr each step used) and
 *             grad_norms (S,) (global L2 norm of the gradient before any
 *             clipping), all F32, and "grad0.<param>": each parameter's
 *             gradient of the first step (before clipping), which points at
 *             the layer whose backward differs when the losses do.
 *
 * One step is what torch does in `zero_grad; loss = f(model(x), y);
 * loss.backward(); clip_grad_norm_; opt.step()` with the model in train mode.
 * Any failure prints px_last_error() and exits 1; a bad command line exits 2. */
#include <plexus/plexus.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum model_kind { MODEL_MLP, MODEL_MLP_CLS, MODEL_CNN } model_kind;

typedef struct run_opts {
  model_kind model;
  const char *model_name;
  px_optim_opts optim;
  const char *init_path, *data_path, *out_path;
  int steps;
  float label_smoothing;
  px_lr_schedule schedule;
  float clip; /* 0 = no clipping */
} run_opts;

static int fail(const char *what) {
  fprintf(stderr, "parity_runner: %s: %s\n", what, px_last_error());
  return 1;
}

static int usage(const char *why) {
  fprintf(stderr,
          "parity_runner: %s\n"
          "usage: parity_runner --model mlp|mlp_cls|cnn --optim sgd|adam|adamw --init FILE --data FILE\n"
          "                     --steps N --out FILE [--lr F] [--momentum F] [--dampening F] [--nesterov]\n"
          "                     [--weight-decay F] [--beta1 F] [--beta2 F] [--eps F] [--label-smoothing F]\n"
          "                     [--schedule constant|cosine] [--warmup N] [--total N] [--min-lr F] [--clip F]\n",
          why);
  return 2;
}

static bool parse_float(const char *s, float *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end) return false;
  *out = (float)v;
  return true;
}

static bool parse_int(const char *s, int64_t *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end) return false;
  *out = (int64_t)v;
  return true;
}

/* Numeric optimizer flags override the defaults of --optim's kind, in
 * whatever order they come; NAN marks "not given". */
typedef struct optim_flags {
  float lr, momentum, dampening, weight_decay, beta1, beta2, eps;
  bool nesterov;
} optim_flags;

static void apply_flag(float *field, float flag) {
  if (!isnan(flag)) *field = flag;
}

static int parse_args(int argc, char **argv, run_opts *o) {
  memset(o, 0, sizeof *o);
  o->steps = 20;
  o->schedule.kind = PX_LR_CONSTANT;
  optim_flags fl = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, false};
  const char *optim_name = NULL;
  struct {
    const char *flag;
    float *dst;
  } floats[] = {
    {"--lr", &fl.lr},
    {"--momentum", &fl.momentum},
    {"--dampening", &fl.dampening},
    {"--weight-decay", &fl.weight_decay},
    {"--beta1", &fl.beta1},
    {"--beta2", &fl.beta2},
    {"--eps", &fl.eps},
    {"--label-smoothing", &o->label_smoothing},
    {"--clip", &o->clip},
    {"--min-lr", &o->schedule.min_lr},
  };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--nesterov") == 0) {
      fl.nesterov = true;
      continue;
    }
    if (i + 1 >= argc) return usage("every option but --nesterov takes a value");
    const char *v = argv[++i];
    int64_t n;
    bool known = false;
    for (size_t k = 0; k < sizeof floats / sizeof *floats; k++) {
      if (strcmp(a, floats[k].flag) != 0) continue;
      if (!parse_float(v, floats[k].dst)) return usage("a numeric option has a value that is not a number");
      known = true;
    }
    if (known) continue;
    if (strcmp(a, "--model") == 0) {
      o->model_name = v;
      if (strcmp(v, "mlp") == 0) o->model = MODEL_MLP;
      else if (strcmp(v, "mlp_cls") == 0) o->model = MODEL_MLP_CLS;
      else if (strcmp(v, "cnn") == 0) o->model = MODEL_CNN;
      else return usage("--model must be mlp, mlp_cls or cnn");
    } else if (strcmp(a, "--optim") == 0) {
      optim_name = v;
    } else if (strcmp(a, "--init") == 0) {
      o->init_path = v;
    } else if (strcmp(a, "--data") == 0) {
      o->data_path = v;
    } else if (strcmp(a, "--out") == 0) {
      o->out_path = v;
    } else if (strcmp(a, "--steps") == 0) {
      if (!parse_int(v, &n) || n < 1 || n > 100000) return usage("--steps must be a positive integer");
      o->steps = (int)n;
    } else if (strcmp(a, "--warmup") == 0) {
      if (!parse_int(v, &n) || n < 0) return usage("--warmup takes a non-negative integer");
      o->schedule.warmup_steps = n;
    } else if (strcmp(a, "--total") == 0) {
      if (!parse_int(v, &n) || n < 0) return usage("--total takes a non-negative integer");
      o->schedule.total_steps = n;
    } else if (strcmp(a, "--schedule") == 0) {
      if (strcmp(v, "constant") == 0) o->schedule.kind = PX_LR_CONSTANT;
      else if (strcmp(v, "cosine") == 0) o->schedule.kind = PX_LR_COSINE;
      else return usage("--schedule must be constant or cosine");
    } else {
      fprintf(stderr, "parity_runner: unknown option %s\n", a);
      return usage("unknown option");
    }
  }
  if (!o->model_name) return usage("--model is required");
  if (!optim_name) return usage("--optim is required");
  if (!o->init_path || !o->data_path || !o->out_path) return usage("--init, --data and --out are required");
  if (strcmp(optim_name, "sgd") == 0) o->optim = px_sgd_defaults(0.01f);
  else if (strcmp(optim_name, "adam") == 0) o->optim = px_adam_defaults(1e-3f);
  else if (strcmp(optim_name, "adamw") == 0) o->optim = px_adamw_defaults(1e-3f);
  else return usage("--optim must be sgd, adam or adamw");
  apply_flag(&o->optim.lr, fl.lr);
  apply_flag(&o->optim.momentum, fl.momentum);
  apply_flag(&o->optim.dampening, fl.dampening);
  apply_flag(&o->optim.weight_decay, fl.weight_decay);
  apply_flag(&o->optim.beta1, fl.beta1);
  apply_flag(&o->optim.beta2, fl.beta2);
  apply_flag(&o->optim.eps, fl.eps);
  o->optim.nesterov = fl.nesterov;
  o->schedule.base_lr = o->optim.lr;
  if (o->schedule.kind == PX_LR_COSINE && o->schedule.total_steps == 0) o->schedule.total_steps = o->steps;
  return 0;
}

/* The PyTorch models of test_parity_with_pytorch.py, child for child, so the
 * state_dict names ("0.weight", "1.running_mean", ...) match. */
static px_module *build_model(model_kind kind) {
  switch (kind) {
  case MODEL_MLP:  // the quick start: 1 -> 256 -> 512 -> 256 -> 1, tanh
    return px_chain_of(7, px_linear(1, 256, true), px_tanh(), px_linear(256, 512, true), px_tanh(),
                       px_linear(512, 256, true), px_tanh(), px_linear(256, 1, true));
  case MODEL_MLP_CLS:  // 20 -> 64 -> 64 -> 5 classes, relu then exact gelu
    return px_chain_of(5, px_linear(20, 64, true), px_relu(), px_linear(64, 64, true), px_gelu(false),
                       px_linear(64, 5, true));
  case MODEL_CNN:  // (B,1,28,28) -> (B,8,14,14) -> (B,16,7,7) -> 784 -> 10
    return px_chain_of(10, px_conv2d(1, 8, 3, 1, 1, false), px_batchnorm(8, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                       px_conv2d(8, 16, 3, 1, 1, false), px_batchnorm(16, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                       px_flatten(), px_linear(16 * 7 * 7, 10, true));
  }
  return NULL;
}

/* One batch, copied out of the data file (its views need not be aligned). */
typedef struct batch {
  px_tensor x; /* F32, owned */
  px_tensor y; /* F32 (mlp) or I32 (classifiers), owned */
} batch;

static void batch_free(batch *b) {
  px_tensor_free(&b->x);
  px_tensor_free(&b->y);
}

static px_status copy_tensor(const px_safetensors *f, const char *name, px_dtype want, px_tensor *out) {
  const px_named_tensor *nt = px_safetensors_find(f, name);
  if (!nt) return px_error(PX_ERR_NOT_FOUND, "tensor \"%s\" is missing from %s", name, px_safetensors_path(f));
  if (nt->tensor.dtype != want)
    return px_error(PX_ERR_FORMAT, "tensor \"%s\" in %s has dtype %s, expected %s", name, px_safetensors_path(f),
                    px_dtype_name(nt->tensor.dtype), px_dtype_name(want));
  px_status st = px_tensor_new(out, want, nt->tensor.ndim, nt->tensor.shape);
  if (st != PX_OK) return st;
  memcpy(out->data, nt->tensor.data, px_tensor_nbytes(out));
  return PX_OK;
}

static px_status load_batch(const px_safetensors *f, int step, bool classify, batch *b) {
  char xn[32], yn[32];
  snprintf(xn, sizeof xn, "x_%d", step);
  snprintf(yn, sizeof yn, "y_%d", step);
  memset(b, 0, sizeof *b);
  px_status st = copy_tensor(f, xn, PX_F32, &b->x);
  if (st == PX_OK) st = copy_tensor(f, yn, classify ? PX_I32 : PX_F32, &b->y);
  if (st != PX_OK) batch_free(b);
  return st;
}

/* One training step.  Out: *loss, the *lr it used, the gradient's global
 * L2 norm before clipping (*norm) and, if grads_out is not NULL, a copy of
 * the gradient before clipping (n_param_elems,). */
static px_status train_step(px_model *model, px_optim *opt, const run_opts *o, const batch *b, int64_t step,
                            float *loss, float *lr, float *norm, float *grads_out) {
  px_model_zero_grad(model);
  px_tensor out;
  px_status st = px_model_forward(model, &b->x, &out);
  if (st != PX_OK) return px_error_wrap(st, "forward of step %lld", (long long)step);
  // ∂loss/∂out lives in the step arena, like every activation.
  px_tensor dout = out;
  dout.data = px_model_scratch(model, (size_t)px_tensor_numel(&out));
  if (!dout.data) return px_error(PX_ERR_NOMEM, "no memory for the loss gradient");
  if (o->model == MODEL_MLP) {
    st = px_mse_loss(&out, &b->y, loss, px_f32(&dout));
  } else {
    if (px_tensor_numel(&b->y) * out.shape[out.ndim - 1] != px_tensor_numel(&out))
      return px_error(PX_ERR_SHAPE, "step %lld: %lld targets for %lld rows of logits", (long long)step,
                      (long long)px_tensor_numel(&b->y), (long long)(px_tensor_numel(&out) / out.shape[out.ndim - 1]));
    px_ce_opts ce = PX_CE_DEFAULTS;
    ce.label_smoothing = o->label_smoothing;
    st = px_cross_entropy_loss(&out, (const int32_t *)b->y.data, &ce, loss, px_f32(&dout));
  }
  if (st != PX_OK) return px_error_wrap(st, "loss of step %lld", (long long)step);
  st = px_model_backward(model, &dout, NULL);
  if (st != PX_OK) return px_error_wrap(st, "backward of step %lld", (long long)step);
  if (grads_out) px_copy(grads_out, model->grad_data, model->n_param_elems);
  if (o->clip > 0.0f) *norm = px_clip_grad_norm(model->grad_data, model->n_param_elems, o->clip);
  else *norm = (float)sqrt(px_sumsq(model->grad_data, model->n_param_elems));
  *lr = px_lr_at(&o->schedule, step);
  px_optim_set_lr(opt, *lr);
  st = px_optim_step(opt);
  if (st != PX_OK) return px_error_wrap(st, "optimizer step %lld", (long long)step);
  return PX_OK;
}

int main(int argc, char **argv) {
  run_opts o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;

  px_model *model = NULL;
  if (px_model_create(&model, build_model(o.model), /*seed=*/0) != PX_OK) return fail("building the model");
  px_model_train(model, true);

  // Initial weights and buffers from PyTorch, all or nothing, strict names.
  px_state_dict sd = {0};
  if (px_model_state_dict(model, &sd) != PX_OK) {
    px_model_free(model);
    return fail("state dict");
  }
  if (px_safetensors_load(o.init_path, &sd, /*strict=*/true) != PX_OK) {
    px_state_dict_free(&sd);
    px_model_free(model);
    return fail("loading the initial weights");
  }

  px_safetensors *data = NULL;
  if (px_safetensors_open(o.data_path, &data) != PX_OK) {
    px_state_dict_free(&sd);
    px_model_free(model);
    return fail("opening the batches");
  }

  px_optim *opt = NULL;
  float *grad0 = malloc((model->n_param_elems ? model->n_param_elems : 1) * sizeof *grad0);  // (n_param_elems,)
  float *record = calloc((size_t)3 * (size_t)o.steps, sizeof *record);
  float *losses = record, *lrs = record + o.steps, *norms = record + 2 * o.steps;  // each (steps,)
  px_status st = record && grad0 ? PX_OK : px_error(PX_ERR_NOMEM, "no memory for %d steps of records", o.steps);
  if (st == PX_OK) st = px_optim_create(&opt, model->param_data, model->grad_data, model->n_param_elems, &o.optim);
  for (int s = 0; st == PX_OK && s < o.steps; s++) {
    batch b;
    st = load_batch(data, s, o.model != MODEL_MLP, &b);
    if (st != PX_OK) break;
    st = train_step(model, opt, &o, &b, s, &losses[s], &lrs[s], &norms[s], s == 0 ? grad0 : NULL);
    batch_free(&b);
  }
  if (st != PX_OK) {
    rc = fail("training");
  } else {
    // The final state dict plus the per-step records, in one file.
    px_state_dict all = {calloc((size_t)sd.count + (size_t)model->n_params + 3, sizeof(px_named_tensor)), 0};
    if (!all.items) {
      px_error(PX_ERR_NOMEM, "no memory for a state dict of %d tensors", sd.count + model->n_params + 3);
      rc = fail("writing the results");
    } else {
      memcpy(all.items, sd.items, (size_t)sd.count * sizeof(px_named_tensor));
      all.count = sd.count;
      const char *names[3] = {"losses", "lrs", "grad_norms"};
      float *vals[3] = {losses, lrs, norms};
      for (int k = 0; k < 3; k++) {
        px_named_tensor *it = &all.items[all.count++];
        snprintf(it->name, sizeof it->name, "%s", names[k]);
        it->tensor = px_tensor_f32(vals[k], 1, o.steps, 0, 0, 0);
      }
      for (int k = 0; k < model->n_params; k++) {
        const px_param *p = model->params[k];
        px_named_tensor *it = &all.items[all.count++];
        char name[PX_NAME_MAX + 8];
        size_t len = (size_t)snprintf(name, sizeof name, "grad0.%s", p->name);
        if (len >= sizeof it->name) len = sizeof it->name - 1;  // names here are short; never in practice
        memcpy(it->name, name, len);
        it->name[len] = '\0';
        it->tensor = px_tensor_view(grad0 + p->offset, PX_F32, p->ndim, p->shape);
      }
      px_kv meta[2] = {{"model", o.model_name}, {"producer", "plexus parity_runner"}};
      if (px_safetensors_save(o.out_path, &all, meta, 2) != PX_OK) rc = fail("writing the results");
      px_state_dict_free(&all);
    }
  }
  free(record);
  free(grad0);
  px_optim_free(opt);
  px_safetensors_close(data);
  px_state_dict_free(&sd);
  px_model_free(model);
  return rc;
}
