/* Claim: a checkpoint of a 3D run (pipeline × data × tensor parallel, one
 * px_mesh) holds the global model and optimizer state once, whatever the
 * mesh, and loads into any other mesh bit for bit:
 *   - the tiny tensor-parallel GPT (its tied head's tp copy on the last
 *     stage, AdamW: two slots) trains 3 steps at dp 2 × tp 2 × pp 2 (8
 *     ranks as threads, 1F1B), without ZeRO and with ZeRO 1 over dp (each
 *     dp rank holding only its slice of every chunk's optimizer state), and
 *     saves with px_pp_checkpoint_save (writes: dp rank 0; replicated: tp
 *     rank 0; under ZeRO every dp rank its slices as flat ranges of the
 *     boxes);
 *   - the saved run's state, gathered in the test from every rank's memory
 *     (its boxes put back into the global tensors; ZeRO's slices by their
 *     flat ranges), is the truth;
 *   - one process assembles the checkpoint's model and optimizer files into
 *     the plain (zoo) GPT's tensors with every element covered exactly once
 *     (px_checkpoint_assemble, strict: a tensor written twice — the tied
 *     copy, a replicated parameter by two tp ranks or dp replicas — or a
 *     hole fails), equal to the truth bitwise;
 *   - pipelines at (dp, tp, pp) = (1, 1, 1), (1, 2, 4), (2, 1, 2) with
 *     ZeRO 1, (3, 1, 2) with ZeRO 1 (slices of unequal length) and
 *     (2, 2, 2), built from another seed, load it
 *     (px_pp_checkpoint_load): every parameter box (the tied copy
 *     included), every optimizer slot (under ZeRO this rank's slice) and
 *     the optimizer's step count equal the truth bitwise;
 *   - the loaded pipelines train one more step (the loaded state is usable;
 *     not dp 3, whose replicas cannot split the 8 sequences).
 * If this fails: a dp replica other than 0 or a tp rank other than 0 wrote
 * a replicated tensor (the assembly finds an overlap), a ZeRO slice's range
 * is not mapped to its box's flat range (c_attn's q, k, v parts), the tied
 * copy is written or not filled, or a load under ZeRO fills the wrong part
 * of the optimizer's slice. */
#define _GNU_SOURCE  // mkdtemp
#include "pp3d_cases.h"

#include <stdlib.h>

enum { K_STEPS = 3, K_SLOTS = 2 };

// The truth: the whole model's tensors as the zoo GPT lays them out.
static px_model *REF;
static float *T_param, *T_slot[K_SLOTS];
static int64_t T_step;
static char root[256], save_dir[320], path[512];

// idx[i]: the global flat index of p's local element i (its box taken from
// an iota: the tensors are small enough for floats to count exactly).
static size_t *global_index(const px_param *p, const px_param *q) {
  float *iota = malloc(q->numel * sizeof *iota), *loc = malloc(p->numel * sizeof *loc);
  size_t *idx = malloc(p->numel * sizeof *idx);
  for (size_t i = 0; i < q->numel; i++) iota[i] = (float)i;
  px_tp_box_take(p, iota, loc);
  for (size_t i = 0; i < p->numel; i++) idx[i] = (size_t)loc[i];
  free(iota);
  free(loc);
  return idx;
}

typedef struct layout {
  int dp, tp, pp, zero;
  bool save;  // train K_STEPS and save (else: load and compare)
} layout;

static px_pp *make(px_mesh *mesh, const layout *L, p3d_gpt_arg *garg, px_optim_opts *oo, uint64_t seed,
                   px_pp_schedule **sched) {
  CHECK_OK(px_pp_schedule_make(PX_PP_1F1B, L->pp, 2, 1, sched));
  px_pp_opts po = {.build = p3d_build_gpt,
                   .build_arg = garg,
                   .seed = seed,
                   .optim = oo,
                   .dp = mesh->dp_comm,
                   .tp = L->tp > 1 ? mesh->tp_comm : NULL,
                   .zero_stage = L->zero};
  px_pp *pp = NULL;
  CHECK_OK(px_pp_create(&pp, mesh->pp_comm, *sched, &po));
  return pp;
}

static px_status step(px_pp *pp, px_mesh *mesh, int s) {
  int32_t xi[PPG_B * PPG_T], y[PPG_B * PPG_T];
  ppg_batch(s, xi, y);
  const int B = PPG_B / mesh->dp, d = mesh->dp_rank;
  const px_tensor mine = px_tensor_view(xi + (size_t)d * B * PPG_T, PX_I32, 2, (int64_t[]){B, PPG_T});
  p3d_tp_targets tt = {.g = &mesh->tp_group,
                       .targets = y + (size_t)d * B * PPG_T,
                       .rows_per_micro = (int64_t)(B / 2) * PPG_T};
  px_pp_ce_targets tg = {.targets = tt.targets, .rows_per_micro = tt.rows_per_micro};
  float l;
  return px_pp_step(pp, &mine, mesh->tp > 1 ? p3d_tp_loss : px_pp_ce_loss, mesh->tp > 1 ? (void *)&tt : (void *)&tg,
                    &l);
}

