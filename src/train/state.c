// Checkpoints of the training loop: what is saved so that a resumed run
// ends with the same bytes as one that never stopped, and how a resume
// puts it back on every rank.
//
//   model.safetensors   parameters and buffers, state_dict names
//   optim.safetensors   the optimizer's state slots as one tensor per
//                       parameter: "<slot>.<param>" ("exp_avg.fc.weight")
//   state.json          the position (step, epoch, next batch), the dropout
//                       counter (forward passes so far), the optimizer's
//                       step count, the seed, the layout it ran on (world
//                       size, batch size, accumulation), the caller's config
//
// Under ZeRO (stage >= 1) the optimizer state is sharded, and under stage 3
// the parameters too; no rank ever holds the whole of what is sharded, so
// each rank writes its own slice (px_checkpoint_write_all):
//
//   optim.rank<r>-of-<N>.safetensors   rank r's optimizer state as pieces
//                                      of named tensors ("exp_avg.h.0.ln_1.weight",
//                                      flat range, whole shape: io.h)
//   model.safetensors                  stages 1-2: whole on every rank, rank 0 writes it
//   model.rank<r>-of-<N>.safetensors   stage 3 instead: rank r's parameter
//                                      pieces (rank 0's file also holds the
//                                      buffers, whole)
//
// A ZeRO shard is a list of segments of the flat buffer (px_zero_segments);
// each is cut where parameters begin and end, so every piece is a range of
// ONE named parameter: the layout-independent form that loading into
// another layout (resharding) needs.
//
// The data order and every random transform are functions of (seed, epoch,
// sample index), dropout masks of (seed, forward count), the learning rate
// of the step: with these restored nothing else carries state.
#include "train/internal.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_FORMAT PX_TRAIN_STATE_FORMAT
#define STATE_VERSION PX_TRAIN_STATE_VERSION

static int stage_of(const px_trainer *t) { return t->zero ? t->o.zero.stage : 0; }

// "optim.rank00001-of-00004.safetensors"
static void rank_file(char *out, size_t cap, const char *what, int rank, int world) {
  snprintf(out, cap, "%s.rank%05d-of-%05d.safetensors", what, rank, world);
}

// This rank's shard of the flat buffer `base` (shard-indexed) as pieces of
// named parameters, keys "<prefix><name>" ("exp_avg." + "h.0.ln_1.weight").
// Segments are cut at parameter boundaries: params are in layout order,
// p->offset increasing, so one pass over both lists does.
static px_status shard_pieces(px_trainer *t, const char *prefix, float *base, px_tensor_piece **out, int *n_out) {
  *out = NULL;
  *n_out = 0;
  const px_model *md = t->model;
  const int n_seg = px_zero_segments(t->zero, NULL, NULL, NULL, 0);
  size_t *seg = malloc(3 * (size_t)(n_seg > 0 ? n_seg : 1) * sizeof *seg);
  if (!seg) return px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
  size_t *flat_off = seg, *shard_off = seg + n_seg, *count = seg + 2 * n_seg;
  px_zero_segments(t->zero, flat_off, shard_off, count, n_seg);
  // Each segment gives at most (params it touches) pieces; count them first.
  int cap = 0, i = 0;
  for (int k = 0; k < n_seg; k++) {
    while (i > 0 && md->params[i]->offset > flat_off[k]) i--;
    while (i < md->n_params && md->params[i]->offset + md->params[i]->numel <= flat_off[k]) i++;
    for (int j = i; j < md->n_params && md->params[j]->offset < flat_off[k] + count[k]; j++) cap++;
  }
  px_tensor_piece *pc = calloc(cap > 0 ? (size_t)cap : 1, sizeof *pc);
  if (!pc) {
    free(seg);
    return px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
  }
  int n = 0;
  i = 0;
  for (int k = 0; k < n_seg; k++) {
    const size_t lo = flat_off[k], hi = flat_off[k] + count[k];
    while (i > 0 && md->params[i]->offset > lo) i--;
    while (i < md->n_params && md->params[i]->offset + md->params[i]->numel <= lo) i++;
    for (int j = i; j < md->n_params && md->params[j]->offset < hi; j++) {
      const px_param *p = md->params[j];
      // [a, b) = [lo, hi) ∩ [p.offset, p.offset + numel), in flat elements
      const size_t a = lo > p->offset ? lo : p->offset;
      const size_t b = hi < p->offset + p->numel ? hi : p->offset + p->numel;
      if (b <= a) continue;
      px_tensor_piece *q = &pc[n++];
      if (snprintf(q->key, sizeof q->key, "%s%s", prefix, p->name) >= (int)sizeof q->key) {
        free(pc);
        free(seg);
        return px_error(PX_ERR_INVALID, "checkpoint: the name \"%s%s\" is too long", prefix, p->name);
      }
      q->ndim = p->ndim;
      memcpy(q->shape, p->shape, sizeof q->shape);
      q->offset = a - p->offset;
      q->count = b - a;
      q->data = base + shard_off[k] + (a - lo);
    }
  }
  free(seg);
  *out = pc;
  *n_out = n;
  return PX_OK;
}

