/* Claim: the pipeline refuses what it cannot run with one clear message and
 * never leaves a stage hanging:
 *   - a batch that does not split into m equal micro-batches: every rank
 *     gets an error naming both numbers;
 *   - more stages than the model has units: naming both numbers;
 *   - a split point that is not a unit: naming it and listing the units;
 *   - a tied head inside a unit on another stage than its embedding: naming
 *     both (a head that is a unit itself, as the GPT's, is supported);
 *   - a stage whose forward fails mid-schedule (a model whose stage 1
 *     expects other features than stage 0 gives): that rank's error names
 *     the stage, the micro-batch and the action, and the other ranks fail at
 *     once (px_comm_abort) instead of waiting for the watchdog.
 * And each rank holds only its stages' parameters: summed over the ranks,
 * exactly the whole model's, named as in the whole model.
 * If this fails: a check moved after the first communication (one rank
 * errs, the others hang), or a message lost its context. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

static px_module *mlp(void *arg) {
  (void)arg;
  return px_zoo_mlp(6, 8, 3, 4);  // units: flatten 0 1 2 3 4 5 6
}

// Linear(6 -> 8), ReLU, Linear(5 -> 4): wrong at the second Linear.
static px_module *broken(void *arg) {
  (void)arg;
  return px_chain_of(3, px_linear(6, 8, true), px_relu(), px_linear(5, 4, true));
}

static px_module *gpt(void *arg) {
  (void)arg;
  px_gpt_config cfg = {.vocab_size = 11, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 8, .dropout = 0};
  return px_zoo_gpt(&cfg);
}

// A tied head inside a unit ("out.head"), the embedding on another stage.
static px_module *nested_tie(void *arg) {
  (void)arg;
  px_module *emb = px_embedding(11, 8), *out = px_chain(), *root = px_chain();
  px_chain_add_named(out, "head", px_tied_head(emb));
  px_chain_add_named(root, "emb", emb);
  px_chain_add_named(root, "mid", px_linear(8, 8, true));
  px_chain_add_named(root, "out", out);
  return root;
}

static px_status loss(void *user, const px_tensor *out, int micro, float *l, float *d) {
  (void)user;
  (void)micro;
  int32_t t[64] = {0};
  return px_cross_entropy_loss(out, t, NULL, l, d);
}

static int ranks(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 30);
  const int p = px_comm_size(c), r = px_comm_rank(c);
  px_pp_schedule *s;
  CHECK_OK(px_pp_schedule_make(PX_PP_1F1B, p, 4, 1, &s));
  float x[25 * 6] = {0};
  // A batch of 25 rows into 4 micro-batches.
  {
    px_pp_opts o = {.build = mlp, .seed = 1};
    px_pp *pp;
    CHECK_OK(px_pp_create(&pp, c, s, &o));
    px_tensor xt = px_tensor_view(x, PX_F32, 2, (int64_t[]){25, 6});
    px_status st = px_pp_step(pp, &xt, loss, NULL, NULL);
    CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "25 rows") && strstr(px_last_error(), "4 equal"),
          "rank %d: 25 rows in 4 micro-batches: %s \"%s\"", r, px_status_name(st), px_last_error());
    if (r == 0) printf("  refused: %s\n", px_last_error());
    // Parameters: each rank its stage's, all of them once, whole-model names.
    px_pp_stats ps;
    px_pp_stats_get(pp, &ps);
    px_model *whole;
    CHECK_OK(px_model_create(&whole, mlp(NULL), 1));
    double held = (double)ps.param_elems;
    CHECK_OK(px_comm_allreduce(c, &held, 1, PX_F64, PX_SUM));
    CHECK(held == (double)whole->n_param_elems, "the ranks hold %.0f parameters, the model has %zu", held,
          whole->n_param_elems);
    CHECK(p == 1 || ps.param_elems < whole->n_param_elems, "rank %d holds all %zu parameters", r, ps.param_elems);
    const px_model *md = px_pp_chunk_model(pp, 0);
    for (int i = 0; i < md->n_params; i++) {
      const px_param *q = px_model_find(whole, md->params[i]->name);
      CHECK(q && memcmp(q->data, md->params[i]->data, q->numel * sizeof(float)) == 0,
            "rank %d's \"%s\" is not the whole model's", r, md->params[i]->name);
    }
    px_model_free(whole);
    px_pp_free(pp);
  }
  // A forward that fails on stage 1.
  if (p == 2) {
    px_pp_opts o = {.build = broken, .seed = 1};
    px_pp *pp;
    CHECK_OK(px_pp_create(&pp, c, s, &o));
    px_tensor xt = px_tensor_view(x, PX_F32, 2, (int64_t[]){8, 6});
    const double t0 = px_time_now();
    px_status st = px_pp_step(pp, &xt, loss, NULL, NULL);
    const double took = px_time_now() - t0;
    CHECK(st != PX_OK && took < 10, "rank %d: %s after %.1f s", r, px_status_name(st), took);
    if (r == 1) {
      CHECK(strstr(px_last_error(), "stage 1, micro-batch 0, FORWARD") && strstr(px_last_error(), "Linear"),
            "stage 1's error: \"%s\"", px_last_error());
      printf("  stage 1: %s\n", px_last_error());
    }
    px_pp_free(pp);
  }
  px_pp_schedule_free(s);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  px_pp_plan *plan;
  px_status st = px_pp_plan_make(mlp, NULL, 9, NULL, &plan);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "9 stages") && strstr(px_last_error(), "only 8 units"),
        "9 stages of 8 units: \"%s\"", px_last_error());
  printf("  refused: %s\n", px_last_error());
  const char *const at[] = {"3", "nope"};
  px_pp_split sp = {.kind = PX_PP_SPLIT_AT, .at = at, .n_at = 2};
  st = px_pp_plan_make(mlp, NULL, 3, &sp, &plan);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "\"nope\"") && strstr(px_last_error(), "flatten 0 1 2"),
        "split at \"nope\": \"%s\"", px_last_error());
  printf("  refused: %s\n", px_last_error());
  st = px_pp_plan_make(nested_tie, NULL, 2, NULL, &plan);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "\"out\"") && strstr(px_last_error(), "\"emb\""),
        "a tied head inside a unit, on another stage: \"%s\"", px_last_error());
  printf("  refused: %s\n", px_last_error());
  // The GPT over 2 stages: wte on the first, its tied head on the last.
  CHECK_OK(px_pp_plan_make(gpt, NULL, 2, NULL, &plan));
  CHECK(plan->tied_head_unit == 6 && plan->tied_emb_unit == 0 && strcmp(plan->tied_param, "wte.weight") == 0,
        "GPT tie: head unit %d, embedding unit %d, \"%s\"", plan->tied_head_unit, plan->tied_emb_unit,
        plan->tied_param);
  px_pp_plan_free(plan);
  // The GPT's units and one stage's names.
  CHECK_OK(px_pp_plan_make(gpt, NULL, 1, NULL, &plan));
  CHECK(plan->n_units == 7 && strcmp(plan->unit[3], "h.0") == 0, "GPT units: %d, the fourth \"%s\"", plan->n_units,
        plan->unit[3]);
  px_model *md;
  CHECK_OK(px_pp_stage_model(gpt, NULL, plan, 0, 3, &md));
  CHECK(px_model_find(md, "h.1.mlp.c_fc.weight") != NULL, "no h.1.mlp.c_fc.weight in the GPT's one stage");
  px_model_free(md);
  px_pp_plan_free(plan);
  for (int p = 1; p <= 3; p++) {
    int code = 0;
    CHECK_OK(px_comm_run(p, ranks, NULL, &code));
    CHECK(code == 0, "p %d: a rank's checks failed (%d)", p, code);
  }
  return px_test_finish("test_pp_exec_refuses_bad_input_without_hanging");
}
