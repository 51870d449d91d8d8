// Pipeline stages: a chain model cut between its units, each stage's model
// holding only its units, with the whole model's names and initial values.
//
// How the values stay those of one process: px_model_init draws module m's
// weights from (seed, m->stream), and px_model_create numbers streams in
// pre-order over the tree it is given.  We build the WHOLE tree (module
// structs and parameter declarations, no parameter memory), number it the
// same way, detach the stage's units, free the rest, create the stage's
// model (which renumbers), then put back every module's whole-model stream
// and initialise again.
#include "plexus/pipeline.h"
#include "parallel/tp_internal.h"

#include <stdlib.h>
#include <string.h>

// Pre-order numbering as model.c's collect(): transparent modules share the
// next module's stream.
static void number_streams(px_module *m, uint32_t *next) {
  m->stream = *next;
  if (!m->rng_transparent) (*next)++;
  for (int i = 0; i < m->n_children; i++) number_streams(m->children[i], next);
}

static bool is_chain(const px_module *m) { return m->ops && m->ops->type && strcmp(m->ops->type, "Chain") == 0; }

// A chain whose children are named "0", "1", …: a list of blocks to cut between.
static bool is_index_chain(const px_module *m) {
  if (!is_chain(m) || m->n_children == 0 || !m->name[0]) return false;
  for (int i = 0; i < m->n_children; i++) {
    const char *n = m->children[i]->name;
    if (!n[0]) return false;
    for (; *n; n++)
      if (*n < '0' || *n > '9') return false;
  }
  return true;
}

typedef struct units {
  int n, cap;
  px_module **mod;
  char (*path)[PX_NAME_MAX];
} units;

static px_status units_push(units *u, px_module *m, const char *path) {
  if (u->n == u->cap) {
    int cap = u->cap ? 2 * u->cap : 32;
    px_module **mod = realloc(u->mod, (size_t)cap * sizeof *mod);
    if (!mod) return px_error(PX_ERR_NOMEM, "pipeline: out of memory");
    u->mod = mod;
    char(*path_a)[PX_NAME_MAX] = realloc(u->path, (size_t)cap * sizeof *path_a);
    if (!path_a) return px_error(PX_ERR_NOMEM, "pipeline: out of memory");
    u->path = path_a;
    u->cap = cap;
  }
  u->mod[u->n] = m;
  snprintf(u->path[u->n], PX_NAME_MAX, "%s", path);
  u->n++;
  return PX_OK;
}

static void units_free(units *u) {
  free(u->mod);
  free(u->path);
}

// The root's children, index chains replaced by their children.
static px_status list_units(px_module *root, units *u) {
  if (!is_chain(root))
    return px_error(PX_ERR_INVALID, "pipeline: the model's root is a %s, not a chain of units to cut between",
                    root->ops && root->ops->type ? root->ops->type : "module");
  for (int i = 0; i < root->n_children; i++) {
    px_module *c = root->children[i];
    if (!c->name[0])
      return px_error(PX_ERR_INVALID,
                      "pipeline: child %d of the root chain has no name, so its parameters "
                      "could not keep their names on a stage",
                      i);
    px_status st;
    if (is_index_chain(c)) {
      for (int k = 0; k < c->n_children; k++) {
        char path[PX_NAME_MAX];
        snprintf(path, sizeof path, "%s.%s", c->name, c->children[k]->name);
        if ((st = units_push(u, c->children[k], path)) != PX_OK) return st;
      }
    } else if ((st = units_push(u, c, c->name)) != PX_OK) {
      return st;
    }
  }
  return PX_OK;
}

static size_t count_params(const px_module *m) {
  size_t n = 0;
  for (int k = 0; k < m->n_params; k++)
    if (!m->params[k].is_buffer) n += m->params[k].numel;
  for (int i = 0; i < m->n_children; i++) n += count_params(m->children[i]);
  return n;
}