// This rank's pieces under ZeRO: optimizer state (every slot), then (stage
// 3) the parameters; with_buffers adds the buffers, whole (rank 0, stage 3).
static px_status rank_pieces(px_trainer *t, bool params, bool with_buffers, px_tensor_piece **out, int *n_out) {
  *out = NULL;
  *n_out = 0;
  px_tensor_piece *all = NULL;
  int n = 0;
  px_status st = PX_OK;
  const int slots = params ? 1 : t->opt->n_state;
  for (int k = 0; k < slots && st == PX_OK; k++) {
    const char *slot_name = "";
    float *base = params ? t->shard_params : px_optim_state_slot(t->opt, k, &slot_name);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s%s", slot_name, params ? "" : ".");
    px_tensor_piece *pc;
    int m;
    if ((st = shard_pieces(t, prefix, base, &pc, &m)) != PX_OK) break;
    px_tensor_piece *grown = realloc(all, (size_t)(n + m + 1) * sizeof *all);
    if (!grown) {
      free(pc);
      st = px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
      break;
    }
    all = grown;
    memcpy(all + n, pc, (size_t)m * sizeof *pc);
    n += m;
    free(pc);
  }
  const px_model *md = t->model;
  if (st == PX_OK && with_buffers && md->n_buffers > 0) {
    px_tensor_piece *grown = realloc(all, (size_t)(n + md->n_buffers) * sizeof *all);
    if (!grown) st = px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
    else all = grown;
    for (int b = 0; st == PX_OK && b < md->n_buffers; b++) {
      const px_param *p = md->buffers[b];
      px_tensor_piece *q = &all[n++];
      memset(q, 0, sizeof *q);
      snprintf(q->key, sizeof q->key, "%s", p->name);
      q->ndim = p->ndim;
      memcpy(q->shape, p->shape, sizeof q->shape);
      q->offset = 0;
      q->count = p->numel;
      q->data = p->data;
    }
  }
  if (st != PX_OK) {
    free(all);
    return st;
  }
  *out = all;
  *n_out = n;
  return PX_OK;
}

static const char *layout_name(int stage, char *buf, size_t cap) {
  if (stage == 0) snprintf(buf, cap, "DDP (--zero 0)");
  else snprintf(buf, cap, "ZeRO stage %d (--zero %d)", stage, stage);
  return buf;
}

static const char *optim_name(px_optim_kind k) {
  return k == PX_OPTIM_SGD ? "sgd" : k == PX_OPTIM_ADAM ? "adam" : "adamw";
}

// The optimizer's state as named views: slot k of parameter p is
// state[k·n + p.offset, + p.numel).
static px_status optim_state_dict(px_trainer *t, px_state_dict *sd) {
  px_model *md = t->model;
  const int slots = t->opt->n_state;
  memset(sd, 0, sizeof *sd);
  if (slots == 0) return PX_OK;
  sd->items = calloc((size_t)slots * (size_t)md->n_params, sizeof *sd->items);
  if (!sd->items) return px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
  for (int k = 0; k < slots; k++) {
    const char *slot_name;
    float *slot = px_optim_state_slot(t->opt, k, &slot_name);
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i];
      px_named_tensor *it = &sd->items[sd->count++];
      int len = snprintf(it->name, sizeof it->name, "%s.%s", slot_name, p->name);
      if (len >= (int)sizeof it->name) {
        px_state_dict_free(sd);
        return px_error(PX_ERR_INVALID, "checkpoint: optimizer state name \"%s.%s\" is too long", slot_name, p->name);
      }
      it->tensor = px_tensor_view(slot + p->offset, PX_F32, p->ndim, p->shape);
    }
  }
  return PX_OK;
}

