/* Claim: a pipeline run's checkpoint (px_pp_checkpoint_save: every rank its
 * chunks' parameters and optimizer slots as pieces, the tied head's copy of
 * wte.weight not written) loads into a pipeline of any other shape, and a
 * checkpoint of another layout loads into a pipeline, bit for bit:
 *   - an MLP of 14 units (AdamW: two slots) and the tiny GPT with its tied
 *     head on the last stage (SGD with momentum: one slot) train 5 steps at
 *     pp = 2 (1F1B, 4 micro-batches) and save;
 *   - pipelines of p = 1, 3, 4 (1F1B) and p = 2 interleaved (v = 2: another
 *     split), built from another seed, load it: every parameter (the tied
 *     copy included), every optimizer slot and the optimizer's step count
 *     equal the saved run's bitwise;
 *   - p = 4 saves again, p = 2 loads that: equal again;
 *   - a checkpoint written as one process writes it (model.safetensors,
 *     optim.safetensors: plain state dicts, DDP's layout) loads into p = 3;
 *   - a loaded pipeline trains on (one more step runs).
 * Loads refuse an element held by two saved pieces (io.h), so a tied copy
 * written twice would fail every load here.
 * If this fails: a piece's key or box is not the whole model's, the tied
 * copy is written twice or not filled, or optimizer state is keyed by a
 * chunk-local position instead of the parameter's name. */
#define _GNU_SOURCE  // mkdtemp
#include "pp_cases.h"

#include <stdlib.h>

enum { K_STEPS = 5 };

typedef struct truth {
  bool gpt;
  px_model *md;   // the whole model: the saved run's parameters
  px_optim *opt;  // its optimizer: the saved run's slots
  int64_t opt_step;
} truth;

static truth T;
static char root[256];

static ppc_mlp MLP = {.depth = 6, .dropout = 0.0f};

static px_module *build(void) { return T.gpt ? ppg_build(NULL) : ppc_build(&MLP); }
static px_module *build_cb(void *arg) {
  (void)arg;
  return build();
}
static px_optim_opts optim_opts(void) {
  if (!T.gpt) return ppc_optim();
  px_optim_opts oo = px_sgd_defaults(0.1f);
  oo.momentum = 0.9f;
  return oo;
}

// copy: this rank's chunks into T (the tied copy left out); else compare
// them with T bitwise.  Returns the parameters compared.
static int visit(px_pp *pp, bool copy, const char *what) {
  int n = 0;
  for (int c = 0; c < px_pp_n_chunks(pp); c++) {
    px_model *md = px_pp_chunk_model(pp, c);
    px_optim *o = px_pp_chunk_optim(pp, c);
    CHECK(o != NULL && o->n_state == T.opt->n_state, "%s: chunk %d optimizer", what, c);
    if (!o) continue;
    if (!copy)
      CHECK(o->step == T.opt_step, "%s: stage %d optimizer step %lld, saved %lld", what, px_pp_chunk_stage(pp, c),
            (long long)o->step, (long long)T.opt_step);
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i];
      px_param *q = px_model_find(T.md, p->name);
      CHECK(q && q->numel == p->numel, "%s: no \"%s\" in the whole model", what, p->name);
      if (!q) continue;
      if (copy && ppc_is_tied_copy(pp, c, p)) continue;
      for (int k = -1; k < o->n_state; k++) {  // -1: the parameter, else slot k
        const char *slot = "parameter";
        float *mine = k < 0 ? md->param_data + p->offset : px_optim_state_slot(o, k, &slot) + p->offset;
        float *saved = k < 0 ? T.md->param_data + q->offset : px_optim_state_slot(T.opt, k, &slot) + q->offset;
        if (copy) memcpy(saved, mine, p->numel * sizeof(float));
        else
          CHECK(memcmp(saved, mine, p->numel * sizeof(float)) == 0,
                "%s: stage %d \"%s\" (%s) differs from the saved run", what, px_pp_chunk_stage(pp, c), p->name, slot);
      }
      n++;
    }
  }
  return n;
}