// Index of the unit that contains module m (-1: none, e.g. the root).
static int unit_of(const units *u, const px_module *m) {
  for (; m; m = m->parent)
    for (int i = 0; i < u->n; i++)
      if (u->mod[i] == m) return i;
  return -1;
}

static int stage_of_unit(const px_pp_plan *plan, int unit) {
  for (int s = 0; s < plan->n_stages; s++)
    if (unit < plan->first[s + 1]) return s;
  return plan->n_stages - 1;
}

int px_pp_plan_stage_of(const px_pp_plan *plan, int unit) { return stage_of_unit(plan, unit); }

static bool has_type(const px_module *m, const char *type) {
  return m && m->ops && m->ops->type && strcmp(m->ops->type, type) == 0;
}

/* ---- Tied weights across stages ---------------------------------------------
 * The head's stage holds a copy of the embedding's weight in a "holder"
 * module (a parameter and nothing else: the stage container skips it in
 * forward and backward), named as the embedding, and the head is replaced
 * by pp_head: the same product as px_tied_head, reading the holder's
 * weight (its foreign parameter). */
static px_status holder_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  (void)ctx;
  (void)x;
  (void)y;
  return px_error(PX_ERR_INVALID, "pipeline: \"%s\" holds a tied weight and does not run", m->params[0].name);
}
static const px_module_ops holder_ops = {.type = "TiedWeight", .forward = holder_forward};

/* The tensor-parallel form (px_tp_vocab_tied_head away from its embedding,
 * g set): the holder is a px_tp_vocab_embedding of the same group, sizes,
 * name and stream (so it takes its box of the single process's table, as
 * the embedding does) that never runs; the head reads its rows E_r:
 *   logits_r = x · E_rᵀ (R, rows)     dE_r += dyᵀ · x
 *   dx = Σ_r dy_r · E_r               one all-reduce over tp backward
 * exactly px_tp_vocab_tied_head's product without sequence parallelism.
 * Without tensor parallelism (g NULL) rows is the vocabulary and there is
 * no all-reduce: px_tied_head's product. */
typedef struct pp_head {
  px_module base;
  px_tp_group *g; /* NULL: not tensor parallel */
  int rows, dim;  /* E's (or E_r's) shape */
  px_tensor x;
} pp_head;

static px_status pp_head_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  pp_head *h = (pp_head *)m;
  const px_param *E = m->foreign[0];
  if (x->dtype != PX_F32 || x->ndim < 1 || x->shape[x->ndim - 1] != h->dim) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "%s(%d -> %d, copy of \"%s\"): input %s must end in %d features", m->ops->type,
                    h->dim, h->rows, E->name, px_shape_str(x->ndim, x->shape, s, sizeof s), h->dim);
  }
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = h->rows;
  px_status st = px_ctx_tensor(ctx, y, x->ndim, shape);
  if (st != PX_OK) return st;
  const int R = (int)(px_tensor_numel(x) / h->dim);
  px_sgemm(false, true, R, h->rows, h->dim, 1.0f, px_f32(x), h->dim, E->data, h->dim, 0.0f, px_f32(y), h->rows);
  h->x = *x;
  return PX_OK;
}

static px_status pp_head_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  pp_head *h = (pp_head *)m;
  const px_param *E = m->foreign[0];
  const int R = (int)(px_tensor_numel(&h->x) / h->dim), C = h->dim, n = h->rows;
  px_sgemm(true, false, n, C, R, 1.0f, px_f32(dy), n, px_f32(&h->x), C, 1.0f, E->grad, C);
  if (!dx) return PX_OK;
  px_status st = px_ctx_tensor_like(ctx, dx, &h->x);
  if (st != PX_OK) return st;
  px_sgemm(false, false, R, C, n, 1.0f, px_f32(dy), n, E->data, C, 0.0f, px_f32(dx), C);
  return h->g ? px_tp_allreduce(h->g, px_f32(dx), (size_t)R * (size_t)C, PX_SUM, true) : PX_OK;
}
static const px_module_ops pp_head_ops = {.type = "TiedHead", .forward = pp_head_forward, .backward = pp_head_backward};
static const px_module_ops pp_tp_head_ops = {.type = "VocabParallelTiedHead",
                                             .forward = pp_head_forward,
                                             .backward = pp_head_backward};