// The model's parameter count, whole: a tensor-parallel rank's boxes count
// as the global tensors they are cut from.
static size_t global_param_count(const px_trainer *t) {
  if (!t->o.mesh) return t->model->n_param_elems;
  size_t n = 0;
  for (int i = 0; i < t->model->n_params; i++) {
    const px_tp_box b = px_tp_param_box(t->model->params[i]);
    n += (size_t)(b.global_shape[0] * b.global_shape[1]);
  }
  return n;
}

static char *state_json(px_trainer *t) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddStringToObject(j, "format", STATE_FORMAT);
  cJSON_AddNumberToObject(j, "version", STATE_VERSION);
  cJSON_AddNumberToObject(j, "step", (double)t->step);
  cJSON_AddNumberToObject(j, "epoch", (double)t->epoch);
  cJSON_AddNumberToObject(j, "next_batch", (double)t->next_batch);
  cJSON_AddNumberToObject(j, "batches_per_epoch", (double)t->batches_per_epoch);
  cJSON_AddNumberToObject(j, "forward_count", (double)t->model->ctx.step);
  cJSON_AddNumberToObject(j, "optimizer_step", (double)t->opt->step);
  cJSON_AddStringToObject(j, "optimizer", optim_name(t->opt->opts.kind));
  // Seeds are 64-bit: a JSON number (a double) would round them.
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->o.seed);
  cJSON_AddStringToObject(j, "seed", seed);
  cJSON_AddNumberToObject(j, "world_size", t->world);
  cJSON_AddNumberToObject(j, "batch_size", (double)t->o.batch_size);
  cJSON_AddNumberToObject(j, "accum_steps", t->o.accum_steps);
  cJSON_AddNumberToObject(j, "param_count", (double)global_param_count(t));
  // The device mesh of a tensor-parallel run (a data-parallel run has none:
  // its world size says it all).
  cJSON *mesh = t->o.mesh ? cJSON_AddObjectToObject(j, "mesh") : NULL;
  if (mesh) {
    cJSON_AddNumberToObject(mesh, "dp", t->dp);
    cJSON_AddNumberToObject(mesh, "tp", t->o.mesh->tp);
    cJSON_AddNumberToObject(mesh, "pp", 1);
  }
  // The layout the shards were cut for (any layout loads them: the loads
  // intersect pieces), and what a resume on another rank count must
  // handle, said in the file for whoever reads it (docs/CHECKPOINTS.md).
  cJSON_AddNumberToObject(j, "zero_stage", stage_of(t));
  cJSON *dep = cJSON_AddObjectToObject(j, "rank_count_dependent");
  if (dep) {
    cJSON_AddStringToObject(dep, "next_batch", "counts steps of world_size x batch_size x accum_steps samples");
    cJSON_AddStringToObject(dep, "forward_count", "dropout masks are drawn per rank");
    cJSON_AddStringToObject(dep, "files",
                            "model.rank*, optim.rank*: pieces of named tensors; metadata.json lists "
                            "where each is, and any layout loads them");
  }
  if (t->val && t->last_eval_step == t->step) {
    cJSON *e = cJSON_AddObjectToObject(j, "eval");
    if (e) {
      cJSON_AddNumberToObject(e, "loss", t->last_eval.loss);
      if (isfinite(t->last_eval.accuracy)) cJSON_AddNumberToObject(e, "accuracy", t->last_eval.accuracy);
      if (isfinite(t->last_eval.perplexity)) cJSON_AddNumberToObject(e, "perplexity", t->last_eval.perplexity);
    }
  }
  if (t->o.config_json) {
    cJSON *cfg = cJSON_Parse(t->o.config_json);
    if (cfg) cJSON_AddItemToObject(j, "config", cfg);
    else cJSON_AddStringToObject(j, "config", t->o.config_json);
  }
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  return s;
}

