/* pp_cases.h — a pipelined chain model against one process, shared by
 * test_pp_exec_equals_single_process.c (threads) and its _mpi twin.
 *
 * Every pipeline rank builds only its stages (px_pp_create) and, alongside,
 * the whole single-process model of the same seed.  Both train STEPS AdamW
 * steps on the same batches: the pipeline through a schedule's action table
 * with m micro-batches, the reference on the whole batch in one forward.
 * Every step's loss and, at the end, every parameter this rank holds (found
 * in the reference by its whole-model name) must agree to 1e-5 relative
 * (max |a - b| / max(|a|, |b|, rms of the tensor)); the initial parameters
 * must be bit-for-bit the reference's.
 *
 * With dropout > 0 the reference runs the same m micro-batches per step
 * with gradient accumulation (m forwards, each loss gradient scaled by
 * 1/m): a dropout mask is a function of (seed, module stream, training
 * forward count, element index in the forward's input), so the pipeline's
 * micro-batch j of step s must draw the mask of the single process's
 * forward s·m + j + 1 on that micro-batch.  With dropout 0 the reference
 * runs the whole batch in one forward (the stronger claim). */
#ifndef PX_PP_CASES_H
#define PX_PP_CASES_H

#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

enum { PPC_IN = 12, PPC_HIDDEN = 16, PPC_CLASSES = 5, PPC_B = 24, PPC_STEPS = 20 };

typedef struct ppc_mlp {
  int depth;      // hidden layers: 2·depth + 2 units (flatten, Linear/ReLU pairs, the last Linear)
  float dropout;  // > 0: a Dropout unit after every ReLU (3·depth + 2 units)
} ppc_mlp;

// Whether chunk c's parameter p is the tied head's copy (checkpoints do not save
// it: the embedding's stage writes the weight).
static inline bool ppc_is_tied_copy(px_pp *pp, int c, const px_param *p) {
  const px_pp_plan *plan = px_pp_plan_of(pp);
  if (plan->tied_head_unit < 0 || strcmp(p->name, plan->tied_param) != 0) return false;
  const int head = px_pp_plan_stage_of(plan, plan->tied_head_unit);
  const int emb = px_pp_plan_stage_of(plan, plan->tied_emb_unit);
  return head != emb && px_pp_chunk_stage(pp, c) == head;
}

static px_module *ppc_build(void *arg) {
  const ppc_mlp *a = arg;
  if (a->dropout <= 0) return px_zoo_mlp(PPC_IN, PPC_HIDDEN, a->depth, PPC_CLASSES);
  px_module *m = px_chain();
  bool ok = m && px_chain_add_named(m, "flatten", px_flatten()) == PX_OK;
  int index = 0, width = PPC_IN;
  char name[16];
  for (int d = 0; ok && d <= a->depth; d++) {
    const bool last = d == a->depth;
    snprintf(name, sizeof name, "%d", index++);
    ok = px_chain_add_named(m, name, px_linear(width, last ? PPC_CLASSES : PPC_HIDDEN, true)) == PX_OK;
    width = PPC_HIDDEN;
    if (last || !ok) break;
    snprintf(name, sizeof name, "%d", index++);
    ok = px_chain_add_named(m, name, px_relu()) == PX_OK;
    snprintf(name, sizeof name, "%d", index++);
    ok = ok && px_chain_add_named(m, name, px_dropout(a->dropout)) == PX_OK;
  }
  if (!ok) {
    px_module_free(m);
    return NULL;
  }
  return m;
}

/* One single-process step on x (rows × …) as m micro-batches of rows/m
 * with gradient accumulation: gradients zeroed, then per micro-batch a
 * forward, the cross-entropy against its targets (tpm targets each), the
 * loss gradient scaled by 1/m and a backward.  *loss: the micro-batch
 * losses' mean.  m = 1: the whole batch in one forward. */