// The stage root: a chain that skips its weight holder (NULL: none).
typedef struct stage_root {
  px_module base;
  px_module *holder;
} stage_root;

// The stage's container: a chain that skips weight holders.
static px_status stage_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_tensor cur = *x;
  for (int i = 0; i < m->n_children; i++) {
    if (m->children[i] == ((stage_root *)m)->holder) continue;
    px_tensor next;
    px_status st = px_module_forward(m->children[i], ctx, &cur, &next);
    if (st != PX_OK) return st;
    cur = next;
  }
  *y = cur;
  return PX_OK;
}

static px_status stage_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  int first = 0;
  const px_module *holder = ((stage_root *)m)->holder;
  while (first < m->n_children && m->children[first] == holder) first++;
  px_tensor cur = *dy;
  for (int i = m->n_children - 1; i >= first; i--) {
    if (m->children[i] == holder) continue;
    px_tensor next;
    px_tensor *want = (i > first || dx) ? &next : NULL;
    px_status st = px_module_backward(m->children[i], ctx, &cur, want);
    if (st != PX_OK) return st;
    if (want) cur = next;
  }
  if (dx) *dx = cur;
  return PX_OK;
}
static const px_module_ops stage_ops = {.type = "PipelineStage", .forward = stage_forward, .backward = stage_backward};

// A module of one stage that reads a parameter owned on another stage (a
// tied head away from its embedding) cannot run: refuse the plan.
static px_status check_foreign(px_pp_plan *plan, const units *u, const px_module *m, int unit) {
  for (int k = 0; k < m->n_foreign; k++) {
    const int owner = unit_of(u, m->foreign[k]->owner);
    if (owner >= 0 && stage_of_unit(plan, owner) != stage_of_unit(plan, unit) && m == u->mod[unit] &&
        (has_type(m, "TiedHead") || has_type(m, "VocabParallelTiedHead")) && m->foreign[k]->owner == u->mod[owner] &&
        (has_type(u->mod[owner], "Embedding") || has_type(u->mod[owner], "VocabParallelEmbedding")) &&
        plan->tied_head_unit < 0) {
      plan->tied_head_unit = unit;
      plan->tied_emb_unit = owner;
      char full[2 * PX_NAME_MAX + 2];
      snprintf(full, sizeof full, "%s.%s", u->path[owner], m->foreign[k]->name);
      if (strlen(full) >= sizeof plan->tied_param)
        return px_error(PX_ERR_INVALID, "pipeline: tied parameter name \"%s\" too long", full);
      memcpy(plan->tied_param, full, strlen(full) + 1);
      continue;
    }
    if (owner >= 0 && stage_of_unit(plan, owner) != stage_of_unit(plan, unit))
      return px_error(PX_ERR_INVALID,
                      "pipeline: unit \"%s\" (stage %d) uses parameter \"%s\" of unit \"%s\" "
                      "(stage %d): only a tied head that is a unit, tied to an embedding that is a unit, can be "
                      "on another stage than its weight; put both on one stage (PX_PP_SPLIT_AT)",
                      u->path[unit], stage_of_unit(plan, unit), m->foreign[k]->name, u->path[owner],
                      stage_of_unit(plan, owner));
  }
  for (int i = 0; i < m->n_children; i++) {
    px_status st = check_foreign(plan, u, m->children[i], unit);
    if (st != PX_OK) return st;
  }
  return PX_OK;
}