// The saved run's state into the truth: dp rank 0 its parameter boxes (the
// unsplit ones on tp rank 0), the optimizer slots likewise, or under ZeRO
// every dp rank its slice (the unsplit parameters' from tp rank 0).
static void gather_truth(px_pp *pp, px_mesh *mesh) {
  for (int c = 0; c < px_pp_n_chunks(pp); c++) {
    px_model *md = px_pp_chunk_model(pp, c);
    px_optim *o = px_pp_chunk_optim(pp, c);
    size_t z_off = 0, z_len = md->n_param_elems;
    const bool zero = px_pp_chunk_zero_slice(pp, c, &z_off, &z_len);
    if (o && c == 0 && mesh->dp_rank == 0 && mesh->tp_rank == 0 && px_comm_rank(mesh->pp_comm) == 0) T_step = o->step;
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i];
      if (ppc_is_tied_copy(pp, c, p)) continue;
      const px_param *q = px_model_find(REF, p->name);
      CHECK(q != NULL, "no \"%s\" in the zoo GPT", p->name);
      if (!q) continue;
      if (px_tp_param_box(p).split_dim < 0 && mesh->tp_rank != 0) continue;
      size_t *idx = global_index(p, q);
      if (mesh->dp_rank == 0)
        for (size_t e = 0; e < p->numel; e++) T_param[q->offset + idx[e]] = p->data[e];
      for (int k = 0; o && k < K_SLOTS && (zero || mesh->dp_rank == 0); k++) {
        const char *name;
        const float *base = px_optim_state_slot(o, k, &name);
        for (size_t e = 0; e < p->numel; e++) {
          const size_t at = p->offset + e;  // in the chunk's flat buffer
          if (at >= z_off && at < z_off + z_len) T_slot[k][q->offset + idx[e]] = base[at - z_off];
        }
      }
      free(idx);
    }
  }
}

// Worst count of elements of this rank's state that differ from the truth.
static size_t compare(px_pp *pp, const char *what) {
  size_t bad = 0;
  for (int c = 0; c < px_pp_n_chunks(pp); c++) {
    px_model *md = px_pp_chunk_model(pp, c);
    px_optim *o = px_pp_chunk_optim(pp, c);
    size_t z_off = 0, z_len = md->n_param_elems;
    px_pp_chunk_zero_slice(pp, c, &z_off, &z_len);
    CHECK(!o || o->step == T_step, "%s: optimizer step %lld, saved %lld", what, (long long)(o ? o->step : 0),
          (long long)T_step);
    float *want = malloc(md->n_param_elems * sizeof *want);
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i], *q = px_model_find(REF, p->name);
      if (!q) continue;
      px_tp_box_take(p, T_param + q->offset, want + p->offset);
      size_t nb = 0;
      for (size_t e = 0; e < p->numel; e++) nb += memcmp(&p->data[e], &want[p->offset + e], sizeof(float)) != 0;
      CHECK(nb == 0, "%s stage %d: %zu elements of \"%s\" differ from the saved run's", what, px_pp_chunk_stage(pp, c),
            nb, p->name);
      bad += nb;
    }
    for (int k = 0; o && k < K_SLOTS; k++) {
      for (int i = 0; i < md->n_params; i++) {
        const px_param *p = md->params[i], *q = px_model_find(REF, p->name);
        if (q) px_tp_box_take(p, T_slot[k] + q->offset, want + p->offset);
      }
      const char *name;
      const float *base = px_optim_state_slot(o, k, &name);
      size_t nb = 0;
      for (size_t e = 0; e < z_len; e++) nb += memcmp(&base[e], &want[z_off + e], sizeof(float)) != 0;
      CHECK(nb == 0, "%s stage %d: %zu elements of optimizer slot %s (range [%zu, +%zu)) differ", what,
            px_pp_chunk_stage(pp, c), nb, name, z_off, z_len);
      bad += nb;
    }
    free(want);
  }
  return bad;
}

static int run(px_comm *world, void *arg) {
  const layout *L = arg;
  px_comm_set_timeout(world, 120);
  px_mesh *mesh;
  CHECK_OK(px_mesh_create(&mesh, world, L->dp, L->tp, L->pp));
  if (!mesh) return 1;
  char what[96];
  snprintf(what, sizeof what, "dp %d × tp %d × pp %d%s rank %d", L->dp, L->tp, L->pp, L->zero ? " ZeRO 1" : "",
           px_comm_rank(world));
  p3d_gpt_arg garg = {.g = L->tp > 1 ? &mesh->tp_group : NULL};
  px_optim_opts oo = ppc_optim();  // AdamW: two slots
  px_pp_schedule *sched = NULL;
  px_pp *pp = make(mesh, L, &garg, &oo, L->save ? 11 : 99, &sched);
  if (pp && L->save) {
    for (int s = 0; s < K_STEPS; s++) CHECK_OK(step(pp, mesh, s));
    gather_truth(pp, mesh);
    char out[512] = "";
    CHECK_OK(px_pp_checkpoint_save(world, pp, mesh->dp_rank == 0, mesh->tp_rank == 0, save_dir, K_STEPS, 0,
                                   px_comm_rank(world) == 0 ? "{\"step\": 3}" : NULL, out, sizeof out));
    if (px_comm_rank(world) == 0) snprintf(path, sizeof path, "%s", out);
  } else if (pp) {
    CHECK_OK(px_pp_checkpoint_load(world, pp, path, T_step));
    const size_t bad = compare(pp, what);
    if (px_comm_rank(world) == 0) printf("  loaded at %s: %zu elements differ\n", what, bad);
    if (PPG_B % (2 * L->dp) == 0) CHECK_OK(step(pp, mesh, K_STEPS));  // it trains on
  }
  px_pp_free(pp);
  px_pp_schedule_free(sched);
  px_mesh_free(mesh);
  return px_test_failures ? 1 : 0;
}