static void ppc_ref_step(px_model *ref, const px_tensor *x, const int32_t *targets, int64_t tpm, int m, float *loss) {
  px_model_zero_grad(ref);
  const int64_t rows = x->shape[0] / m;
  const size_t row_bytes = px_tensor_nbytes(x) / (size_t)x->shape[0];
  int64_t shape[PX_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[d];
  shape[0] = rows;
  double sum = 0;
  for (int j = 0; j < m; j++) {
    px_tensor xj = px_tensor_view((char *)x->data + (size_t)j * (size_t)rows * row_bytes, x->dtype, x->ndim, shape);
    px_tensor logits;
    CHECK_OK(px_model_forward(ref, &xj, &logits));
    float *dl = px_model_scratch(ref, (size_t)px_tensor_numel(&logits)), l;
    CHECK_OK(px_cross_entropy_loss(&logits, targets + (size_t)j * (size_t)tpm, NULL, &l, dl));
    px_scale(dl, (size_t)px_tensor_numel(&logits), 1.0f / (float)m);
    px_tensor dlt = logits;
    dlt.data = dl;
    CHECK_OK(px_model_backward(ref, &dlt, NULL));
    sum += l;
  }
  *loss = (float)(sum / m);
}

// Step s's batch: inputs (B, IN) and class targets.
static void ppc_batch(int step, float *x, int32_t *y) {
  px_rng r = px_rng_make(900 + (uint64_t)step, 1);
  for (int i = 0; i < PPC_B * PPC_IN; i++) x[i] = px_rng_normal(&r);
  for (int i = 0; i < PPC_B; i++) y[i] = (int32_t)px_rng_below(&r, PPC_CLASSES);
}

// Worst relative difference of this rank's stage parameters from the reference's.
/* Evaluation through the pipeline equals the reference's loss on the batch
 * x (targets y): returns the pipeline's loss. */
static float ppc_check_eval(px_pp *pp, px_model *ref, px_tensor xt, const int32_t *y, px_pp_ce_targets *tg,
                            const char *what) {
  px_tensor logits;
  px_model_train(ref, false);
  CHECK_OK(px_model_forward(ref, &xt, &logits));
  float lref = 0, le = 0;
  CHECK_OK(px_cross_entropy_loss(&logits, y, NULL, &lref, NULL));
  CHECK_OK(px_pp_eval(pp, &xt, px_pp_ce_loss, tg, &le));
  CHECK(fabs((double)le - lref) <= 1e-5 * fabs((double)lref), "%s: eval loss %.8g, one process %.8g", what, (double)le,
        (double)lref);
  return le;
}

static double ppc_compare(px_pp *pp, const px_model *ref, const char **worst_name, int *n_checked) {
  double worst = 0;
  for (int c = 0; c < px_pp_n_chunks(pp); c++) {
    const px_model *md = px_pp_chunk_model(pp, c);
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i];
      const px_param *q = px_model_find(ref, p->name);
      CHECK(q != NULL && q->numel == p->numel, "the single-process model has no \"%s\" of %zu elements", p->name,
            p->numel);
      if (!q || q->numel != p->numel) continue;
      const double rms = sqrt(px_sumsq(q->data, q->numel) / (double)q->numel);
      const double w = px_max_rel_diff(p->data, q->data, p->numel, rms > 0 ? rms : 1e-30);
      if (w > worst || !*worst_name) {
        worst = fmax(worst, w);
        *worst_name = p->name;
      }
      (*n_checked)++;
    }
  }
  return worst;
}

static px_optim_opts ppc_optim(void) { return px_adamw_defaults(1e-2f); }

/* One case: a pipeline over `pipe` with schedule `sched` (p = its size) and
 * an MLP of `depth` hidden layers (dropout after each ReLU when > 0), split
 * as `split` says (NULL: equal unit counts).  Returns the number of failed
 * checks on this rank. */