typedef struct job {
  int p, v, m;
  uint64_t seed;         // initial weights (the loads must replace them)
  int train;             // steps before anything else
  const char *load;      // checkpoint to load (NULL: none)
  const char *save_dir;  // save here after training/loading (NULL: no)
  bool capture;          // copy the state into T after training
  bool check;            // compare with T after loading
} job;

static void batch(int s, float *xf, int32_t *xi, int32_t *y, px_tensor *x, px_pp_ce_targets *tg, int m) {
  if (T.gpt) {
    ppg_batch(s, xi, y);
    *x = px_tensor_view(xi, PX_I32, 2, (int64_t[]){PPG_B, PPG_T});
    *tg = (px_pp_ce_targets){.targets = y, .rows_per_micro = (PPG_B / m) * PPG_T};
  } else {
    ppc_batch(s, xf, y);
    *x = px_tensor_view(xf, PX_F32, 2, (int64_t[]){PPC_B, PPC_IN});
    *tg = (px_pp_ce_targets){.targets = y, .rows_per_micro = PPC_B / m};
  }
}

static int run(px_comm *c, void *varg) {
  const job *j = varg;
  px_comm_set_timeout(c, 60);
  char what[160];
  snprintf(what, sizeof what, "%s p %d v %d%s%s", T.gpt ? "GPT" : "MLP", j->p, j->v, j->load ? ", loaded " : "",
           j->load ? j->load + strlen(root) : "");
  px_pp_schedule *s;
  CHECK_OK(px_pp_schedule_make(j->v > 1 ? PX_PP_INTERLEAVED : PX_PP_1F1B, j->p, j->m, j->v, &s));
  const px_optim_opts oo = optim_opts();
  px_pp_opts po = {.build = build_cb, .seed = j->seed, .optim = &oo};
  px_pp *pp = NULL;
  CHECK_OK(px_pp_create(&pp, c, s, &po));
  if (!pp) return 1;
  float xf[PPC_B * PPC_IN];
  int32_t xi[PPG_B * PPG_T], y[PPC_B > PPG_B * PPG_T ? PPC_B : PPG_B * PPG_T];
  px_tensor x;
  px_pp_ce_targets tg;
  for (int k = 0; k < j->train; k++) {
    batch(k, xf, xi, y, &x, &tg, j->m);
    CHECK_OK(px_pp_step(pp, &x, px_pp_ce_loss, &tg, NULL));
  }
  if (j->capture) {
    visit(pp, true, what);
    if (px_comm_rank(c) == 0) T.opt_step = px_pp_chunk_optim(pp, 0)->step;
  }
  if (j->load) {
    CHECK_OK(px_pp_checkpoint_load(c, pp, j->load, T.opt_step));
    const int n = visit(pp, false, what);
    CHECK(n > 0, "%s: rank %d compared nothing", what, px_comm_rank(c));
  }
  if (j->save_dir) {  // the saved (or loaded) state, before any further step
    char path[512];
    CHECK_OK(px_pp_checkpoint_save(c, pp, true, true, j->save_dir, K_STEPS, 0, "{\"step\": 5}", path, sizeof path));
  }
  if (j->load) {  // it trains on from there
    batch(K_STEPS, xf, xi, y, &x, &tg, j->m);
    float l = 0;
    CHECK_OK(px_pp_step(pp, &x, px_pp_ce_loss, &tg, &l));
    CHECK(l > 0 && l < 100, "%s: the step after loading has loss %g", what, (double)l);
  }
  px_pp_free(pp);
  px_pp_schedule_free(s);
  return px_test_failures ? 1 : 0;
}

static void one(job j) {
  int code = 0;
  CHECK_OK(px_comm_run(j.p, run, &j, &code));
  CHECK(code == 0, "%s p %d v %d: a rank failed (%d)", T.gpt ? "GPT" : "MLP", j.p, j.v, code);
}

