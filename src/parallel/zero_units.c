// ZeRO stage 3: units of parameters that gather together (FSDP's
// fully_shard(module)).  A unit is a module subtree, so its parameters are
// one flat range (px_model_create lays modules out in pre-order); the
// parameters outside every unit form the root unit, gathered when a module
// of its own reads it and freed when its gradients are ready, or earlier,
// while the units compute (reads_root below says when).
//
// A unit's life in one training step (reshard_after_forward = true):
//
//   pre_forward(unit)    wait for its all-gather (prefetched) or run it;
//                        point p->data into the gathered buffer; start the
//                        next unit's all-gather (forward order)
//   post_forward(unit)   free the gathered buffer (p->data = NULL)
//   pre_backward(unit)   gather again; zeroed gradient storage, p->grad into
//                        it; start the next unit's all-gather (backward order)
//   all its grads ready  reduce-scatter the storage (its piece is added into
//                        the shard when it completes); free the parameters
//
// Activation checkpointing (nn.h px_checkpoint) re-runs forwards inside
// backward with ctx.recomputing set: pre_forward then only makes sure the
// unit is gathered, post_forward keeps it (pre_backward follows).
//
// reshard_after_forward = false keeps the parameters from forward to
// backward (no all-gather in backward).  A unit whose parameter another
// module uses (a tied head reads the embedding's weight: px_module.foreign)
// stays gathered from its forward until its gradients are ready, and the
// user gathers it (and materialises its gradients) around itself too.  The
// orders used for prefetching are those the first training step ran.
#include "parallel/zero_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "h.0.attn": the non-empty names from the root down. */
static void module_path(const px_module *m, char *buf, size_t len) {
  const px_module *chain[256];
  int n = 0;
  for (const px_module *a = m; a && a->parent && n < 256; a = a->parent) chain[n++] = a;
  size_t used = 0;
  buf[0] = '\0';
  for (int i = n - 1; i >= 0 && used + 1 < len; i--) {
    if (!chain[i]->name[0]) continue;
    used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? "." : "", chain[i]->name);
  }
}

static bool is_ancestor(const px_module *a, const px_module *m) {
  for (const px_module *x = m->parent; x; x = x->parent)
    if (x == a) return true;
  return false;
}

static px_status unknown_unit(const px_model *md, const char *name) {
  char list[512] = "";
  size_t used = 0;
  const px_module *root = md->root;
  for (int i = 0; i < root->n_children && used + 48 < sizeof list; i++) {
    char path[PX_NAME_MAX];
    module_path(root->children[i], path, sizeof path);
    used += (size_t)snprintf(list + used, sizeof list - used, "%s\"%s\" (%s)", i ? ", " : "", path,
                             root->children[i]->ops->type);
  }
  return px_error(PX_ERR_INVALID, "ZeRO: unit \"%s\" names no module of the model; its top-level modules are %s", name,
                  used ? list : "(none: the root has no children)");
}

