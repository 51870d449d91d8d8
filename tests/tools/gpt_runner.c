/* gpt_runner — the plexus half of tests/test_gpt_matches_pytorch.py.
 *
 * Builds the zoo's GPT, loads its weights, writes the logits of the first
 * batch, trains it with AdamW and writes the per-step losses and the final
 * weights for the Python side to compare:
 *
 *   gpt_runner --vocab V --context T --layers L --heads H --embd C
 *              --init FILE [--hf] --data FILE --steps S --out FILE
 *              [--lr 1e-3] [--weight-decay 0.01] [--dropout 0]
 *
 *   --init FILE   weights: a state dict with plexus's names, loaded strictly
 *                 (px_safetensors_load), or with --hf a Hugging Face GPT-2
 *                 file loaded by px_zoo_gpt_load_hf
 *   data FILE     x_0 .. x_{S-1}  I32 (B, T) token ids
 *                 y_0 .. y_{S-1}  I32 (B, T) next-token targets
 *                 (with --steps 0, only x_0 is needed)
 *   out FILE      logits0 (B, T, V): logits of x_0 before any step;
 *                 losses (S,); grad0.<param>: gradients of the first step;
 *                 every parameter after S steps.  All F32.
 *
 * One step is torch's `zero_grad; loss = cross_entropy(model(x).view(-1, V),
 * y.view(-1)); loss.backward(); opt.step()` in train mode.  A failure prints
 * px_last_error() and exits 1; a bad command line exits 2. */
#include <plexus/plexus.h>

#include <plexus/zoo.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_opts {
  px_gpt_config cfg;
  const char *init_path, *data_path, *out_path;
  bool hf;
  int steps;
  float lr, weight_decay;
} run_opts;

static int fail(const char *what) {
  fprintf(stderr, "gpt_runner: %s: %s\n", what, px_last_error());
  return 1;
}

static int usage(const char *why) {
  fprintf(stderr,
          "gpt_runner: %s\n"
          "usage: gpt_runner --vocab V --context T --layers L --heads H --embd C --init FILE [--hf]\n"
          "                  --data FILE --steps S --out FILE [--lr F] [--weight-decay F] [--dropout F]\n",
          why);
  return 2;
}

static int parse_args(int argc, char **argv, run_opts *o) {
  memset(o, 0, sizeof *o);
  o->lr = 1e-3f;
  o->weight_decay = 0.01f;
  o->steps = -1;
  struct {
    const char *flag;
    int *dst;
  } ints[] = {
    {"--vocab", &o->cfg.vocab_size}, {"--context", &o->cfg.context}, {"--layers", &o->cfg.n_layer},
    {"--heads", &o->cfg.n_head},     {"--embd", &o->cfg.n_embd},     {"--steps", &o->steps},
  };
  struct {
    const char *flag;
    float *dst;
  } floats[] = {
    {"--lr", &o->lr},
    {"--weight-decay", &o->weight_decay},
    {"--dropout", &o->cfg.dropout},
  };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--hf") == 0) {
      o->hf = true;
      continue;
    }
    if (i + 1 >= argc) return usage("every option but --hf takes a value");
    const char *v = argv[++i];
    bool known = false;
    char *end;
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++)
      if (strcmp(a, ints[k].flag) == 0) {
        long n = strtol(v, &end, 10);
        if (end == v || *end || n < 0 || n > 1000000) return usage("an integer option has a bad value");
        *ints[k].dst = (int)n;
        known = true;
      }
    for (size_t k = 0; k < sizeof floats / sizeof *floats; k++)
      if (strcmp(a, floats[k].flag) == 0) {
        *floats[k].dst = strtof(v, &end);
        if (end == v || *end) return usage("a numeric option has a value that is not a number");
        known = true;
      }
    if (known) continue;
    if (strcmp(a, "--init") == 0) o->init_path = v;
    else if (strcmp(a, "--data") == 0) o->data_path = v;
    else if (strcmp(a, "--out") == 0) o->out_path = v;
    else return usage("unknown option");
  }
  if (!o->init_path || !o->data_path || !o->out_path || o->steps < 0)
    return usage("--init, --data, --steps and --out are required");
  return 0;
}

static px_status copy_ids(const px_safetensors *f, const char *name, px_tensor *out) {
  const px_named_tensor *nt = px_safetensors_find(f, name);
  if (!nt) return px_error(PX_ERR_NOT_FOUND, "tensor \"%s\" is missing from %s", name, px_safetensors_path(f));
  if (nt->tensor.dtype != PX_I32 || nt->tensor.ndim != 2)
    return px_error(PX_ERR_FORMAT, "tensor \"%s\" in %s must be I32 (B, T)", name, px_safetensors_path(f));
  px_status st = px_tensor_new(out, PX_I32, 2, nt->tensor.shape);
  if (st == PX_OK) memcpy(out->data, nt->tensor.data, px_tensor_nbytes(out));
  return st;
}