// Under ZeRO every rank writes its pieces; rank 0 also the whole model
// (stages 1-2) and state.json.
static px_status save_sharded(px_trainer *t) {
  const int stage = stage_of(t);
  char optim_file[96], model_file[96], kind[16], step[32], stage_s[8], world_s[16], rank_s[16];
  rank_file(optim_file, sizeof optim_file, "optim", t->rank, t->world);
  rank_file(model_file, sizeof model_file, "model", t->rank, t->world);
  snprintf(kind, sizeof kind, "%s", optim_name(t->opt->opts.kind));
  snprintf(step, sizeof step, "%lld", (long long)t->opt->step);
  snprintf(stage_s, sizeof stage_s, "%d", stage);
  snprintf(world_s, sizeof world_s, "%d", t->world);
  snprintf(rank_s, sizeof rank_s, "%d", t->rank);
  px_tensor_piece *op = NULL, *mp = NULL;
  int n_op = 0, n_mp = 0;
  px_state_dict osd = {0}, psd = {0}, msd = {0};
  char *ojson = NULL, *pjson = NULL, *json = NULL;
  px_status st = rank_pieces(t, false, false, &op, &n_op);
  if (st == PX_OK) st = px_pieces_state_dict(op, n_op, &osd, &ojson);
  if (st == PX_OK && stage == 3) st = rank_pieces(t, true, t->rank == 0, &mp, &n_mp);
  if (st == PX_OK && stage == 3) st = px_pieces_state_dict(mp, n_mp, &psd, &pjson);
  if (st == PX_OK && stage < 3 && t->rank == 0) st = px_model_state_dict(t->model, &msd);
  if (st == PX_OK && t->rank == 0 && !(json = state_json(t)))
    st = px_error(PX_ERR_NOMEM, "checkpoint: out of memory for state.json");
  const px_kv optim_meta[8] =
    {{"format", PX_PIECES_FORMAT}, {"version", PX_PIECES_VERSION}, {"pieces", ojson},       {"optimizer", kind},
     {"optimizer_step", step},     {"zero_stage", stage_s},        {"world_size", world_s}, {"rank", rank_s}};
  const px_kv model_pieces_meta[6] = {{"format", PX_PIECES_FORMAT}, {"version", PX_PIECES_VERSION}, {"pieces", pjson},
                                      {"zero_stage", stage_s},      {"world_size", world_s},        {"rank", rank_s}};
  const px_kv model_meta[1] = {{"format", "pt"}};
  px_ckpt_item items[4];
  int n = 0;
  if (t->rank == 0 && stage < 3)
    items[n++] = (px_ckpt_item){.name = "model.safetensors", .tensors = &msd, .metadata = model_meta, .n_metadata = 1};
  if (stage == 3)
    items[n++] = (px_ckpt_item){.name = model_file, .tensors = &psd, .metadata = model_pieces_meta, .n_metadata = 6};
  items[n++] = (px_ckpt_item){.name = optim_file, .tensors = &osd, .metadata = optim_meta, .n_metadata = 8};
  if (t->rank == 0)
    items[n++] = (px_ckpt_item){.name = "state.json", .bytes = json, .n_bytes = json ? strlen(json) : 0};
  // A rank that failed above still takes part, with no items, so that the
  // others do not wait; the flag makes the write fail everywhere.
  int32_t bad = st != PX_OK;
  char why[1024] = "";
  if (bad) snprintf(why, sizeof why, "%s", px_last_error());
  px_status cst = px_comm_allreduce(t->comm, &bad, 1, PX_I32, PX_MAX);
  if (cst == PX_OK && bad)
    cst = st != PX_OK ? px_error(st, "%s", why)
                      : px_error(PX_ERR_INVALID, "checkpoint: another rank could not prepare its shard");
  if (cst == PX_OK)
    cst = px_checkpoint_write_all(t->comm, t->o.ckpt_dir, t->step, items, n, t->o.keep_last, t->last_checkpoint,
                                  sizeof t->last_checkpoint);
  free(json);
  free(ojson);
  free(pjson);
  px_state_dict_free(&osd);
  px_state_dict_free(&psd);
  px_state_dict_free(&msd);
  free(op);
  free(mp);
  return cst;
}