// Contiguous split minimising the largest stage's parameter count (each
// stage at least one unit): dynamic programming over (stages, units).
static px_status split_params(px_pp_plan *plan) {
  const int n = plan->n_units, S = plan->n_stages;
  size_t *pre = calloc((size_t)n + 1, sizeof *pre);
  size_t *best = malloc((size_t)(S + 1) * (size_t)(n + 1) * sizeof *best);
  int *cut = malloc((size_t)(S + 1) * (size_t)(n + 1) * sizeof *cut);
  if (!pre || !best || !cut) {
    free(pre);
    free(best);
    free(cut);
    return px_error(PX_ERR_NOMEM, "pipeline: out of memory");
  }
  for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + plan->unit_params[i];
#define AT(a, s, i) a[(size_t)(s) * (size_t)(n + 1) + (size_t)(i)]
  for (int s = 0; s <= S; s++)
    for (int i = 0; i <= n; i++) AT(best, s, i) = SIZE_MAX;
  AT(best, 0, 0) = 0;
  for (int s = 1; s <= S; s++)
    for (int i = s; i <= n; i++)
      for (int j = s - 1; j < i; j++) {  // stage s-1 holds units [j, i)
        if (AT(best, s - 1, j) == SIZE_MAX) continue;
        size_t load = pre[i] - pre[j], worst = load > AT(best, s - 1, j) ? load : AT(best, s - 1, j);
        if (worst < AT(best, s, i)) {
          AT(best, s, i) = worst;
          AT(cut, s, i) = j;
        }
      }
  int i = n;
  for (int s = S; s >= 1; s--) {
    plan->first[s] = i;
    i = AT(cut, s, i);
  }
  plan->first[0] = 0;
#undef AT
  free(pre);
  free(best);
  free(cut);
  return PX_OK;
}

static px_status split_at(px_pp_plan *plan, const units *u, const px_pp_split *split) {
  const int S = plan->n_stages;
  if (split->n_at != S - 1 || (S > 1 && !split->at))
    return px_error(PX_ERR_INVALID, "pipeline: %d stages need %d split points, %d given", S, S - 1, split->n_at);
  plan->first[0] = 0;
  plan->first[S] = u->n;
  for (int s = 1; s < S; s++) {
    const char *name = split->at[s - 1];
    int found = -1;
    for (int i = 0; i < u->n; i++)
      if (name && strcmp(u->path[i], name) == 0) found = i;
    if (found < 0) {
      char list[512] = "";
      size_t len = 0;
      for (int i = 0; i < u->n && len + 2 < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? " " : "", u->path[i]);
      return px_error(PX_ERR_INVALID, "pipeline: split point \"%s\" is not a unit of the model (units: %s)",
                      name ? name : "(null)", list);
    }
    if (found <= plan->first[s - 1])
      return px_error(PX_ERR_INVALID,
                      "pipeline: split point \"%s\" (unit %d) must come after the start of stage %d "
                      "(unit %d): split points in model order, each stage at least one unit",
                      name, found, s - 1, plan->first[s - 1]);
    plan->first[s] = found;
  }
  return PX_OK;
}

void px_pp_plan_free(px_pp_plan *plan) {
  if (!plan) return;
  free(plan->unit);
  free(plan->unit_params);
  free(plan->first);
  free(plan);
}