px_status pxz_build_units(px_zero *z) {
  px_model *md = z->model;
  const int nm = md->n_modules;
  px_module **tops = calloc((size_t)nm + 1, sizeof *tops);
  z->module_unit = calloc((size_t)nm + 1, sizeof *z->module_unit);
  z->module_home = calloc((size_t)nm + 1, sizeof *z->module_home);
  if (!tops || !z->module_unit || !z->module_home) {
    free(tops);
    return px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
  }
  int n_tops = 0;
  // Parameters under each module (own and descendants'), for the checks.
  int *under = calloc((size_t)nm + 1, sizeof *under);
  if (!under) {
    free(tops);
    return px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
  }
  for (int i = 0; i < md->n_params; i++)
    for (const px_module *a = md->params[i]->owner; a; a = a->parent) under[a->uid]++;
  px_status st = PX_OK;
  if (z->opts.n_units == 0) {
    // Default: each child of the root that holds parameters.
    for (int i = 0; i < md->root->n_children; i++)
      if (under[md->root->children[i]->uid] > 0) tops[n_tops++] = md->root->children[i];
  } else {
    for (int u = 0; u < z->opts.n_units && st == PX_OK; u++) {
      const char *name = z->opts.units[u] ? z->opts.units[u] : "";
      px_module *found = NULL;
      // The first in pre-order: an outer module before the transparent
      // ("") modules inside it that share its path.
      for (int k = 0; k < nm && !found; k++) {
        char path[PX_NAME_MAX];
        module_path(md->modules[k], path, sizeof path);
        if (md->modules[k] != md->root && strcmp(path, name) == 0) found = md->modules[k];
      }
      if (!name[0])
        st = px_error(PX_ERR_INVALID,
                      "ZeRO: unit %d has an empty name; the root module is the root unit already "
                      "(parameters outside every unit are gathered for the whole step)",
                      u);
      else if (!found) st = unknown_unit(md, name);
      else if (under[found->uid] == 0)
        st = px_error(PX_ERR_INVALID,
                      "ZeRO: unit \"%s\" (%s) holds no parameters; a unit must own something to "
                      "shard",
                      name, found->ops->type);
      for (int k = 0; k < n_tops && st == PX_OK; k++) {
        char other[PX_NAME_MAX];
        module_path(tops[k], other, sizeof other);
        if (tops[k] == found) st = px_error(PX_ERR_INVALID, "ZeRO: unit \"%s\" is named twice", name);
        else if (is_ancestor(tops[k], found) || is_ancestor(found, tops[k]))
          st = px_error(PX_ERR_INVALID,
                        "ZeRO: units cannot nest: unit \"%s\" contains unit \"%s\"; name only one "
                        "of them",
                        is_ancestor(tops[k], found) ? other : name, is_ancestor(tops[k], found) ? name : other);
      }
      if (st == PX_OK) tops[n_tops++] = found;
    }
  }
  free(under);
  if (st != PX_OK) {
    free(tops);
    return st;
  }
  // Groups in layout (pre-order) order, the root unit last.
  for (int a = 1; a < n_tops; a++)
    for (int b = a; b > 0 && tops[b]->uid < tops[b - 1]->uid; b--) {
      px_module *t = tops[b];
      tops[b] = tops[b - 1];
      tops[b - 1] = t;
    }
  const int root = n_tops;
  z->groups = calloc((size_t)n_tops + 2, sizeof *z->groups);
  z->fwd_order = calloc((size_t)n_tops + 2, sizeof *z->fwd_order);
  z->bwd_order = calloc((size_t)n_tops + 2, sizeof *z->bwd_order);
  z->fwd_pos = calloc((size_t)n_tops + 2, sizeof *z->fwd_pos);
  z->bwd_pos = calloc((size_t)n_tops + 2, sizeof *z->bwd_pos);
  if (!z->groups || !z->fwd_order || !z->bwd_order || !z->fwd_pos || !z->bwd_pos) {
    free(tops);
    return px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
  }
  z->n_groups = n_tops + 1;
  for (int g = 0; g < n_tops; g++) z->groups[g].unit = tops[g];
  for (int g = 0; g < z->n_groups; g++) z->fwd_pos[g] = z->bwd_pos[g] = -1;
  // Pre-order: a module's home is its own unit if it is one, else its parent's.
  for (int k = 0; k < nm; k++) {
    px_module *m = md->modules[k];
    z->module_unit[k] = -1;
    for (int g = 0; g < n_tops; g++)
      if (tops[g] == m) z->module_unit[k] = g;
    z->module_home[k] = z->module_unit[k] >= 0 ? z->module_unit[k] : m->parent ? z->module_home[m->parent->uid] : root;
  }
  free(tops);
  for (int i = 0; i < md->n_params; i++) z->param_group[i] = z->module_home[md->params[i]->owner->uid];
  // A parameter used by a module of another unit pins its unit.
  for (int k = 0; k < nm; k++)
    for (int f = 0; f < md->modules[k]->n_foreign; f++) {
      int i = px_parallel_param_index(md, md->modules[k]->foreign[f]);
      if (i >= 0 && z->param_group[i] != z->module_home[k]) z->groups[z->param_group[i]].pinned = true;
    }
  bool root_has = false;
  for (int i = 0; i < md->n_params; i++) root_has = root_has || z->param_group[i] == root;
  z->root_group = root_has ? root : -1;
  z->n_units = n_tops + (root_has ? 1 : 0);
  return PX_OK;
}

/* ---- Gathering ----------------------------------------------------------------
 * recv: the packed unit, N·piece; rank r sends its shard piece. */