// The saved run's state written as one process writes it: whole tensors in
// model.safetensors and optim.safetensors ("<slot>.<name>").
static void write_single_process(const char *dir) {
  px_state_dict msd, osd = {0};
  CHECK_OK(px_model_state_dict(T.md, &msd));
  osd.items = calloc((size_t)(T.opt->n_state * T.md->n_params), sizeof *osd.items);
  for (int k = 0; k < T.opt->n_state; k++) {
    const char *slot;
    float *base = px_optim_state_slot(T.opt, k, &slot);
    for (int i = 0; i < T.md->n_params; i++) {
      const px_param *p = T.md->params[i];
      px_named_tensor *it = &osd.items[osd.count++];
      CHECK(snprintf(it->name, sizeof it->name, "%s.%s", slot, p->name) < (int)sizeof it->name, "name");
      it->tensor = px_tensor_view(base + p->offset, PX_F32, p->ndim, p->shape);
    }
  }
  const px_ckpt_item items[3] = {{.name = "model.safetensors", .tensors = &msd},
                                 {.name = "optim.safetensors", .tensors = &osd},
                                 {.name = "state.json", .bytes = "{}", .n_bytes = 2}};
  char path[512];
  CHECK_OK(px_checkpoint_write_all(NULL, dir, K_STEPS, items, 3, 0, path, sizeof path));
  px_state_dict_free(&msd);
  px_state_dict_free(&osd);
}

static void one_model(bool gpt) {
  T.gpt = gpt;
  const px_optim_opts oo = optim_opts();
  CHECK_OK(px_model_create(&T.md, build(), 1));
  CHECK_OK(px_optim_create(&T.opt, T.md->param_data, T.md->grad_data, T.md->n_param_elems, &oo));
  char a[300], b[300], d[300], ca[320], cb[320], cd[320];
  snprintf(a, sizeof a, "%s/%s_pp2", root, gpt ? "gpt" : "mlp");
  snprintf(b, sizeof b, "%s/%s_pp4", root, gpt ? "gpt" : "mlp");
  snprintf(d, sizeof d, "%s/%s_one", root, gpt ? "gpt" : "mlp");
  snprintf(ca, sizeof ca, "%s/step_%08d", a, K_STEPS);
  snprintf(cb, sizeof cb, "%s/step_%08d", b, K_STEPS);
  snprintf(cd, sizeof cd, "%s/step_%08d", d, K_STEPS);
  // Train at pp = 2 and save; the saved state into T.
  one((job){.p = 2, .v = 1, .m = 4, .seed = 5, .train = K_STEPS, .save_dir = a, .capture = true});
  CHECK(T.opt_step == K_STEPS, "the saved run's optimizer took %lld steps", (long long)T.opt_step);
  // Every other layout loads it.
  one((job){.p = 1, .v = 1, .m = 4, .seed = 77, .load = ca});
  one((job){.p = 3, .v = 1, .m = 4, .seed = 77, .load = ca});
  one((job){.p = 4, .v = 1, .m = 4, .seed = 77, .load = ca, .save_dir = b});
  one((job){.p = 2, .v = 2, .m = 4, .seed = 77, .load = ca});
  // What pp = 4 saved loads at pp = 2.
  one((job){.p = 2, .v = 1, .m = 4, .seed = 78, .load = cb});
  // The layout one process writes loads into a pipeline.
  write_single_process(d);
  one((job){.p = 3, .v = 1, .m = 4, .seed = 77, .load = cd});
  px_optim_free(T.opt);
  px_model_free(T.md);
  memset(&T, 0, sizeof T);
}

int main(void) {
  (void)ppc_case;  // pp_cases.h's training cases: not this test's
  (void)ppg_case;
  snprintf(root, sizeof root, "/tmp/px_ppckpt_XXXXXX");
  CHECK(mkdtemp(root) != NULL, "mkdtemp");
  one_model(false);
  one_model(true);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  return px_test_finish("test_pp_checkpoint_loads_in_any_layout");
}