px_status px_pp_plan_make(px_pp_build_fn build, void *arg, int n_stages, const px_pp_split *split, px_pp_plan **out) {
  *out = NULL;
  if (!build) return px_error(PX_ERR_INVALID, "pipeline: no model builder");
  if (n_stages < 1) return px_error(PX_ERR_INVALID, "pipeline: %d stages (at least 1)", n_stages);
  px_module *root = build(arg);
  if (!root) return px_error(PX_ERR_INVALID, "pipeline: the model builder failed: %s", px_last_error());
  uint32_t next = 0;
  number_streams(root, &next);
  units u = {0};
  px_pp_plan *plan = calloc(1, sizeof *plan);
  px_status st = plan ? list_units(root, &u) : px_error(PX_ERR_NOMEM, "pipeline: out of memory");
  if (st == PX_OK && u.n < n_stages)
    st = px_error(PX_ERR_INVALID, "pipeline: %d stages but the model has only %d units to cut between", n_stages, u.n);
  if (st == PX_OK) {
    plan->tied_head_unit = plan->tied_emb_unit = -1;
    plan->n_units = u.n;
    plan->n_stages = n_stages;
    plan->unit = calloc((size_t)u.n, sizeof *plan->unit);
    plan->unit_params = calloc((size_t)u.n, sizeof *plan->unit_params);
    plan->first = calloc((size_t)n_stages + 1, sizeof *plan->first);
    if (!plan->unit || !plan->unit_params || !plan->first) st = px_error(PX_ERR_NOMEM, "pipeline: out of memory");
  }
  if (st == PX_OK) {
    for (int i = 0; i < u.n; i++) {
      memcpy(plan->unit[i], u.path[i], PX_NAME_MAX);
      plan->unit_params[i] = count_params(u.mod[i]);
    }
    const px_pp_split_kind kind = split ? split->kind : PX_PP_SPLIT_UNITS;
    if (kind == PX_PP_SPLIT_PARAMS) {
      st = split_params(plan);
    } else if (kind == PX_PP_SPLIT_AT) {
      st = split_at(plan, &u, split);
    } else {
      int at = 0;
      for (int s = 0; s < n_stages; s++) {
        plan->first[s] = at;
        at += u.n / n_stages + (s < u.n % n_stages ? 1 : 0);
      }
      plan->first[n_stages] = u.n;
    }
  }
  for (int i = 0; st == PX_OK && i < u.n; i++) st = check_foreign(plan, &u, u.mod[i], i);
  units_free(&u);
  px_module_free(root);
  if (st != PX_OK) {
    px_pp_plan_free(plan);
    return st;
  }
  *out = plan;
  return PX_OK;
}

void px_pp_plan_print(const px_pp_plan *plan, FILE *out) {
  if (!out) out = stdout;
  for (int s = 0; s < plan->n_stages; s++) {
    size_t n = 0;
    for (int i = plan->first[s]; i < plan->first[s + 1]; i++) n += plan->unit_params[i];
    fprintf(out, "stage %d: %zu parameters, units", s, n);
    for (int i = plan->first[s]; i < plan->first[s + 1]; i++) fprintf(out, " %s", plan->unit[i]);
    fprintf(out, "\n");
  }
}

static void save_streams(const px_module *m, uint32_t *out, int *n) {
  out[(*n)++] = m->stream;
  for (int i = 0; i < m->n_children; i++) save_streams(m->children[i], out, n);
}

static int count_modules(const px_module *m) {
  int n = 1;
  for (int i = 0; i < m->n_children; i++) n += count_modules(m->children[i]);
  return n;
}