static int ppc_case(px_comm *pipe, const px_pp_schedule *sched, int depth, const px_pp_split *split, float clip,
                    float dropout, const char *what) {
  const int before = px_test_failures;
  ppc_mlp arg = {.depth = depth, .dropout = dropout};
  const px_optim_opts oo = ppc_optim();
  px_pp_opts po =
    {.build = ppc_build, .build_arg = &arg, .split = split, .seed = 5, .optim = &oo, .clip_grad_norm = clip};
  px_pp *pp;
  CHECK_OK(px_pp_create(&pp, pipe, sched, &po));
  px_model *ref;
  CHECK_OK(px_model_create(&ref, ppc_build(&arg), 5));
  px_optim *oref;
  CHECK_OK(px_optim_create(&oref, ref->param_data, ref->grad_data, ref->n_param_elems, &oo));
  const char *name = NULL;
  int n_checked = 0;
  const double w0 = ppc_compare(pp, ref, &name, &n_checked);
  CHECK(w0 == 0, "%s: the initial \"%s\" is not the single process's (%.3g)", what, name ? name : "", w0);
  CHECK(n_checked > 0, "%s: rank %d holds no parameters", what, px_comm_rank(pipe));
  float x[PPC_B * PPC_IN];
  int32_t y[PPC_B];
  const int m = sched->m;
  px_pp_ce_targets tg = {.targets = y, .rows_per_micro = PPC_B / m};
  double worst_loss = 0;
  int clipped = 0;
  for (int s = 0; s < PPC_STEPS; s++) {
    ppc_batch(s, x, y);
    px_tensor xt = px_tensor_view(x, PX_F32, 2, (int64_t[]){PPC_B, PPC_IN});
    float lref;
    ppc_ref_step(ref, &xt, y, PPC_B / m, dropout > 0 ? m : 1, &lref);
    const float nref = clip > 0 ? px_clip_grad_norm(ref->grad_data, ref->n_param_elems, clip) : 0;
    CHECK_OK(px_optim_step(oref));
    float l;
    CHECK_OK(px_pp_step(pp, &xt, px_pp_ce_loss, &tg, &l));
    if (clip > 0) {
      px_pp_stats ps;
      px_pp_stats_get(pp, &ps);
      CHECK(fabs(ps.grad_norm - nref) <= 1e-5 * nref, "%s step %d: gradient norm %.8g, one process %.8g", what, s,
            (double)ps.grad_norm, (double)nref);
      clipped += nref > clip;
    }
    const double d = fabs((double)l - lref) / fabs((double)lref);
    worst_loss = fmax(worst_loss, d);
    CHECK(d <= 1e-5, "%s rank %d step %d: loss %.8g, one process %.8g", what, px_comm_rank(pipe), s, (double)l,
          (double)lref);
  }
  CHECK(clip <= 0 || clipped > 0, "%s: clipping at %g never acted: the test would not see a wrong norm", what,
        (double)clip);
  name = NULL;
  const double w = ppc_compare(pp, ref, &name, &n_checked);
  CHECK(w <= 1e-5, "%s rank %d: after %d steps \"%s\" differs by %.3g relative", what, px_comm_rank(pipe), PPC_STEPS,
        name ? name : "", w);
  // Evaluation through the pipeline: the reference's loss on a fresh batch.
  ppc_batch(1000, x, y);
  const float le = ppc_check_eval(pp, ref, px_tensor_view(x, PX_F32, 2, (int64_t[]){PPC_B, PPC_IN}), y, &tg, what);
  if (px_comm_rank(pipe) == 0)
    printf("  %s: %d steps, worst loss difference %.1e, worst parameter %.1e (%s), eval %.6f\n", what, PPC_STEPS,
           worst_loss, w, name ? name : "", (double)le);
  px_optim_free(oref);
  px_model_free(ref);
  px_pp_free(pp);
  return px_test_failures - before;
}

/* ---- The GPT: tied embedding and head on the first and last stage ------------
 * 3 blocks, 8 units (wte wpe drop h.0 h.1 h.2 ln_f lm_head); dropout (the
 * embedding's, attention probabilities', residuals') as the caller says. */
enum { PPG_V = 37, PPG_CTX = 12, PPG_T = 10, PPG_B = 8 };
#define PPG_CLIP 0.5f  // acts on most steps: the tied weight must count once in the norm

static px_module *ppg_build(void *arg) {
  const float *dropout = arg;
  const px_gpt_config cfg = {.vocab_size = PPG_V,
                             .context = PPG_CTX,
                             .n_layer = 3,
                             .n_head = 4,
                             .n_embd = 16,
                             .dropout = dropout ? *dropout : 0.0f};
  return px_zoo_gpt(&cfg);
}

static void ppg_batch(int step, int32_t *x, int32_t *y) {
  for (int i = 0; i < PPG_B; i++) {
    px_rng r = px_rng_make(700 + (uint64_t)step, (uint64_t)i);
    int32_t seq[PPG_T + 1];
    for (int t = 0; t <= PPG_T; t++) seq[t] = (int32_t)px_rng_below(&r, PPG_V);
    memcpy(x + (size_t)i * PPG_T, seq, PPG_T * sizeof *x);
    memcpy(y + (size_t)i * PPG_T, seq + 1, PPG_T * sizeof *y);
  }
}

// As ppc_compare, leaving out the key third of c_attn.bias under AdamW (its
// exact gradient is zero: softmax ignores q·b_k; its float32 gradient is
// rounding noise that AdamW turns into steps of ±lr; the TP and DDP parity
// tests leave it out for the same reason).
static double ppg_compare(px_pp *pp, const px_model *ref, const char **worst_name, int *tied_copies) {
  double worst = 0;
  for (int c = 0; c < px_pp_n_chunks(pp); c++) {
    const px_model *md = px_pp_chunk_model(pp, c);
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i];
      const px_param *q = px_model_find(ref, p->name);
      CHECK(q != NULL && q->numel == p->numel, "the single-process GPT has no \"%s\"", p->name);
      if (!q || q->numel != p->numel) continue;
      if (strcmp(p->name, "wte.weight") == 0) (*tied_copies)++;
      const double rms = sqrt(px_sumsq(q->data, q->numel) / (double)q->numel);
      const double fl = rms > 0 ? rms : 1e-30;
      double w;
      if (strstr(p->name, "c_attn.bias")) {
        const size_t C = p->numel / 3;
        w = fmax(px_max_rel_diff(p->data, q->data, C, fl), px_max_rel_diff(p->data + 2 * C, q->data + 2 * C, C, fl));
      } else {
        w = px_max_rel_diff(p->data, q->data, p->numel, fl);
      }
      if (w > worst || !*worst_name) {
        worst = fmax(worst, w);
        *worst_name = p->name;
      }
    }
  }
  return worst;
}

