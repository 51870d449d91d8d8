/* pp3d_cases.h — pipeline × data × tensor parallel against one process,
 * shared by test_pp_3d_equals_single_process.c (threads) and its _mpi twin.
 *
 * The world is a px_mesh dp × tp × pp.  Every pipeline (the pp ranks of one
 * (dp, tp) coordinate) runs a schedule over its pp communicator; the dp
 * replicas read different rows of the step's global batch (replica d rows
 * [d·B, (d+1)·B), B = global / dp) and the executor averages their
 * gradients (px_pp_opts.dp); the tp ranks of a stage hold the px_tp_* boxes
 * of the tensor-parallel GPT (px_tp_gpt as the stage builder's tree), the
 * last stage's loss the vocabulary-parallel cross-entropy.  Alongside, every
 * rank trains the single-process model on the whole global batch in one
 * forward.  Every step's loss must agree to 1e-5 relative, the gradient
 * norm (clipping acts on most steps) to 1e-5, and after 20 steps every
 * parameter box this rank holds must be the box of the single process's
 * parameter to 1e-5 relative (the initial ones bit for bit).  With ZeRO 1 or
 * 2 (zero > 0) a second pipeline without ZeRO trains beside it on the same
 * batches, and the two must agree to 1e-6 (ZeRO over dp with pp equals DDP
 * over dp with pp). */
#ifndef PX_PP3D_CASES_H
#define PX_PP3D_CASES_H

#include "pp_cases.h"
#include "plexus/tensor_parallel.h"

typedef struct p3d_gpt_arg {
  px_tp_group *g;  // NULL: the zoo GPT (tp 1)
} p3d_gpt_arg;

static px_gpt_config p3d_gpt_config(void) {
  return (
    px_gpt_config){.vocab_size = PPG_V, .context = PPG_CTX, .n_layer = 3, .n_head = 4, .n_embd = 16, .dropout = 0.0f};
}

static px_module *p3d_build_gpt(void *arg) {
  const p3d_gpt_arg *a = arg;
  const px_gpt_config c = p3d_gpt_config();
  if (!a->g) return px_zoo_gpt(&c);
  const px_tp_gpt_config t = {.vocab_size = c.vocab_size,
                              .context = c.context,
                              .n_layer = c.n_layer,
                              .n_head = c.n_head,
                              .n_embd = c.n_embd,
                              .dropout = c.dropout};
  return px_tp_gpt(a->g, &t);
}

// The last stage's loss over vocabulary-sharded logits (N, T, count).
typedef struct p3d_tp_targets {
  px_tp_group *g;
  const int32_t *targets;
  int64_t rows_per_micro;
} p3d_tp_targets;

static px_status p3d_tp_loss(void *user, const px_tensor *out, int micro, float *loss, float *dout) {
  const p3d_tp_targets *t = user;
  return px_tp_cross_entropy(t->g, out, PPG_V, t->targets + (size_t)micro * (size_t)t->rows_per_micro, -100, loss,
                             dout);
}

// Worst relative difference of this rank's boxes from the reference's (the
// key third of c_attn.bias left out under the GPT's optimizer, as
// ppg_compare does), and of each from `other` (a second pipeline; may be NULL).
static double p3d_compare(px_pp *pp, const px_model *ref, px_pp *other, double *worst_other, const char **worst_name,
                          int *n_checked) {
  double worst = 0;
  for (int c = 0; c < px_pp_n_chunks(pp); c++) {
    const px_model *md = px_pp_chunk_model(pp, c);
    const px_model *om = other ? px_pp_chunk_model(other, c) : NULL;
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i];
      const px_param *q = px_model_find(ref, p->name);
      const px_tp_box b = px_tp_param_box(p);
      const size_t global = (size_t)(b.global_shape[0] * b.global_shape[1]);
      CHECK(q != NULL && q->numel == (b.split_dim < 0 ? p->numel : global),
            "the single-process model has no \"%s\" of the box's global size", p->name);
      if (!q || q->numel != (b.split_dim < 0 ? p->numel : global)) continue;
      float *want = malloc(p->numel * sizeof *want);
      px_tp_box_take(p, q->data, want);
      const double rms = sqrt(px_sumsq(want, p->numel) / (double)p->numel);
      const double fl = rms > 0 ? rms : 1e-30;
      double w;
      if (strstr(p->name, "c_attn.bias")) {
        const size_t C = p->numel / 3;
        w = fmax(px_max_rel_diff(p->data, want, C, fl), px_max_rel_diff(p->data + 2 * C, want + 2 * C, C, fl));
      } else {
        w = px_max_rel_diff(p->data, want, p->numel, fl);
      }
      free(want);
      if (w > worst || !*worst_name) {
        worst = fmax(worst, w);
        *worst_name = p->name;
      }
      if (om) {
        const px_param *o = om->params[i];
        *worst_other = fmax(*worst_other, px_max_rel_diff(p->data, o->data, p->numel, fl));
      }
      (*n_checked)++;
    }
  }
  return worst;
}