void pxz_start_gather(px_zero *z, int g) {
  zgroup *G = &z->groups[g];
  if (G->pbuf || G->count == 0 || z->error != PX_OK) return;
  // Every gathered buffer has the largest unit's size: the root unit and
  // the blocks take turns in the same buffers instead of the pool giving
  // back the smaller one and mapping anew each time.
  size_t most = 0;
  for (int k = 0; k < z->n_groups; k++)
    if (z->groups[k].piece > most) most = z->groups[k].piece;
  G->pbuf = pxz_pool_get(&z->ppool, most * (size_t)z->size);
  if (!G->pbuf) {
    pxz_fail(z, PX_ERR_NOMEM);
    return;
  }
  char label[96];
  snprintf(label, sizeof label, "ZeRO-3 step %llu, unit %d all-gather", (unsigned long long)z->model->ctx.step, g);
  px_comm_set_label(z->comm, label);
  pxz_delay(z);
  px_status st = px_comm_iallgather(z->comm, z->shard_params + G->shard_off, G->pbuf, G->piece, PX_F32, &G->ag_req);
  z->n_allgather++;
  if (st != PX_OK) {
    G->ag_req = NULL;
    pxz_fail(z, st);
  }
  pxz_set_views(z, g, G->pbuf, false);
}

void pxz_ensure_gathered(px_zero *z, int g) {
  zgroup *G = &z->groups[g];
  if (!G->pbuf) pxz_start_gather(z, g);
  if (G->ag_req) {
    px_status st = px_request_wait(G->ag_req);
    G->ag_req = NULL;
    if (st != PX_OK) pxz_fail(z, st);
  }
}

void pxz_release(px_zero *z, int g) {
  zgroup *G = &z->groups[g];
  if (!G->pbuf) return;
  if (G->ag_req) {
    px_status st = px_request_wait(G->ag_req);  // never free a buffer a collective still fills
    G->ag_req = NULL;
    if (st != PX_OK) pxz_fail(z, st);
  }
  pxz_pool_put(&z->ppool, G->pbuf);
  G->pbuf = NULL;
  pxz_set_views(z, g, NULL, false);
}

void pxz_release_all(px_zero *z) {
  for (int g = 0; g < z->n_groups; g++) pxz_release(z, g);
}

/* Start gathering the unit after u in `order` (if the order is known); after
 * the last unit, the root unit when the first step read it there (a GPT's
 * ln_f and tied head in forward, its embeddings in backward). */
static void prefetch_after(px_zero *z, int u, const int *order, const int *pos, int n, bool root_after) {
  if (!z->opts.prefetch || !z->order_known || pos[u] < 0) return;
  int v = pos[u] + 1 < n ? order[pos[u] + 1] : root_after ? z->root_group : -1;
  if (v >= 0 && !z->groups[v].pbuf) pxz_start_gather(z, v);
}

static void record(px_zero *z, int u, bool backward) {
  int *order = backward ? z->bwd_order : z->fwd_order, *pos = backward ? z->bwd_pos : z->fwd_pos;
  int *n = backward ? &z->n_bwd : &z->n_fwd;
  if (pos[u] >= 0) return;
  pos[u] = *n;
  order[(*n)++] = u;
  if (z->root_after[backward]) z->root_between[backward] = true;
  z->root_after[backward] = false;
}

/* The root unit (the parameters outside every unit: a GPT's wte, wpe and
 * ln_f, read again by the tied head) is gathered when a module of its own
 * that holds parameters, or a module reading one of them, runs.  When the
 * first training step read it only before the first unit and after the
 * last of a pass (a GPT with its blocks as units), a unit that starts
 * computing frees it (as FSDP2 reshards a module's parameters after its
 * forward), and it is gathered again, prefetched by the last unit, for
 * what reads it after: so it is not held beside the unit computing, the
 * one prefetched and the one whose gradients are being written, where a
 * step's memory peaks.  When the root unit is read between units (units
 * inside the blocks), it stays gathered, from the second step on, from its
 * first read until its gradients are ready: one gather a step, not one per
 * unit. */
static bool reads_root(const px_zero *z, const px_module *m) {
  if (z->root_group < 0) return false;
  if (z->module_home[m->uid] == z->root_group)
    for (int k = 0; k < m->n_params; k++)
      if (!m->params[k].is_buffer) return true;
  for (int f = 0; f < m->n_foreign; f++) {
    int i = px_parallel_param_index(z->model, m->foreign[f]);
    if (i >= 0 && z->param_group[i] == z->root_group) return true;
  }
  return false;
}

static void root_for(px_zero *z, const px_module *m, bool backward) {
  if (!reads_root(z, m)) return;
  if (z->recording && (backward ? z->n_bwd : z->n_fwd) > 0) z->root_after[backward] = true;
  pxz_ensure_gathered(z, z->root_group);
}