// zero_grad, forward, loss, backward on (x, y); then, if grads_out is not
// NULL, a copy of the gradient; then the AdamW step.
static px_status train_step(px_model *md, px_optim *opt, const px_tensor *x, const px_tensor *y, float *loss,
                            float *grads_out) {
  px_model_zero_grad(md);
  px_tensor logits;
  px_status st = px_model_forward(md, x, &logits);
  if (st != PX_OK) return st;
  px_tensor dlogits = logits;
  dlogits.data = px_model_scratch(md, (size_t)px_tensor_numel(&logits));
  if (!dlogits.data) return PX_ERR_NOMEM;
  st = px_cross_entropy_loss(&logits, (const int32_t *)y->data, NULL, loss, px_f32(&dlogits));
  if (st == PX_OK) st = px_model_backward(md, &dlogits, NULL);
  if (st == PX_OK && grads_out) px_copy(grads_out, md->grad_data, md->n_param_elems);
  if (st == PX_OK) st = px_optim_step(opt);
  return st;
}

int main(int argc, char **argv) {
  run_opts o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;
  px_model *md = NULL;
  if (px_model_create(&md, px_zoo_gpt(&o.cfg), 0) != PX_OK) return fail("building the GPT");
  px_model_train(md, true);
  px_state_dict sd = {0};
  if (px_model_state_dict(md, &sd) != PX_OK) {
    px_model_free(md);
    return fail("state dict");
  }
  px_status st = o.hf ? px_zoo_gpt_load_hf(md, o.init_path) : px_safetensors_load(o.init_path, &sd, true);
  if (st != PX_OK) {
    px_state_dict_free(&sd);
    px_model_free(md);
    return fail("loading the weights");
  }

  px_safetensors *data = NULL;
  if (px_safetensors_open(o.data_path, &data) != PX_OK) {
    px_state_dict_free(&sd);
    px_model_free(md);
    return fail("opening the batches");
  }
  px_optim *opt = NULL;
  px_optim_opts oo = px_adamw_defaults(o.lr);
  oo.weight_decay = o.weight_decay;
  float *losses = calloc((size_t)o.steps + 1, sizeof *losses);  // (S,)
  float *grad0 = calloc(md->n_param_elems, sizeof *grad0);      // (n_param_elems,)
  px_tensor logits0 = {0};
  if (!losses || !grad0) st = px_error(PX_ERR_NOMEM, "out of memory");
  if (st == PX_OK) st = px_optim_create(&opt, md->param_data, md->grad_data, md->n_param_elems, &oo);
  // Logits of x_0 before training (train mode: dropout is 0 in the comparison).
  px_tensor x0 = {0};
  if (st == PX_OK) st = copy_ids(data, "x_0", &x0);
  if (st == PX_OK) {
    px_tensor y;
    st = px_model_forward(md, &x0, &y);
    if (st == PX_OK) st = px_tensor_new(&logits0, PX_F32, y.ndim, y.shape);
    if (st == PX_OK) memcpy(logits0.data, y.data, px_tensor_nbytes(&y));
  }
  px_tensor_free(&x0);
  for (int s = 0; st == PX_OK && s < o.steps; s++) {
    char xn[32], yn[32];
    snprintf(xn, sizeof xn, "x_%d", s);
    snprintf(yn, sizeof yn, "y_%d", s);
    px_tensor x = {0}, y = {0};
    st = copy_ids(data, xn, &x);
    if (st == PX_OK) st = copy_ids(data, yn, &y);
    if (st == PX_OK) st = train_step(md, opt, &x, &y, &losses[s], s == 0 ? grad0 : NULL);
    px_tensor_free(&x);
    px_tensor_free(&y);
    if (st != PX_OK) px_error_wrap(st, "step %d", s);
  }
  if (st != PX_OK) {
    rc = fail("running");
  } else {
    px_state_dict all = {calloc((size_t)sd.count + 2 + (size_t)md->n_params, sizeof(px_named_tensor)), 0};
    if (!all.items) {
      rc = fail("out of memory");
    } else {
      memcpy(all.items, sd.items, (size_t)sd.count * sizeof *sd.items);
      all.count = sd.count;
      px_named_tensor *it = &all.items[all.count++];
      snprintf(it->name, sizeof it->name, "logits0");
      it->tensor = logits0;
      it->tensor.owned = false;
      if (o.steps > 0) {
        it = &all.items[all.count++];
        snprintf(it->name, sizeof it->name, "losses");
        it->tensor = px_tensor_f32(losses, 1, o.steps, 0, 0, 0);
        for (int k = 0; k < md->n_params; k++) {
          const px_param *p = md->params[k];
          it = &all.items[all.count++];
          snprintf(it->name, sizeof it->name, "grad0.%.*s", PX_NAME_MAX - 8, p->name);
          it->tensor = px_tensor_view(grad0 + p->offset, PX_F32, p->ndim, p->shape);
        }
      }
      px_kv meta[1] = {{"producer", "plexus gpt_runner"}};
      if (px_safetensors_save(o.out_path, &all, meta, 1) != PX_OK) rc = fail("writing the results");
      px_state_dict_free(&all);
    }
  }
  px_tensor_free(&logits0);
  free(losses);
  free(grad0);
  px_optim_free(opt);
  px_safetensors_close(data);
  px_state_dict_free(&sd);
  px_model_free(md);
  return rc;
}