px_status px_trainer_save(px_trainer *t) {
  if (t->o.mesh) {  // tensor parallel: every tp rank its boxes (state_tp.c)
    char *json = state_json(t);
    if (!json) return px_error(PX_ERR_NOMEM, "checkpoint: out of memory for state.json");
    px_status st = px_trainer_save_tp(t, json);
    free(json);
    return st;
  }
  if (t->zero) return save_sharded(t);
  // On a GPU the state dicts view the host mirrors: refreshed first.
  px_status st = px_trainer_pull(t->model, t->opt);
  px_state_dict msd, osd;
  if (st == PX_OK) st = px_model_state_dict(t->model, &msd);
  if (st != PX_OK) return st;
  st = optim_state_dict(t, &osd);
  if (st != PX_OK) {
    px_state_dict_free(&msd);
    return st;
  }
  char *json = state_json(t);
  if (!json) st = px_error(PX_ERR_NOMEM, "checkpoint: out of memory for state.json");
  char kind[16], step[32];
  snprintf(kind, sizeof kind, "%s", optim_name(t->opt->opts.kind));
  snprintf(step, sizeof step, "%lld", (long long)t->opt->step);
  const px_kv optim_meta[2] = {{"optimizer", kind}, {"optimizer_step", step}};
  const px_kv model_meta[1] = {{"format", "pt"}};  // what Hugging Face's loaders look for
  px_ckpt_item items[3] = {
    {.name = "model.safetensors", .tensors = &msd, .metadata = model_meta, .n_metadata = 1},
    {.name = "optim.safetensors", .tensors = &osd, .metadata = optim_meta, .n_metadata = 2},
    {.name = "state.json", .bytes = json, .n_bytes = json ? strlen(json) : 0},
  };
  // Every rank takes part (rank 0 writes the replicated tensors once, the
  // others pass no items) so that the checkpoint gets its index,
  // metadata.json, like a sharded one.  A rank that failed above still
  // takes part, so that the others do not wait; the flag fails it everywhere.
  int32_t bad = st != PX_OK;
  char why[1024] = "";
  if (bad) snprintf(why, sizeof why, "%s", px_last_error());
  px_status cst = t->comm ? px_comm_allreduce(t->comm, &bad, 1, PX_I32, PX_MAX) : PX_OK;
  if (cst == PX_OK && bad)
    cst = st != PX_OK ? px_error(st, "%s", why)
                      : px_error(PX_ERR_INVALID, "checkpoint: another rank could not prepare its state");
  if (cst == PX_OK)
    cst = px_checkpoint_write_all(t->comm, t->o.ckpt_dir, t->step, items, t->rank == 0 ? 3 : 0, t->o.keep_last,
                                  t->last_checkpoint, sizeof t->last_checkpoint);
  st = cst;
  free(json);
  px_state_dict_free(&msd);
  px_state_dict_free(&osd);
  return st;
}

// ---- Resume -------------------------------------------------------------------

typedef struct resume_pos {
  int64_t step, epoch, next_batch, forward_count, optimizer_step, found;
} resume_pos;

// Every tensor of sd, whole, from the checkpoint's files "<prefix>*":
// model.safetensors or model.rank*, optim.safetensors or optim.rank*.
static px_status load_whole(const char *path, const char *prefix, const px_state_dict *sd) {
  px_tensor_piece *pc = calloc(sd->count > 0 ? (size_t)sd->count : 1, sizeof *pc);
  if (!pc) return px_error(PX_ERR_NOMEM, "resume: out of memory");
  for (int i = 0; i < sd->count; i++) {
    const px_tensor *x = &sd->items[i].tensor;
    snprintf(pc[i].key, sizeof pc[i].key, "%s", sd->items[i].name);
    pc[i].ndim = x->ndim;
    memcpy(pc[i].shape, x->shape, sizeof pc[i].shape);
    pc[i].offset = 0;
    pc[i].count = (size_t)px_tensor_numel(x);
    pc[i].data = x->data;
  }
  px_status st = px_checkpoint_load_boxes(path, prefix, pc, sd->count);
  free(pc);
  return st;
}