static void root_free_for_unit(px_zero *z, bool backward) {
  // The first step frees it too (it cannot know yet): a step's peak is
  // the same from the first on, at the cost of gathering the root unit
  // again after each unit in that step when the units sit between its
  // modules.
  if (z->root_group >= 0 && (!z->order_known || !z->root_between[backward]) && z->opts.reshard_after_forward &&
      !z->groups[z->root_group].pinned)
    pxz_release(z, z->root_group);
}

void pxz_units_pre_forward(px_zero *z, px_module *m) {
  if (m == z->model->root && z->model->ctx.training && !z->order_known) {
    // The first training step writes down the order units run in.
    z->recording = true;
    z->n_fwd = z->n_bwd = 0;
    z->root_after[0] = z->root_after[1] = z->root_between[0] = z->root_between[1] = false;
    for (int g = 0; g < z->n_groups; g++) z->fwd_pos[g] = z->bwd_pos[g] = -1;
  }
  int u = z->module_unit[m->uid];
  // A recompute (px_checkpoint) runs inside backward: a unit inside the
  // checkpointed one is gathered here and kept for its backward (no second
  // gather there); a unit around it was gathered by its pre_backward and is
  // used as it is; nothing is prefetched in forward order.
  const bool recompute = z->model->ctx.recomputing > 0;
  if (u >= 0) {
    if (!recompute) root_free_for_unit(z, false);
    if (z->recording && !recompute) record(z, u, false);
    pxz_ensure_gathered(z, u);
    if (!recompute) prefetch_after(z, u, z->fwd_order, z->fwd_pos, z->n_fwd, z->root_after[0]);
  }
  root_for(z, m, recompute);
  for (int f = 0; f < m->n_foreign; f++) {
    int i = px_parallel_param_index(z->model, m->foreign[f]);
    if (i >= 0) pxz_ensure_gathered(z, z->param_group[i]);
  }
}

void pxz_units_post_forward(px_zero *z, px_module *m) {
  const bool training = z->model->ctx.training;
  if (z->model->ctx.recomputing > 0) return;  // its backward comes next: keep it gathered
  int u = z->module_unit[m->uid];
  // Evaluation has no backward to keep anything for.
  if (u >= 0 && !z->groups[u].pinned && (z->opts.reshard_after_forward || !training)) pxz_release(z, u);
  if (m == z->model->root && !training) pxz_release_all(z);
}

void pxz_units_pre_backward(px_zero *z, px_module *m) {
  // The root unit's gradient storage exists from the start of backward: a
  // tied head writes the embedding's gradient first, the embedding last.
  if (m == z->model->root && z->root_group >= 0) pxz_materialise_grads(z, z->root_group);
  int u = z->module_unit[m->uid];
  if (u >= 0) {
    root_free_for_unit(z, true);
    if (z->recording) record(z, u, true);
    pxz_ensure_gathered(z, u);
    pxz_materialise_grads(z, u);
    prefetch_after(z, u, z->bwd_order, z->bwd_pos, z->n_bwd, z->root_after[1]);
  }
  root_for(z, m, true);
  for (int f = 0; f < m->n_foreign; f++) {
    int i = px_parallel_param_index(z->model, m->foreign[f]);
    if (i < 0) continue;
    pxz_ensure_gathered(z, z->param_group[i]);
    pxz_materialise_grads(z, z->param_group[i]);
  }
}

/* Every unit gathered in turn and unpacked into out (n_param_elems). */
px_status pxz_gather_into(px_zero *z, float *out) {
  px_status st = PX_OK;
  for (int g = 0; g < z->n_groups && st == PX_OK; g++) {
    const zgroup *G = &z->groups[g];
    if (G->count == 0) continue;
    float *buf = pxz_pool_get(&z->ppool, G->piece * (size_t)z->size);
    if (!buf) return PX_ERR_NOMEM;
    char label[64];
    snprintf(label, sizeof label, "ZeRO-3 gather parameters, unit %d", g);
    px_comm_set_label(z->comm, label);
    pxz_delay(z);
    st = px_comm_allgather(z->comm, z->shard_params + G->shard_off, buf, G->piece, PX_F32);
    z->n_allgather++;
    for (int k = 0; k < G->n_ranges && st == PX_OK; k++)
      memcpy(out + G->ranges[k].flat_off, buf + G->ranges[k].packed_off, G->ranges[k].count * sizeof(float));
    pxz_pool_put(&z->ppool, buf);
  }
  return st;
}