px_status px_pp_stage_model(px_pp_build_fn build, void *arg, const px_pp_plan *plan, int stage, uint64_t seed,
                            px_model **out) {
  *out = NULL;
  if (!plan || stage < 0 || stage >= plan->n_stages)
    return px_error(PX_ERR_INVALID, "pipeline: stage %d of %d", stage, plan ? plan->n_stages : 0);
  px_module *root = build(arg);
  if (!root) return px_error(PX_ERR_INVALID, "pipeline: the model builder failed: %s", px_last_error());
  uint32_t next = 0;
  number_streams(root, &next);
  units u = {0};
  px_status st = list_units(root, &u);
  if (st == PX_OK && u.n != plan->n_units)
    st = px_error(PX_ERR_INVALID,
                  "pipeline: the builder gave %d units, the plan has %d: it must build the same "
                  "model every time",
                  u.n, plan->n_units);
  for (int i = 0; st == PX_OK && i < u.n; i++)
    if (strcmp(u.path[i], plan->unit[i]) != 0)
      st = px_error(PX_ERR_INVALID, "pipeline: unit %d is \"%s\", the plan's is \"%s\"", i, u.path[i], plan->unit[i]);
  px_module *sroot = st == PX_OK ? px_module_alloc(sizeof(stage_root), &stage_ops) : NULL;
  if (st == PX_OK && !sroot) st = PX_ERR_NOMEM;
  if (sroot) sroot->rng_transparent = true;
  // The head away from its embedding: a holder of the weight's copy (named
  // and initialised as the embedding's weight), read by a pp_head.
  const bool tied = plan->tied_head_unit >= plan->first[stage] && plan->tied_head_unit < plan->first[stage + 1] &&
    stage_of_unit(plan, plan->tied_emb_unit) != stage;
  px_module *holder = NULL;
  px_tp_group *tpg = NULL;  // the embedding's tp group when it is vocabulary-parallel
  if (st == PX_OK && tied) {
    const px_module *emb = u.mod[plan->tied_emb_unit];
    const px_param *w = &emb->params[0];
    if (has_type(emb, "VocabParallelEmbedding")) {
      const px_tp_box b = px_tp_param_box(w);
      tpg = ((const tp_module *)emb)->g;
      holder = px_tp_vocab_embedding(tpg, (int)b.global_shape[0], (int)b.global_shape[1]);
      if (!holder)
        st = px_error(PX_ERR_INVALID, "pipeline: the tied head's copy of \"%s\": %s", w->name, px_last_error());
      else {
        holder->params[0].init = w->init;
        holder->params[0].init_a = w->init_a;
      }
    } else {
      holder = px_module_alloc(sizeof(px_module), &holder_ops);
      if (!holder || !px_module_add_param(holder, w->name, w->ndim, w->shape, w->init, w->init_a, false))
        st = PX_ERR_NOMEM;
    }
    if (holder) holder->stream = emb->stream;
  }
  for (int i = plan->first[stage]; st == PX_OK && i < plan->first[stage + 1]; i++) {
    px_module *m = u.mod[i], *parent = m->parent;
    if (tied && i == plan->tied_head_unit) {  // replaced: the original stays in the tree and is freed with it
      pp_head *h = (pp_head *)px_module_alloc(sizeof *h, tpg ? &pp_tp_head_ops : &pp_head_ops);
      if (!h) {
        st = PX_ERR_NOMEM;
        break;
      }
      h->g = tpg;
      h->rows = (int)holder->params[0].shape[0];
      h->dim = (int)holder->params[0].shape[1];
      px_module *hm = &h->base;
      hm->stream = m->stream;
      st = px_module_add_foreign_param(hm, &holder->params[0]);
      if (st == PX_OK) st = px_module_add_child(sroot, u.path[i], hm);
      if (st != PX_OK) px_module_free(hm);
      continue;
    }
    for (int k = 0; k < parent->n_children; k++)
      if (parent->children[k] == m) parent->children[k] = NULL;  // px_module_free skips NULL children
    m->parent = NULL;
    st = px_module_add_child(sroot, u.path[i], m);
    if (st != PX_OK) px_module_free(m);
  }
  if (holder && st == PX_OK) {
    st = px_module_add_child(sroot, u.path[plan->tied_emb_unit], holder);
    if (st == PX_OK) ((stage_root *)sroot)->holder = holder;
    holder = st == PX_OK ? NULL : holder;
  }
  px_module_free(holder);
  units_free(&u);
  px_module_free(root);
  if (st != PX_OK) {
    px_module_free(sroot);
    return st;
  }
  const int n_mod = count_modules(sroot);
  uint32_t *streams = malloc((size_t)n_mod * sizeof *streams);
  if (!streams) {
    px_module_free(sroot);
    return px_error(PX_ERR_NOMEM, "pipeline: out of memory");
  }
  int n = 0;
  save_streams(sroot, streams, &n);
  px_model *md;
  st = px_model_create(&md, sroot, seed);
  if (st != PX_OK) {
    free(streams);
    return st;
  }
  // px_model_create numbered the stage alone; md->modules is the same
  // pre-order as save_streams walked.
  for (int i = 0; i < md->n_modules && i < n; i++) md->modules[i]->stream = streams[i];
  free(streams);
  px_model_init(md, seed);
  *out = md;
  return PX_OK;
}