// On rank 0: the checkpoint's path and its state, into the model and optimizer.
static px_status load_on_root(px_trainer *t, resume_pos *pos, char *path, size_t cap, char *note, size_t note_cap) {
  const char *r = t->o.resume;
  note[0] = '\0';
  px_status st;
  if (strcmp(r, "auto") == 0) {
    st = px_checkpoint_latest(t->o.ckpt_dir, path, cap, note, note_cap);
    if (st == PX_ERR_NOT_FOUND) {
      px_clear_error();
      return PX_OK;  // nothing to resume from: a fresh start
    }
    if (st != PX_OK) return st;
  } else {
    // A checkpoint directory, or a directory of checkpoints.
    st = px_checkpoint_verify(r);
    if (st == PX_OK) {
      snprintf(path, cap, "%s", r);
    } else {
      char why[512];
      snprintf(why, sizeof why, "%s", px_last_error());
      st = px_checkpoint_latest(r, path, cap, note, note_cap);
      if (st != PX_OK)
        return px_error(st == PX_ERR_NOT_FOUND ? PX_ERR_NOT_FOUND : st,
                        "resume: %s is neither a good checkpoint (%s) nor a directory holding one", r, why);
    }
  }
  void *bytes;
  size_t n;
  st = px_checkpoint_read_file(path, "state.json", &bytes, &n);
  if (st != PX_OK) return st;
  px_train_state_file sf;
  st = px_train_state_parse(bytes, n, path, &sf);
  free(bytes);
  if (st != PX_OK) return st;
  pos->step = sf.step;
  pos->epoch = sf.epoch;
  pos->next_batch = sf.next_batch;
  pos->forward_count = sf.forward_count;
  pos->optimizer_step = sf.optimizer_step;
  int64_t params = sf.param_count, world = sf.world_size, batch = sf.batch_size, accum = sf.accum_steps;
  const int64_t ck_stage = sf.zero_stage, ck_dp = sf.mesh_dp, ck_tp = sf.mesh_tp;
  const int stage = t->o.zero.stage;
  if (!sf.has_optimizer || strcmp(sf.optimizer, optim_name(t->o.optim.kind)) != 0)
    st = px_error(PX_ERR_INVALID,
                  "checkpoint %s: saved with optimizer %s; this run uses %s (its state cannot carry over)", path,
                  sf.has_optimizer ? sf.optimizer : "?", optim_name(t->o.optim.kind));
  // Any saved layout loads into this one (DESIGN decision 8): every load
  // below intersects the saved pieces with the pieces this rank needs.
  const int tp = t->o.mesh ? t->o.mesh->tp : 1;
  if (st == PX_OK && (ck_stage != stage || world != t->world || ck_tp != tp)) {
    char a[48], b[48];
    size_t m = strlen(note);
    snprintf(note + m, note_cap - m,
             "%sresume: checkpoint saved by %s on %lld rank(s) (tp %lld); this run is %s on "
             "%d rank(s) (tp %d): its tensors are resharded (loaded by intersecting pieces)",
             m ? "\n" : "", layout_name((int)ck_stage, a, sizeof a), (long long)world, (long long)ck_tp,
             layout_name(stage, b, sizeof b), t->world, tp);
  }
  world = ck_dp;  // from here on: the ranks the data was sharded over
  if (st == PX_OK && (size_t)params != global_param_count(t))
    st = px_error(PX_ERR_INVALID,
                  "checkpoint %s: saved from a model of %lld parameters; this model has %zu (another "
                  "model or size?)",
                  path, (long long)params, global_param_count(t));
  if (st != PX_OK) return st;

  // Rank 0 holds the whole model before the wrap (which hands every rank
  // its part) and, under DDP, the whole optimizer state: whole pieces, from
  // whatever files the checkpoint's layout wrote.
  // (Tensor parallel: every rank loads its boxes after this, px_trainer_load_tp.)
  px_state_dict sd;
  if (!t->o.mesh) {
    st = px_model_state_dict(t->model, &sd);
    if (st != PX_OK) return st;
    st = load_whole(path, "model", &sd);
    px_state_dict_free(&sd);
    if (st != PX_OK) return st;
  }
  if (stage == 0 && !t->o.mesh) {
    st = optim_state_dict(t, &sd);
    if (st != PX_OK) return st;
    if (sd.count > 0) st = load_whole(path, "optim", &sd);
    px_state_dict_free(&sd);
    if (st != PX_OK) return st;
  }

  // Another layout.  What depends on the rank count: the data position
  // (batches are per rank: rank r takes positions r, r + N, ... of the
  // epoch's order, so a step of global batch G = N·B·A takes positions
  // [k·G, (k+1)·G) whatever N is), and the step counter when the run's
  // length is in epochs (steps per epoch = samples / G).  The epoch, the
  // optimizer's update count, the seed and the dropout counter carry over
  // as they are (dropout masks are drawn per rank, so a resharded run's
  // masks differ from the unstopped run's).
  if (world != t->dp || (size_t)batch != t->o.batch_size || accum != t->o.accum_steps) {
    const size_t g_old = (size_t)batch * (size_t)world * (size_t)accum;
    const size_t g_new = t->o.batch_size * (size_t)t->dp * (size_t)t->o.accum_steps;
    // Samples of this epoch already trained on, from the position saved.
    const size_t seen = (size_t)pos->next_batch * (size_t)batch * (size_t)world;
    pos->next_batch = (int64_t)(seen / g_new * (size_t)t->o.accum_steps);
    if ((size_t)pos->next_batch > t->batches_per_epoch) pos->next_batch = (int64_t)t->batches_per_epoch;
    size_t m = strlen(note);
    if (g_old == g_new) {
      snprintf(note + m, note_cap - m,
               "%sresume: the checkpoint ran on %lld rank(s) × batch %lld × accumulation %lld, this run on %d × %zu "
               "× %d: the same global batch (%zu), so the same samples in each step and the same step count; batch "
               "%lld of epoch %lld is next",
               m ? "\n" : "", (long long)world, (long long)batch, (long long)accum, t->dp, t->o.batch_size,
               t->o.accum_steps, g_new, (long long)pos->next_batch, (long long)pos->epoch + 1);
    } else {
      // The steps so far, counted in this run's steps, so that the end of
      // an epoch-long run and the schedule fall where the samples put them.
      const int64_t old_step = pos->step;
      if (t->o.max_steps == 0)
        pos->step = pos->epoch * t->steps_per_epoch +
          (int64_t)(((size_t)pos->next_batch + (size_t)t->o.accum_steps - 1) / (size_t)t->o.accum_steps);
      snprintf(note + m, note_cap - m,
               "%sresume: the checkpoint ran on %lld rank(s) × batch %lld × accumulation %lld (global batch %zu), "
               "this run on %d × %zu × %d (global batch %zu): training goes on from the same sample count (%zu "
               "samples into epoch %lld), not on the same trajectory; %s",
               m ? "\n" : "", (long long)world, (long long)batch, (long long)accum, g_old, t->dp, t->o.batch_size,
               t->o.accum_steps, g_new, (size_t)pos->next_batch * t->o.batch_size * (size_t)t->dp,
               (long long)pos->epoch + 1,
               t->o.max_steps == 0 ? "the step counter is counted in this run's steps"
                                   : "the step counter stays "
                                     "(the run's length is --steps)");
      if (t->o.max_steps == 0 && pos->step != old_step) {
        m = strlen(note);
        snprintf(note + m, note_cap - m, ": step %lld is step %lld here", (long long)old_step, (long long)pos->step);
      }
    }
  }
  pos->found = 1;
  return PX_OK;
}