static void on(layout L) {
  int code = 0;
  CHECK_OK(px_comm_run(L.dp * L.tp * L.pp, run, &L, &code));
  CHECK(code == 0, "dp %d tp %d pp %d zero %d (%s): a rank failed", L.dp, L.tp, L.pp, L.zero, L.save ? "save" : "load");
}

// One process: the checkpoint's files assembled into the zoo GPT's tensors,
// every element exactly once, equal to the truth.
static void assemble_plain(void) {
  px_state_dict sd;
  CHECK_OK(px_model_state_dict(REF, &sd));
  CHECK_OK(px_checkpoint_assemble(path, "model", &sd, true));
  px_state_dict_free(&sd);
  size_t bad = 0;
  for (size_t e = 0; e < REF->n_param_elems; e++) bad += memcmp(&REF->param_data[e], &T_param[e], 4) != 0;
  CHECK(bad == 0, "assembled parameters: %zu elements differ from the saved run's", bad);
  const char *names[K_SLOTS] = {"exp_avg.", "exp_avg_sq."};
  float *slot = malloc(REF->n_param_elems * sizeof *slot);
  for (int k = 0; k < K_SLOTS; k++) {
    px_state_dict od = {.items = calloc((size_t)REF->n_params, sizeof *od.items), .count = REF->n_params};
    for (int i = 0; i < REF->n_params; i++) {
      const px_param *p = REF->params[i];
      snprintf(od.items[i].name, PX_NAME_MAX, "%s%s", names[k], p->name);
      od.items[i].tensor = px_tensor_view(slot + p->offset, PX_F32, p->ndim, p->shape);
    }
    px_status st = px_checkpoint_assemble(path, "optim", &od, false);
    CHECK_OK(st);
    free(od.items);
    size_t nb = 0;
    for (size_t e = 0; e < REF->n_param_elems; e++) nb += memcmp(&slot[e], &T_slot[k][e], 4) != 0;
    CHECK(nb == 0, "assembled %s: %zu elements differ from the saved run's", names[k], nb);
    bad += nb;
  }
  free(slot);
  printf("  assembled in one process: %zu elements differ\n", bad);
}

int main(void) {
  (void)p3d_run;  // pp3d_cases.h's shared helpers are what this file uses
  snprintf(root, sizeof root, "/tmp/px_pp3dck_XXXXXX");
  CHECK(mkdtemp(root) != NULL, "mkdtemp");
  p3d_gpt_arg one = {.g = NULL};
  CHECK_OK(px_model_create(&REF, p3d_build_gpt(&one), 7));
  if (!REF) return px_test_finish("test_pp_3d_checkpoint_changes_layout");
  T_param = malloc(REF->n_param_elems * sizeof *T_param);
  for (int k = 0; k < K_SLOTS; k++) T_slot[k] = malloc(REF->n_param_elems * sizeof *T_slot[k]);
  for (int zero = 0; zero <= 1; zero++) {
    printf("saved at dp 2 × tp 2 × pp 2%s:\n", zero ? " with ZeRO 1 over dp" : "");
    for (size_t e = 0; e < REF->n_param_elems; e++) {  // NaN: an element no rank gathered shows
      T_param[e] = NAN;
      for (int k = 0; k < K_SLOTS; k++) T_slot[k][e] = NAN;
    }
    snprintf(save_dir, sizeof save_dir, "%s/z%d", root, zero);
    on((layout){2, 2, 2, zero, true});
    size_t holes = 0;
    for (size_t e = 0; e < REF->n_param_elems; e++) holes += isnan(T_param[e]) || isnan(T_slot[0][e]);
    CHECK(holes == 0, "the truth has %zu elements no rank held", holes);
    CHECK(*path != 0, "no checkpoint path");
    assemble_plain();
    on((layout){1, 1, 1, 0, false});
    on((layout){1, 2, 4, 0, false});
    on((layout){2, 1, 2, 1, false});
    on((layout){3, 1, 2, 1, false});  // slices of unequal length (padded)
    on((layout){2, 2, 2, 0, false});
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  for (int k = 0; k < K_SLOTS; k++) free(T_slot[k]);
  free(T_param);
  px_model_free(REF);
  return px_test_finish("test_pp_3d_checkpoint_changes_layout");
}