typedef struct p3d_case {
  int dp, tp, pp;
  px_pp_kind kind;
  int m, v;
  bool gpt;  // the GPT (tensor parallel when tp > 1); else the MLP (tp must be 1)
  int zero;  // 0, or ZeRO 1/2 over dp (checked against a DDP-over-dp pipeline beside it)
  float clip;
} p3d_case;

/* One case on `world` (its size dp·tp·pp).  Returns this rank's failures. */
static int p3d_run(px_comm *world, const p3d_case *k) {
  const int before = px_test_failures;
  (void)ppc_case;  // pp_cases.h's one-pipeline cases: the shared helpers are what this file uses
  (void)ppg_case;
  px_mesh *mesh;
  CHECK_OK(px_mesh_create(&mesh, world, k->dp, k->tp, k->pp));
  if (!mesh) return px_test_failures - before;
  char what[160];
  snprintf(what, sizeof what, "%s dp %d × tp %d × pp %d, %s m %d v %d%s%s", k->gpt ? "GPT" : "MLP", k->dp, k->tp, k->pp,
           px_pp_kind_name(k->kind), k->m, k->v, k->zero ? ", ZeRO " : "",
           k->zero == 1     ? "1"
             : k->zero == 2 ? "2"
                            : "");
  px_pp_schedule *sched;
  CHECK_OK(px_pp_schedule_make(k->kind, k->pp, k->m, k->v, &sched));
  ppc_mlp marg = {.depth = 6};
  p3d_gpt_arg garg = {.g = k->tp > 1 ? &mesh->tp_group : NULL};
  p3d_gpt_arg rarg = {.g = NULL};
  px_optim_opts oo = ppc_optim();
  if (k->gpt) {  // SGD with momentum: see ppg_case on AdamW and reordered sums
    oo = px_sgd_defaults(0.1f);
    oo.momentum = 0.9f;
  }
  const uint64_t seed = k->gpt ? 11 : 5;
  px_pp_opts po = {.build = k->gpt ? p3d_build_gpt : ppc_build,
                   .build_arg = k->gpt ? (void *)&garg : (void *)&marg,
                   .seed = seed,
                   .optim = &oo,
                   .clip_grad_norm = k->clip,
                   .dp = mesh->dp_comm,
                   .tp = k->tp > 1 ? mesh->tp_comm : NULL,
                   .zero_stage = k->zero};
  px_pp *pp = NULL, *ddp = NULL;
  CHECK_OK(px_pp_create(&pp, mesh->pp_comm, sched, &po));
  if (k->zero) {
    px_pp_opts p0 = po;
    p0.zero_stage = 0;
    CHECK_OK(px_pp_create(&ddp, mesh->pp_comm, sched, &p0));
  }
  px_model *ref;
  CHECK_OK(px_model_create(&ref, k->gpt ? p3d_build_gpt(&rarg) : ppc_build(&marg), seed));
  px_optim *oref;
  CHECK_OK(px_optim_create(&oref, ref->param_data, ref->grad_data, ref->n_param_elems, &oo));
  if (!pp || !ref) return px_test_failures - before;
  const char *name = NULL;
  int n_checked = 0;
  double wo = 0;
  const double w0 = p3d_compare(pp, ref, NULL, &wo, &name, &n_checked);
  CHECK(w0 == 0, "%s: the initial \"%s\" is not the single process's box (%.3g)", what, name ? name : "", w0);
  CHECK(n_checked > 0, "%s: rank %d holds no parameters", what, px_comm_rank(world));
  const int A = k->dp;
  // The global batch: the MLP's PPC_B rows, the GPT's PPG_B sequences.
  const int rows = k->gpt ? PPG_B : PPC_B, B = rows / A, per_row = k->gpt ? PPG_T : PPC_IN;
  float xf[PPC_B * PPC_IN];
  int32_t xi[PPG_B * PPG_T], y[PPC_B > PPG_B * PPG_T ? PPC_B : PPG_B * PPG_T];
  const int tpr = k->gpt ? PPG_T : 1;  // targets per row
  double worst_loss = 0;
  int clipped = 0;
  for (int s = 0; s < PPC_STEPS; s++) {
    if (k->gpt) ppg_batch(s, xi, y);
    else ppc_batch(s, xf, y);
    const px_tensor whole = k->gpt ? px_tensor_view(xi, PX_I32, 2, (int64_t[]){rows, per_row})
                                   : px_tensor_view(xf, PX_F32, 2, (int64_t[]){rows, per_row});
    float lref;
    ppc_ref_step(ref, &whole, y, (int64_t)rows * tpr, 1, &lref);
    const float nref = k->clip > 0 ? px_clip_grad_norm(ref->grad_data, ref->n_param_elems, k->clip) : 0;
    CHECK_OK(px_optim_step(oref));
    // This replica's rows.
    const int d = mesh->dp_rank;
    const px_tensor mine = k->gpt ? px_tensor_view(xi + (size_t)d * B * per_row, PX_I32, 2, (int64_t[]){B, per_row})
                                  : px_tensor_view(xf + (size_t)d * B * per_row, PX_F32, 2, (int64_t[]){B, per_row});
    const int32_t *ty = y + (size_t)d * B * tpr;
    const int64_t rpm = (int64_t)(B / k->m) * tpr;
    px_pp_ce_targets tg = {.targets = ty, .rows_per_micro = rpm};
    p3d_tp_targets tt = {.g = &mesh->tp_group, .targets = ty, .rows_per_micro = rpm};
    px_pp_loss_fn lf = k->gpt ? p3d_tp_loss : px_pp_ce_loss;
    void *lu = k->gpt ? (void *)&tt : (void *)&tg;
    float l, l0;
    CHECK_OK(px_pp_step(pp, &mine, lf, lu, &l));
    if (ddp) {
      CHECK_OK(px_pp_step(ddp, &mine, lf, lu, &l0));
      CHECK(fabs((double)l - l0) <= 1e-6 * fabs((double)l0), "%s step %d: loss %.9g with ZeRO, %.9g without", what, s,
            (double)l, (double)l0);
    }
    if (k->clip > 0) {
      px_pp_stats ps;
      px_pp_stats_get(pp, &ps);
      CHECK(fabs(ps.grad_norm - nref) <= 1e-5 * nref, "%s step %d: gradient norm %.8g, one process %.8g", what, s,
            (double)ps.grad_norm, (double)nref);
      clipped += nref > k->clip;
    }
    const double dl = fabs((double)l - lref) / fabs((double)lref);
    worst_loss = fmax(worst_loss, dl);
    CHECK(dl <= 1e-5, "%s rank %d step %d: loss %.8g, one process %.8g", what, px_comm_rank(world), s, (double)l,
          (double)lref);
  }
  CHECK(k->clip <= 0 || clipped > 0, "%s: clipping at %g never acted", what, (double)k->clip);
  name = NULL;
  wo = 0;
  const double w = p3d_compare(pp, ref, ddp, &wo, &name, &n_checked);
  CHECK(w <= 1e-5, "%s rank %d: after %d steps \"%s\" differs by %.3g relative", what, px_comm_rank(world), PPC_STEPS,
        name ? name : "", w);
  CHECK(!ddp || wo <= 1e-6, "%s rank %d: ZeRO's parameters differ from DDP's by %.3g relative", what,
        px_comm_rank(world), wo);
  if (px_comm_rank(world) == 0)
    printf("  %s: %d steps, worst loss difference %.1e, worst parameter %.1e (%s)", what, PPC_STEPS, worst_loss, w,
           name ? name : "");
  if (px_comm_rank(world) == 0) printf(ddp ? ", ZeRO against DDP %.1e\n" : "\n", wo);
  px_optim_free(oref);
  px_model_free(ref);
  px_pp_free(ddp);
  px_pp_free(pp);
  px_pp_schedule_free(sched);
  px_mesh_free(mesh);  // after the models: their tp layers point at its group
  return px_test_failures - before;
}

#endif