// Rank 0's status and message, on every rank.
typedef struct shared_status {
  int32_t status;
  char msg[1020];
} shared_status;

px_status px_trainer_resume(px_trainer *t, bool *resumed) {
  *resumed = false;
  if (!t->o.resume) return PX_OK;
  resume_pos pos = {0};
  char path[512] = "", note[2048] = "";
  shared_status ss = {0};
  if (t->rank == 0) {
    px_status st = load_on_root(t, &pos, path, sizeof path, note, sizeof note);
    ss.status = (int32_t)st;
    if (st != PX_OK) snprintf(ss.msg, sizeof ss.msg, "%s", px_last_error());
  }
  px_status cst = px_comm_broadcast(t->comm, &ss, sizeof ss, PX_U8, 0);
  if (cst != PX_OK) return cst;
  if (ss.status != PX_OK) return px_error((px_status)ss.status, "%s", ss.msg);
  if (note[0]) px_log_text(t->log, "%s", note);
  cst = px_comm_broadcast(t->comm, &pos, sizeof pos / sizeof(int64_t), PX_I64, 0);
  if (cst != PX_OK) return cst;
  if (!pos.found) {
    px_log_text(t->log, "resume: no checkpoint in %s yet: starting at step 0", t->o.ckpt_dir);
    return PX_OK;
  }
  px_model *md = t->model;
  px_comm_set_label(t->comm, "resume: broadcast of the checkpoint");
  // Under ZeRO the wrap that follows broadcasts rank 0's parameters and
  // buffers, and each rank reads its own optimizer state.  On a GPU the
  // checkpoint was loaded into the host mirrors: broadcast on the host,
  // then pushed to the device.
  if (t->o.zero.stage == 0 && !t->o.mesh) {
    if ((cst = px_comm_broadcast(t->comm, px_host_params(md), md->n_param_elems, PX_F32, 0)) != PX_OK) return cst;
    if (md->n_buffer_elems &&
        (cst = px_comm_broadcast(t->comm, px_host_buffers(md), md->n_buffer_elems, PX_F32, 0)) != PX_OK)
      return cst;
    if (md->device == PX_CUDA) {
      for (int k = 0; k < t->opt->n_state; k++)
        if ((cst = px_comm_broadcast(t->comm, px_optim_state_slot(t->opt, k, NULL), t->opt->n, PX_F32, 0)) != PX_OK)
          return cst;
    } else if (t->opt->n_state &&
               (cst = px_comm_broadcast(t->comm, t->opt->state, (size_t)t->opt->n_state * t->opt->n, PX_F32, 0)) !=
                 PX_OK) {
      return cst;
    }
    if ((cst = px_trainer_push(md, t->opt)) != PX_OK) return cst;
  }
  if ((cst = px_comm_broadcast(t->comm, path, sizeof path, PX_U8, 0)) != PX_OK) return cst;
  // Tensor parallel: every rank its own boxes, from any saved layout.
  if (t->o.mesh && (cst = px_trainer_load_tp(t, path)) != PX_OK) return cst;
  t->step = pos.step;
  t->epoch = (uint64_t)pos.epoch;
  t->next_batch = (size_t)pos.next_batch;
  if (t->next_batch >= t->batches_per_epoch) {
    t->epoch++;
    t->next_batch = 0;
  }
  md->ctx.step = (uint64_t)pos.forward_count;
  if (t->opt) t->opt->step = pos.optimizer_step;
  t->resume_optimizer_step = pos.optimizer_step;
  snprintf(t->last_checkpoint, sizeof t->last_checkpoint, "%s", path);
  t->resumed = true;
  *resumed = true;
  return px_log_text(t->log, "resumed from %s: step %lld, epoch %lld, batch %zu", path, (long long)t->step,
                     (long long)t->epoch + 1, t->next_batch);
}