/* The GPT through `sched`: losses of 20 SGD+momentum steps, gradient norms
 * clipped at 0.5 over the whole pipeline, parameters (the head's
 * copy of wte.weight against the one wte.weight), evaluation. */
static int ppg_case(px_comm *pipe, const px_pp_schedule *sched, float dropout, const char *what) {
  const int before = px_test_failures;
  // SGD with momentum: splitting the batch into micro-batches changes the
  // order of float32 sums in the weight gradients, and AdamW divides by
  // sqrt(v), amplifying that rounding to ~1e-5 on small gradients (one
  // process with 2 micro-batches of gradient accumulation already differs by
  // 1.4e-5 after 20 AdamW steps; tests/test_ddp_tied_gpt_equals_single_process.c
  // sees the same).  The MLP cases use AdamW.
  px_optim_opts oo = px_sgd_defaults(0.1f);
  oo.momentum = 0.9f;
  px_pp_opts po = {.build = ppg_build, .build_arg = &dropout, .seed = 11, .optim = &oo, .clip_grad_norm = PPG_CLIP};
  px_pp *pp;
  CHECK_OK(px_pp_create(&pp, pipe, sched, &po));
  px_model *ref;
  CHECK_OK(px_model_create(&ref, ppg_build(&dropout), 11));
  px_optim *oref;
  CHECK_OK(px_optim_create(&oref, ref->param_data, ref->grad_data, ref->n_param_elems, &oo));
  const char *name = NULL;
  int copies = 0;
  CHECK(ppg_compare(pp, ref, &name, &copies) == 0, "%s: the initial \"%s\" is not the single process's", what,
        name ? name : "");
  double held = (double)copies;
  CHECK_OK(px_comm_allreduce(pipe, &held, 1, PX_F64, PX_SUM));
  const int p = px_comm_size(pipe);
  CHECK(held == (p * sched->v > 1 ? 2 : 1), "%s: %.0f copies of wte.weight (the first and the last stage's)", what,
        held);
  int32_t x[PPG_B * PPG_T], y[PPG_B * PPG_T];
  const int m = sched->m;
  px_pp_ce_targets tg = {.targets = y, .rows_per_micro = (PPG_B / m) * PPG_T};
  double worst_loss = 0;
  int clipped = 0;
  const float clip = PPG_CLIP;
  for (int s = 0; s < PPC_STEPS; s++) {
    ppg_batch(s, x, y);
    px_tensor xt = px_tensor_view(x, PX_I32, 2, (int64_t[]){PPG_B, PPG_T});
    float lref;
    ppc_ref_step(ref, &xt, y, (PPG_B / m) * PPG_T, dropout > 0 ? m : 1, &lref);
    const float nref = clip > 0 ? px_clip_grad_norm(ref->grad_data, ref->n_param_elems, clip) : 0;
    CHECK_OK(px_optim_step(oref));
    float l;
    CHECK_OK(px_pp_step(pp, &xt, px_pp_ce_loss, &tg, &l));
    if (clip > 0) {
      px_pp_stats ps;
      px_pp_stats_get(pp, &ps);
      CHECK(fabs(ps.grad_norm - nref) <= 1e-5 * nref, "%s step %d: gradient norm %.8g, one process %.8g", what, s,
            (double)ps.grad_norm, (double)nref);
      clipped += nref > clip;
    }
    const double d = fabs((double)l - lref) / fabs((double)lref);
    worst_loss = fmax(worst_loss, d);
    CHECK(d <= 1e-5, "%s rank %d step %d: loss %.8g, one process %.8g", what, px_comm_rank(pipe), s, (double)l,
          (double)lref);
  }
  CHECK(clipped > 0, "%s: clipping at %g never acted: the test would not see a wrong norm", what, (double)clip);
  name = NULL;
  copies = 0;
  const double w = ppg_compare(pp, ref, &name, &copies);
  CHECK(w <= 1e-5, "%s rank %d: after %d steps \"%s\" differs by %.3g relative", what, px_comm_rank(pipe), PPC_STEPS,
        name ? name : "", w);
  ppg_batch(1000, x, y);
  const float le = ppc_check_eval(pp, ref, px_tensor_view(x, PX_I32, 2, (int64_t[]){PPG_B, PPG_T}), y, &tg, what);
  if (px_comm_rank(pipe) == 0)
    printf("  GPT %s: %d steps, worst loss difference %.1e, worst parameter %.1e (%s), eval %.6f\n", what, PPC_STEPS,
           worst_loss, w, name ? name : "", (double)le);
  px_optim_free(oref);
  px_model_free(ref);
  px_pp_free(pp);
  return px_test_failures - before;
}

#endif