px_status px_trainer_resume_shards(px_trainer *t) {
  if (!t->zero || !t->resumed) return PX_OK;
  if (t->o.mesh) return px_trainer_resume_tp_shards(t);  // shards of tp boxes (state_tp.c)
  const int stage = stage_of(t);
  px_tensor_piece *pc = NULL;
  int n = 0;
  // This rank's pieces now, from whatever pieces the checkpoint holds (any
  // world size, any stage): the saved ranges that overlap them are copied.
  px_status st = rank_pieces(t, false, false, &pc, &n);
  if (st == PX_OK) st = px_checkpoint_load_boxes(t->last_checkpoint, "optim", pc, n);
  free(pc);
  pc = NULL;
  if (st == PX_OK && stage == 3) {
    // The buffers came whole with the wrap's broadcast from rank 0.
    st = rank_pieces(t, true, false, &pc, &n);
    if (st == PX_OK) st = px_checkpoint_load_boxes(t->last_checkpoint, "model", pc, n);
    free(pc);
  }
  st = px_trainer_agree_loaded(t, st, "", "shard", t->last_checkpoint);
  if (st != PX_OK) return st;
  t->opt->step = t->resume_optimizer_step;
  return PX_OK;
}

// Every rank learns whether all loaded: none trains on alone.  A rank that
// failed returns its own error ("<what>rank r: ..."), the others say which
// checkpoint another rank could not load its <noun> of.
px_status px_trainer_agree_loaded(px_trainer *t, px_status st, const char *what, const char *noun, const char *path) {
  int32_t bad = st != PX_OK;
  char why[1024] = "";
  if (bad) snprintf(why, sizeof why, "rank %d: %s", t->rank, px_last_error());
  px_status cst = px_comm_allreduce(t->comm, &bad, 1, PX_I32, PX_MAX);
  if (cst != PX_OK) return cst;
  if (st != PX_OK) return px_error(st, "%s%s", what, why);
  if (bad) return px_error(PX_ERR_INVALID, "resume: another rank could not load its %s of %s", noun, path);
  return PX_OK;
}

px_status px_train_load_weights(px_model *model, const char *path, char *resolved, size_t cap) {
  char ck[512], note[1024];
  px_status st = px_checkpoint_verify(path);
  if (st == PX_OK) {
    snprintf(ck, sizeof ck, "%s", path);
  } else {
    char why[512];
    snprintf(why, sizeof why, "%s", px_last_error());
    st = px_checkpoint_latest(path, ck, sizeof ck, note, sizeof note);
    if (st != PX_OK) return px_error(st, "%s is neither a good checkpoint (%s) nor a directory holding one", path, why);
  }
  px_state_dict sd;
  st = px_model_state_dict(model, &sd);
  if (st != PX_OK) return st;
  st = px_checkpoint_load_tensors(ck, "model.safetensors", &sd, true);
  if (st == PX_ERR_NOT_FOUND) {
    // ZeRO stage 3: no rank held the whole model; put it together from the
    // ranks' pieces.
    char why[1024];
    snprintf(why, sizeof why, "%s", px_last_error());
    st = px_checkpoint_assemble(ck, "model.rank", &sd, true);
    if (st == PX_ERR_NOT_FOUND) st = px_error(st, "%s; nor does it hold model.rank*.safetensors", why);
  }
  px_state_dict_free(&sd);
  // A model on a GPU: the state dict's views were its host mirrors.
  if (st == PX_OK) st = px_trainer_push(model, NULL);
  if (st == PX_OK && resolved) snprintf(resolved, cap, "%s", ck);
  return st;
}
